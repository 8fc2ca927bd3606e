"""The five served tools: names, descriptions, and their JSON Schema 2020-12 input and output schemas.

``subagent.spawn``'s input schema is exactly the design document's; the others are as small as the
arguments they take. Output schemas describe ``structuredContent`` so a peer parses one shape.
"""

from __future__ import annotations

from typing import Any, Final

from agentd.mcp import schemas

#: Most tool names one ``tool_scope`` may list (checked before its items, so a huge list costs nothing).
MAX_TOOL_SCOPE: Final = 256

_HANDLE: Final = {"type": "string", "description": "a served handle, e.g. served.2"}

RUN_STATE_OUTPUT: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "handle": {"type": "string"},
        "status": {"type": "string"},
        "done": {"type": "boolean"},
        "partial": {"type": "boolean"},
        "result": {},
        "age_ms": {"type": "integer"},
        # A warm session: turns answered so far (``result`` is the latest one's while it awaits a turn).
        "turns": {"type": "integer"},
        # A refused spawn (status "refused", handle ""): which cap, and whether and when to retry.
        "refused": {"type": "string"},
        "retryable": {"type": "boolean"},
        "retry_after_s": {"type": ["number", "null"]},
    },
    "required": ["handle", "status", "done"],
}

TOOLS: Final[list[dict[str, Any]]] = [
    {
        "name": "status",
        "description": "Read this agent's run id, mode, version, pid, uptime and spawn counts.",
        "inputSchema": {"type": "object", "properties": {}},
        "outputSchema": {
            "type": "object",
            "properties": {
                "run_id": {"type": "string"},
                "mode": {"type": "string"},
                "version": {"type": "string"},
                "pid": {"type": "integer"},
                "uptime_ms": {"type": "integer"},
                "spawns": {"type": "object", "additionalProperties": {"type": "integer"}},
                "refusals": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
            "required": ["run_id", "mode", "version", "pid", "uptime_ms", "spawns"],
        },
    },
    {
        "name": "subagent.spawn",
        "description": (
            "Delegate a task to a fresh subagent of this agent and return its distilled result. "
            "async returns a handle at once (read or subscribe agent://subagent/{handle}); "
            "warm keeps the subagent alive as a session driven by subagent.send."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "instruction": {"type": "string"},
                "output_contract": {"type": "string"},
                "tool_scope": {"type": "array", "items": {"type": "string"}},
                "async": {"type": "boolean", "default": False},
                "warm": {"type": "boolean", "default": False},
                "model": {"type": "string"},
            },
            "required": ["instruction"],
        },
        "outputSchema": RUN_STATE_OUTPUT,
    },
    {
        "name": "subagent.send",
        "description": "Send another message into a warm subagent session; acknowledges at once.",
        "inputSchema": {
            "type": "object",
            "properties": {"handle": _HANDLE, "message": {"type": "string"}},
            "required": ["handle", "message"],
        },
        "outputSchema": {
            "type": "object",
            "properties": {"handle": {"type": "string"}, "accepted": {"type": "boolean"}},
            "required": ["handle", "accepted"],
        },
    },
    {
        "name": "subagent.status",
        "description": "Read a served handle's status, and its result once terminal.",
        "inputSchema": {"type": "object", "properties": {"handle": _HANDLE}, "required": ["handle"]},
        "outputSchema": RUN_STATE_OUTPUT,
    },
    {
        "name": "subagent.cancel",
        "description": "Request a graceful cancel of a served run and its subtree; acknowledges at once.",
        "inputSchema": {"type": "object", "properties": {"handle": _HANDLE}, "required": ["handle"]},
        "outputSchema": RUN_STATE_OUTPUT,
    },
]

TOOL_NAMES: Final = tuple(tool["name"] for tool in TOOLS)
def _checked(tool: dict[str, Any]) -> dict[str, Any]:
    """The schema arguments are checked against: the published one plus agentd's own size limits (the
    ``tool_scope`` cap comes before its items, so an oversized list is refused without looking at them)."""
    schema = tool["inputSchema"]
    scope = schema.get("properties", {}).get("tool_scope")
    if scope is None:
        return dict(schema)
    properties = {**schema["properties"], "tool_scope": {"maxItems": MAX_TOOL_SCOPE, **scope}}
    return {**schema, "properties": properties}


VALIDATORS: Final = {tool["name"]: schemas.compile_schema(_checked(tool)).validator for tool in TOOLS}


def schema_errors(name: str, arguments: Any) -> list[str]:
    """Human-readable schema violations of ``arguments`` for tool ``name`` (empty when valid).

    Only the first few are listed (:data:`agentd.mcp.schemas.MAX_ERRORS`): a huge invalid value costs one
    error, not one per element.
    """
    try:
        errors = schemas.first_errors(VALIDATORS[name], arguments)
    except schemas.CheckTooCostly as exc:
        return [f"(arguments): too costly to check: {exc}"]
    return [f"{'/'.join(str(p) for p in error.absolute_path) or '(arguments)'}: {error.message[:200]}"
            for error in errors]
