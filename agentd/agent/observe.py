"""Observations: how tool results, rejections and faults are written back into the conversation.

Three kinds, each labelled so the model can tell them apart (spec §1.4):

* a tool result, ``isError`` or not: the tool ran; its content is the observation;
* a rejection: agentd did not send the call (unknown tool, arguments not JSON or not valid against the
  tool's ``inputSchema``), so the model can correct itself;
* a denial: a person (or the lack of one) refused a call marked ``approve``; it was not sent, and the reason
  is given;
* a fault: the server or transport failed the request (a JSON-RPC error, a broken connection); it is
  not the tool's output, and the text says so.

Observations are capped (:data:`MAX_OBSERVATION_CHARS`) so one huge body cannot exhaust the token budget.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

MAX_OBSERVATION_CHARS = 32_000


def render_content(content: Sequence[Mapping[str, Any]], structured: Mapping[str, Any] | None = None) -> str:
    """MCP content blocks as text for a chat model: text verbatim, binary as a labelled size."""
    parts: list[str] = []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind in ("image", "audio"):
            data = block.get("data", "")
            parts.append(
                f"[{kind}: {block.get('mimeType', 'unknown type')}, {len(str(data)) * 3 // 4} bytes]"
            )
        elif kind == "resource_link":
            parts.append(
                f"[resource link: {block.get('uri')} {block.get('name', '')}]".rstrip("]").rstrip() + "]"
            )
        elif kind == "resource":
            parts.append(render_resource_item(block.get("resource") or {}))
        else:
            parts.append(json.dumps(block, ensure_ascii=False, default=str))
    if structured is not None and not any(p.strip() for p in parts):
        parts.append(json.dumps(structured, ensure_ascii=False, default=str))
    return "\n".join(parts)


def render_resource_item(item: Mapping[str, Any]) -> str:
    """One ``resources/read`` contents item: its text, or a labelled size for a blob."""
    uri = item.get("uri", "")
    if "text" in item:
        return f"[resource {uri}]\n{item['text']}"
    blob = str(item.get("blob", ""))
    return f"[resource {uri}: {item.get('mimeType', 'binary')}, {len(blob) * 3 // 4} bytes, not shown]"


def tool_result(text: str, *, is_error: bool) -> str:
    body = cap(text)
    return f"[tool error: the tool ran and reported a failure]\n{body}" if is_error else body


def rejection(reason: str) -> str:
    return f"[agentd rejected this call; it was not sent] {reason}"


def denied(server: str, tool: str, reason: str) -> str:
    return (f"[agentd: a person denied this call to {tool!r} on server {server!r}; it was not sent] "
            f"Reason: {reason}")


def fault(server: str, tool: str, reason: str) -> str:
    return (
        f"[agentd tool fault: the request to server {server!r} for tool {tool!r} failed; this is not the "
        f"tool's output] {reason}"
    )


def correctable(server: str, tool: str, reason: str) -> str:
    return (
        f"[agentd: server {server!r} refused this call to {tool!r} as a protocol error (no such tool, or invalid "
        f"arguments); it did not run. Correct the tool name or the arguments] {reason}"
    )


def unknown_outcome(tool: str) -> str:
    return (
        f"[agentd restarted while this call to {tool!r} was in flight: it may or may not have run, and its "
        "result was lost. It was not sent again because the tool does not declare itself idempotent; check "
        "its effect before calling it again]"
    )


def elided(size: int) -> str:
    return (
        f"[agentd elided this older observation ({size} characters) to keep the conversation within bounds; "
        "call the tool again if you still need it]"
    )


def cap(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n…[observation truncated: {len(text)} characters, first {limit} shown]"
