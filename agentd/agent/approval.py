"""Approval before a marked tool call: which calls need a person, and what a person is shown of one.

A server's config names the tools that need a person before each call (``approve: [tool]``, or ``--approve
SERVER__TOOL``; ``*`` marks every tool of the server). The loop holds such a call before sending it and waits on
agentd.oversight.approvals' queue; this module decides *whether* (:func:`needed`) and *what the person sees*
(:func:`summary`): each argument by name, a short value whole, a long one cut with its length, and a secret
never: a value the run's redactor knows (a resolved ``{{secret:...}}``), or one that looks like a credential by
its name (``password``, ``api_key``, ``token``…) or its shape (``sk-…``, a JWT), is shown as ``***``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from agentd.agent.ports import ToolPool
from agentd.security.secrets import looks_like_inline_credential
from agentd.telemetry.events import Redactor

#: A value shown whole up to this many characters; longer ones are cut to it, with their length.
SHORT_VALUE: Final = 80
#: At most this many arguments are listed; the rest are counted.
MAX_ARGUMENTS: Final = 32
#: The denial a run gives itself when no person can be asked (no approvals queue in this process).
NOBODY: Final = ("this tool needs a person's approval and none can be asked here (run agentd with --state-dir or "
                 "--ctl-socket and approve with agentd ctl approve)")
#: What every tool of a server is marked by.
EVERY_TOOL: Final = "*"


def needed(pool: ToolPool, server: str, tool: str) -> bool:
    """Whether ``server``'s ``tool`` is marked ``approve`` in the server's config."""
    conn = pool.connections.get(server)
    marked: tuple[str, ...] = getattr(getattr(conn, "config", None), "approve", ()) or ()
    return bool(marked) and (tool in marked or EVERY_TOOL in marked)


def summary(arguments: Mapping[str, Any], redactor: Redactor | None) -> dict[str, Any]:
    """The arguments as a person is shown them (see the module docstring)."""
    out: dict[str, Any] = {}
    for index, (name, value) in enumerate(arguments.items()):
        if index >= MAX_ARGUMENTS:
            out["…"] = f"{len(arguments) - MAX_ARGUMENTS} more arguments"
            break
        key = str(name)[:SHORT_VALUE]
        out[key] = _shown(key, value, redactor)
    return out


def _shown(name: str, value: Any, redactor: Redactor | None) -> Any:
    if isinstance(value, bool | int | float) or value is None:
        return value
    written = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = redactor.scrub(written) if redactor is not None else written
    if isinstance(value, str) and looks_like_inline_credential(text, name=name):
        return "***"
    if len(text) <= SHORT_VALUE:
        return value if text == written else text
    return f"{text[:SHORT_VALUE]}… ({len(text)} chars)"


__all__ = ["EVERY_TOOL", "MAX_ARGUMENTS", "NOBODY", "SHORT_VALUE", "needed", "summary"]
