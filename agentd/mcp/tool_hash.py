"""The audit hash of one tool: what an operator pins to notice a server changing a tool under them.

A server's tool text (description, schemas, annotations, title) is untrusted and steers the model; a server
that changes it after it was reviewed (a "rug pull") must be visible in the log and, when pinned, refused.
The hash is sha256 over a canonical JSON (sorted keys, no whitespace) of exactly those five fields, so the
same tool hashes the same in ``agentd check``, in ``mcp.catalogue`` events and in a host's ``pin:``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final

#: What a pinned hash must look like: 64 lowercase hex digits.
HASH_PATTERN: Final = re.compile(r"[0-9a-f]{64}")


def canonical(fields: Mapping[str, Any]) -> str:
    """Canonical JSON: sorted keys, no whitespace, non-ASCII kept (``ensure_ascii=False``, UTF-8 hashed)."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def tool_hash(
    description: str | None,
    input_schema: Mapping[str, Any] | None,
    output_schema: Mapping[str, Any] | None,
    annotations: Mapping[str, Any] | None,
    title: str | None,
) -> str:
    """sha256 hex of the canonical JSON of ``{description, inputSchema, outputSchema, annotations, title}``."""
    text = canonical({
        "description": description,
        "inputSchema": input_schema,
        "outputSchema": output_schema,
        "annotations": annotations,
        "title": title,
    })
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
