"""The span names, attribute keys, metric names and bucket boundaries agentd's telemetry uses, in one place.

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

# --- W3C trace context -----------------------------------------------------------------------------------
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"


def mcp_span_name(method: str, target: str | None) -> str:
    """``{mcp.method.name} {target}`` (the tool name or resource URI), or the method alone."""
    return f"{method} {target}" if target else method

# --- metric names (OTLP) ---------------------------------------------------------------------------------
# The conventions' own where they exist; agentd's elsewhere. Prometheus names are in agentd.telemetry.metrics.
METRIC_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
METRIC_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
METRIC_MCP_DURATION: Final = "mcp.client.operation.duration"
METRIC_PROCESS_MEMORY: Final = "process.memory.usage"
METRIC_RUNS: Final = "agentd.runs"
METRIC_STEPS: Final = "agentd.steps"
#: What the tree's model calls cost, in US dollars (priced runs only: ``--price``).
METRIC_COST: Final = "agentd.cost"
#: A chat span's (one reply) or an agent span's (the run's own replies) cost in US dollars, when priced.
AGENTD_COST_USD: Final = "agentd.cost_usd"
METRIC_TOOL_CALLS: Final = "agentd.tool.calls"
METRIC_FAILOVERS: Final = "agentd.gateway.failovers"
METRIC_BREAKER: Final = "agentd.gateway.breaker.state"
METRIC_SUBAGENTS_LIVE: Final = "agentd.subagents.live"
METRIC_SPAWN_REFUSALS: Final = "agentd.spawn.refusals"
METRIC_WAKES: Final = "agentd.wakes"
METRIC_COALESCED: Final = "agentd.coalesced_updates"
METRIC_SERVED_SESSIONS: Final = "agentd.served.sessions"
METRIC_SERVED_REQUESTS: Final = "agentd.served.requests"
METRIC_JOURNAL_LAG: Final = "agentd.journal.commit.lag"
METRIC_JOURNAL_QUEUE: Final = "agentd.journal.queue"
METRIC_CLUSTER_MEMBER_FREE: Final = "agentd.cluster.member.free_slots"
METRIC_CLUSTER_MEMBERS: Final = "agentd.cluster.members"
METRIC_CLUSTER_FREE: Final = "agentd.cluster.free_slots"
METRIC_CLUSTER_QUEUED: Final = "agentd.cluster.queue.depth"
METRIC_CLUSTER_OLDEST: Final = "agentd.cluster.queue.oldest_age"
#: ``mcp.client.operation.duration`` bucket boundaries from the MCP semantic conventions (seconds).
MCP_DURATION_BUCKETS: Final = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: ``gen_ai.client.operation.duration`` bucket boundaries from the GenAI semantic conventions (seconds).
GATEWAY_DURATION_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                                   40.96, 81.92)
#: ``gen_ai.client.token.usage`` bucket boundaries from the GenAI conventions (1 … 4**13, powers of 4).
TOKEN_BUCKETS: Final = tuple(float(4 ** n) for n in range(14))
#: Journal commit lag buckets (seconds), agentd's own: a local SQLite commit is ~ms, a shared store's tens of ms.
JOURNAL_LAG_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Metric attributes (beyond the span attributes above).
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
AGENTD_DEPTH: Final = "agentd.agent.depth"
AGENTD_OUTCOME: Final = "agentd.outcome"
AGENTD_CAP: Final = "agentd.cap"
AGENTD_ENDPOINT: Final = "agentd.gateway.endpoint"
