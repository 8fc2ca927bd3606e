"""agentd's error tree and its exit-code contract.

Every failure agentd reports is an :class:`AgentdError`; each class carries the process exit code
the CLI maps it to, so the table in docs/cli.md lives in exactly one place::

    AgentdError                      1  generic failure
    ├── ConfigError                  2  bad config or usage, raised before any side effect
    ├── IntelligenceError            4  every gateway unreachable, auth failure, malformed reply
    ├── McpError                     1  anything about an MCP peer
    │   ├── McpConnectError          6  handshake failed (the CLI uses 6 only for *required* servers)
    │   ├── McpTransportError        1  the HTTP exchange broke (reset, refused, bad status, timeout)
    │   ├── McpProtocolError         1  the peer sent something that is not valid MCP (garbage, oversize)
    │   └── McpRpcError              1  a JSON-RPC error response: a fault, never a model observation
    │       └── ResourceNotFound     1  -32002 (or -32602 on the modern wire) with ``data.uri``
    └── A2aError                     1  anything about an A2A peer (``peer`` names it)
        ├── A2aConnectError          6  its Agent Card could not be fetched or is invalid (*required* peers)
        └── A2aRpcError              1  a JSON-RPC error response from the peer: a fault, not a task outcome

Messages never contain secret values: callers pass names, URLs and sizes, not headers or bodies.
"""

from __future__ import annotations

import enum
from typing import Any


class ExitCode(enum.IntEnum):
    """The process exit codes, the same contract as the original agentd (docs/cli.md)."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    PARTIAL = 3
    INTELLIGENCE = 4
    REFUSED = 5
    MCP_REQUIRED = 6
    BUDGET = 7


class AgentdError(Exception):
    """Base of every error agentd raises on purpose."""

    exit_code: ExitCode = ExitCode.FAILURE


class ConfigError(AgentdError):
    """Bad configuration or usage. Always raised before any network or process side effect.

    Its message is one line whatever value it quotes (a path or flag value holding a line break is shown
    escaped), so the one-line error the CLI prints cannot be split or forged by the value."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str = "", *args: object) -> None:
        super().__init__(message.replace("\r", "\\r").replace("\n", "\\n"), *args)


class IntelligenceError(AgentdError):
    """The intelligence gateway could not produce a usable reply (all endpoints down, 401, garbage)."""

    exit_code = ExitCode.INTELLIGENCE


class McpError(AgentdError):
    """Something went wrong talking to an MCP peer; ``server`` names the declared server if known."""

    def __init__(self, message: str, *, server: str | None = None) -> None:
        super().__init__(message)
        self.server = server


class McpConnectError(McpError):
    """The server could not be connected to or refused/failed the handshake."""

    exit_code = ExitCode.MCP_REQUIRED


class McpTransportError(McpError):
    """The HTTP exchange failed: refused, reset, timeout, unexpected status or redirect.

    ``unsent``: the request was never written (connection refused, no live connection), so the server cannot
    have acted on it; ``timed_out``: no answer within the call timeout (agentd.mcp.failure_policy reads both).
    """

    def __init__(
        self, message: str, *, server: str | None = None, unsent: bool = False, timed_out: bool = False
    ) -> None:
        super().__init__(message, server=server)
        self.unsent = unsent
        self.timed_out = timed_out


class McpProtocolError(McpError):
    """The peer broke the protocol: unparsable body, wrong content type, oversized or truncated reply."""


class McpRpcError(McpError):
    """A JSON-RPC error response. A fault in the request or the server, not a tool observation."""

    def __init__(
        self, code: int, message: str, data: Any = None, *, server: str | None = None, method: str | None = None
    ) -> None:
        where = f" ({method})" if method else ""
        super().__init__(f"JSON-RPC error {code}{where}: {message}", server=server)
        self.code = code
        self.rpc_message = message
        self.data = data
        self.method = method


class ResourceNotFound(McpRpcError):
    """The server does not have the resource; ``uri`` is the one asked for."""

    def __init__(self, uri: str, code: int, message: str, data: Any = None, *, server: str | None = None) -> None:
        super().__init__(code, message, data, server=server, method="resources/read")
        self.uri = uri


class A2aError(AgentdError):
    """Something went wrong talking to an A2A peer; ``peer`` names the declared peer if known."""

    def __init__(self, message: str, *, peer: str | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class A2aConnectError(A2aError):
    """A peer's Agent Card could not be fetched or is invalid (exit 6 for a required peer)."""

    exit_code = ExitCode.MCP_REQUIRED


class A2aRpcError(A2aError):
    """A JSON-RPC error response from a peer (a fault, not a task outcome); ``code`` is the A2A/JSON-RPC code."""

    def __init__(self, code: int, message: str, *, peer: str | None = None, method: str | None = None) -> None:
        where = f" ({method})" if method else ""
        super().__init__(f"A2A error {code}{where}: {message}", peer=peer)
        self.code = code
        self.rpc_message = message


def leaves(exc: BaseException) -> list[BaseException]:
    """Every exception inside (possibly nested) exception groups, in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def flatten(exc: BaseException) -> BaseException:
    """The one exception a (possibly nested) group stands for: the first agentd error (it carries the exit
    code), else a KeyboardInterrupt, else the first leaf.

    trio wraps whatever escapes a nursery in a group; what it ended as belongs to what is inside, and every
    layer (agentd.run's outcome rule, the CLI's exit code) reads it by this one rule.
    """
    found = leaves(exc)
    for leaf in found:
        if isinstance(leaf, AgentdError):
            return leaf
    for leaf in found:
        if isinstance(leaf, KeyboardInterrupt):
            return leaf
    return found[0] if found else exc
