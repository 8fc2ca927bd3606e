"""The span names and attribute keys agentd's traces use, in one place (metrics: agentd/telemetry/schema.py).

They follow the OpenTelemetry GenAI and MCP semantic conventions (``invoke_agent``, ``chat``,
``execute_tool``, ``{mcp.method.name} {target}``). The ``opentelemetry-semantic-conventions`` package marks
its ``gen_ai.*``/``mcp.*`` constants deprecated while the conventions settle, so agentd spells them here
instead of importing them: one module to change when the conventions move, and no import at all when
tracing is off.
"""

from __future__ import annotations

from typing import Final

# --- operations (gen_ai.operation.name) and span names ---------------------------------------------------
OP_INVOKE_AGENT: Final = "invoke_agent"
OP_CHAT: Final = "chat"
OP_EXECUTE_TOOL: Final = "execute_tool"

# --- GenAI attributes ------------------------------------------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
#: Only with ``--log-content``: the tool call's arguments and the run's instruction.
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"

#: The provider name for an OpenAI-compatible Chat Completions gateway.
PROVIDER_OPENAI: Final = "openai"

# --- MCP attributes --------------------------------------------------------------------------------------
MCP_METHOD_NAME: Final = "mcp.method.name"
MCP_RESOURCE_URI: Final = "mcp.resource.uri"
MCP_PROTOCOL_VERSION: Final = "mcp.protocol.version"
MCP_SESSION_ID: Final = "mcp.session.id"
JSONRPC_REQUEST_ID: Final = "jsonrpc.request.id"
#: ``error.type`` for a tools/call answered with ``isError: true``.
ERROR_TYPE: Final = "error.type"
TOOL_ERROR: Final = "tool_error"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"

# --- agentd's own attributes -----------------------------------------------------------------------------
AGENTD_RUN_ID: Final = "agentd.run.id"
AGENTD_AGENT_PATH: Final = "agentd.agent.path"
AGENTD_RUN_STATUS: Final = "agentd.run.status"
AGENTD_STEPS: Final = "agentd.run.steps"
AGENTD_SERVER: Final = "agentd.mcp.server"
#: A chat span's (one reply) or an agent span's (the run's own replies) cost in US dollars, when priced.
AGENTD_COST_USD: Final = "agentd.cost_usd"

# --- W3C trace context -----------------------------------------------------------------------------------
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"


def mcp_span_name(method: str, target: str | None) -> str:
    """``{mcp.method.name} {target}`` (the tool name or resource URI), or the method alone."""
    return f"{method} {target}" if target else method
