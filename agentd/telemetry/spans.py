"""The spans agentd opens, one helper each, so call sites stay one line and names live in one place.

Every helper goes through the :mod:`agentd.telemetry` facade: with tracing off each is one global read
and the shared no-op span. Content (the instruction, tool arguments) is put on a span only with
``--log-content``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from agentd import telemetry
from agentd.telemetry import Span, names

AGENT_NAME = "agentd"


def agent_span(agent_path: str, run_id: str, model: str, instruction: str) -> AbstractContextManager[Span]:
    """``invoke_agent agentd``: one run of the loop (a root run, a subagent's turn, a wake)."""
    if not telemetry.enabled():
        return telemetry.NOOP
    attributes: dict[str, Any] = {
        names.GEN_AI_OPERATION_NAME: names.OP_INVOKE_AGENT,
        names.GEN_AI_PROVIDER_NAME: names.PROVIDER_OPENAI,
        names.GEN_AI_AGENT_NAME: AGENT_NAME,
        names.GEN_AI_AGENT_ID: agent_path,
        names.GEN_AI_CONVERSATION_ID: run_id,
        names.GEN_AI_REQUEST_MODEL: model,
        names.AGENTD_RUN_ID: run_id,
        names.AGENTD_AGENT_PATH: agent_path,
    }
    if telemetry.content_allowed():
        attributes[names.GEN_AI_INPUT_MESSAGES] = instruction
    return telemetry.span(f"{names.OP_INVOKE_AGENT} {AGENT_NAME}", attributes=attributes)


def end_agent_span(span: Span, status: str, steps: int, input_tokens: int, output_tokens: int,
                   cost: int | None = None) -> None:
    if not span.is_recording():
        return
    if cost is not None:
        span.set_attribute(names.AGENTD_COST_USD, cost / 10**12)
    span.set_attribute(names.AGENTD_RUN_STATUS, status)
    span.set_attribute(names.AGENTD_STEPS, steps)
    span.set_attribute(names.GEN_AI_USAGE_INPUT_TOKENS, input_tokens)
    span.set_attribute(names.GEN_AI_USAGE_OUTPUT_TOKENS, output_tokens)
    if status != "completed":
        telemetry.mark_error(span, status)


def chat_span(model: str, provider: str = names.PROVIDER_OPENAI) -> AbstractContextManager[Span]:
    """``chat {model}``: one model call (its attempts, retries and failovers inside)."""
    if not telemetry.enabled():
        return telemetry.NOOP
    return telemetry.span(f"{names.OP_CHAT} {model}", kind="client", attributes={
        names.GEN_AI_OPERATION_NAME: names.OP_CHAT,
        names.GEN_AI_PROVIDER_NAME: provider,
        names.GEN_AI_REQUEST_MODEL: model,
    })


def end_chat_span(span: Span, input_tokens: int, output_tokens: int, finish_reason: str | None,
                  response_model: str | None = None, cost: int | None = None) -> None:
    if not span.is_recording():
        return
    if cost is not None:
        span.set_attribute(names.AGENTD_COST_USD, cost / 10**12)
    span.set_attribute(names.GEN_AI_USAGE_INPUT_TOKENS, input_tokens)
    span.set_attribute(names.GEN_AI_USAGE_OUTPUT_TOKENS, output_tokens)
    if finish_reason:
        span.set_attribute(names.GEN_AI_RESPONSE_FINISH_REASONS, [finish_reason])
    if response_model:
        span.set_attribute(names.GEN_AI_RESPONSE_MODEL, response_model)


def tool_span(tool: str, call_id: str, *, server: str | None, arguments: str) -> AbstractContextManager[Span]:
    """``execute_tool {tool}``: one tool call the model asked for (an MCP tool or a control tool)."""
    if not telemetry.enabled():
        return telemetry.NOOP
    attributes: dict[str, Any] = {
        names.GEN_AI_OPERATION_NAME: names.OP_EXECUTE_TOOL,
        names.GEN_AI_TOOL_NAME: tool,
        names.GEN_AI_TOOL_CALL_ID: call_id,
        names.GEN_AI_TOOL_TYPE: "extension" if server is not None else "function",
    }
    if server is not None:
        attributes[names.AGENTD_SERVER] = server
    if telemetry.content_allowed():
        attributes[names.GEN_AI_TOOL_CALL_ARGUMENTS] = arguments
    return telemetry.span(f"{names.OP_EXECUTE_TOOL} {tool}", attributes=attributes)


def mcp_target(method: str, params: dict[str, Any] | None) -> str | None:
    if not params:
        return None
    if method in ("tools/call", "prompts/get"):
        name = params.get("name")
        return name if isinstance(name, str) else None
    if method.startswith("resources/"):
        uri = params.get("uri")
        return uri if isinstance(uri, str) else None
    return None


def mcp_client_span(server: str, method: str, params: dict[str, Any] | None,
                    protocol_version: str | None) -> AbstractContextManager[Span]:
    """``{mcp.method.name} {target}``, client side: one MCP request to one server."""
    if not telemetry.enabled():
        return telemetry.NOOP
    target = mcp_target(method, params)
    attributes: dict[str, Any] = {names.MCP_METHOD_NAME: method, names.AGENTD_SERVER: server}
    if target is not None:
        attributes[names.GEN_AI_TOOL_NAME if method == "tools/call" else names.MCP_RESOURCE_URI] = target
    if method == "tools/call":
        attributes[names.GEN_AI_OPERATION_NAME] = names.OP_EXECUTE_TOOL
    if protocol_version:
        attributes[names.MCP_PROTOCOL_VERSION] = protocol_version
    return telemetry.span(names.mcp_span_name(method, target), kind="client", attributes=attributes)


def mcp_server_span(method: str, params: dict[str, Any] | None,
                    protocol_version: str | None) -> AbstractContextManager[Span]:
    """``{mcp.method.name} {target}``, server side: one request the self-MCP server handles."""
    if not telemetry.enabled():
        return telemetry.NOOP
    target = mcp_target(method, params)
    attributes: dict[str, Any] = {names.MCP_METHOD_NAME: method}
    if target is not None:
        attributes[names.GEN_AI_TOOL_NAME if method == "tools/call" else names.MCP_RESOURCE_URI] = target
    if protocol_version:
        attributes[names.MCP_PROTOCOL_VERSION] = protocol_version
    return telemetry.span(names.mcp_span_name(method, target), kind="server", attributes=attributes)


def with_trace_meta(params: dict[str, Any] | None) -> dict[str, Any] | None:
    """``params`` with the current trace context in ``params._meta`` (a copy; unchanged when off)."""
    if not telemetry.enabled():
        return params
    carrier: dict[str, str] = {}
    telemetry.inject(carrier)
    if not carrier:
        return params
    out = dict(params or {})
    meta = dict(out.get("_meta") or {})
    meta.update(carrier)
    out["_meta"] = meta
    return out
