"""What agentd does when a request to an MCP server fails: the retry/abort policy of spec §1.4, as one table.

A top-level JSON-RPC error or a transport failure is not the tool's output: it is classified here and the
decision is returned as data. The client (agentd.client.exchange) reads :attr:`Decision.retries` to re-send what
is safe to repeat; the loop (agentd.agent.runner) reads :attr:`Decision.outcome` to write the observation and
:attr:`Decision.counts_down` to mark a server that keeps failing as down (exit 6 if it is required, its
tools omitted if it is optional). ``isError`` results never come here: the tool ran, that is an observation.

Two facts decide: the :class:`Failure` (what went wrong) and the :class:`RequestKind` (whether sending the
request again can do harm). Listing, reading and ``ping`` have no side effects and are repeated after a
transport failure; a ``tools/call`` is never sent twice, except for a tool whose annotations say
``idempotentHint: true`` when the first attempt never reached the server (the connection was refused, or there
was no connection to send it on). The table is :data:`POLICY`; docs/mcp-client.md prints it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

import attrs

from agentd.errors import McpError, McpProtocolError, McpRpcError, McpTransportError

#: How many more times a retryable request is sent after its first failure.
RETRIES: Final = 2
#: Backoff before retry ``n`` (1-based): ``BACKOFF_BASE * 2**(n-1)``, at most ``BACKOFF_MAX`` seconds.
BACKOFF_BASE: Final = 0.25
BACKOFF_MAX: Final = 2.0
#: Failures that count toward "down", in a row on one server within one run, that mark it down.
DOWN_AFTER: Final = 3

#: Requests without side effects: safe to send again after a transport failure.
SAFE_METHODS: Final = frozenset({
    "tools/list", "resources/list", "resources/read", "resources/templates/list", "prompts/list", "ping",
    "server/discover", "resources/subscribe", "resources/unsubscribe", "tasks/get", "tasks/result",
})

#: JSON-RPC codes with a meaning of their own here.
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
RESOURCE_NOT_FOUND: Final = -32002


class Failure(enum.StrEnum):
    """What went wrong with one request."""

    #: The request was never written: connection refused or timed out, or no live connection to send it on.
    UNSENT = "unsent"
    #: The transport failed after the request may have been written (reset, a response that broke off).
    BROKEN = "broken"
    #: No answer within the call timeout.
    TIMEOUT = "timeout"
    #: JSON-RPC -32601: the server has no such method (or, for tools/call, no such tool).
    METHOD_NOT_FOUND = "method_not_found"
    #: JSON-RPC -32602: the server refused the parameters (unknown tool, bad arguments).
    INVALID_PARAMS = "invalid_params"
    #: JSON-RPC -32002 on resources/read: no such resource.
    NOT_FOUND = "not_found"
    #: Any other JSON-RPC error (-32603 internal error, server-defined codes).
    RPC_ERROR = "rpc_error"
    #: An answer that breaks the protocol (not a valid result, structuredContent against its schema).
    PROTOCOL = "protocol"
    #: agentd refused to send it (a tool outside the host allowlist or refused by a pin; no such server).
    REFUSED = "refused"


class RequestKind(enum.StrEnum):
    SAFE = "safe"  # listing, reading, ping: no side effects
    IDEMPOTENT_CALL = "idempotent_call"  # tools/call of a tool annotated idempotentHint: true
    CALL = "call"  # any other tools/call (and any other request)


class Outcome(enum.StrEnum):
    """What the caller does once retries (if any) are spent."""

    #: A labelled fault: not the tool's output (the loop's "fault" observation).
    FAULT = "fault"
    #: A protocol error the model can correct (wrong tool name, bad arguments): told once, not retried.
    CORRECTABLE = "correctable"
    #: An ordinary observation (a resource that does not exist).
    OBSERVATION = "observation"


@attrs.frozen
class Decision:
    outcome: Outcome
    #: How many more times to send the request (0: never again).
    retries: int = 0
    #: Whether this failure counts toward marking the server down (:data:`DOWN_AFTER` in a row): the server is
    #: unreachable or failing; an answer it gave (a bad one, a correctable refusal) is not a server down.
    counts_down: bool = False


_RETRY: Final = Decision(Outcome.FAULT, retries=RETRIES, counts_down=True)
_FAULT_DOWN: Final = Decision(Outcome.FAULT, counts_down=True)
_FAULT: Final = Decision(Outcome.FAULT)
_CORRECTABLE: Final = Decision(Outcome.CORRECTABLE)
_SEEN: Final = Decision(Outcome.OBSERVATION)

S, IC, C = RequestKind.SAFE, RequestKind.IDEMPOTENT_CALL, RequestKind.CALL

#: The policy: (failure, request kind) -> decision. Every pair is present (tests/mcp/test_failure_policy.py).
POLICY: Final[Mapping[tuple[Failure, RequestKind], Decision]] = {
    (Failure.UNSENT, S): _RETRY,            (Failure.UNSENT, IC): _RETRY,            (Failure.UNSENT, C): _FAULT_DOWN,
    (Failure.BROKEN, S): _RETRY,            (Failure.BROKEN, IC): _FAULT_DOWN,       (Failure.BROKEN, C): _FAULT_DOWN,
    (Failure.TIMEOUT, S): _FAULT_DOWN,      (Failure.TIMEOUT, IC): _FAULT_DOWN,      (Failure.TIMEOUT, C): _FAULT_DOWN,
    (Failure.METHOD_NOT_FOUND, S): _FAULT,  (Failure.METHOD_NOT_FOUND, IC): _CORRECTABLE,
    (Failure.METHOD_NOT_FOUND, C): _CORRECTABLE,
    (Failure.INVALID_PARAMS, S): _FAULT,    (Failure.INVALID_PARAMS, IC): _CORRECTABLE,
    (Failure.INVALID_PARAMS, C): _CORRECTABLE,
    (Failure.NOT_FOUND, S): _SEEN,          (Failure.NOT_FOUND, IC): _FAULT,         (Failure.NOT_FOUND, C): _FAULT,
    (Failure.RPC_ERROR, S): _FAULT_DOWN,    (Failure.RPC_ERROR, IC): _FAULT_DOWN,    (Failure.RPC_ERROR, C): _FAULT_DOWN,
    (Failure.PROTOCOL, S): _FAULT,          (Failure.PROTOCOL, IC): _FAULT,          (Failure.PROTOCOL, C): _FAULT,
    (Failure.REFUSED, S): _FAULT,           (Failure.REFUSED, IC): _FAULT,           (Failure.REFUSED, C): _FAULT,
}  # fmt: skip


def request_kind(method: str, *, idempotent: bool = False) -> RequestKind:
    """The kind of a request: ``idempotent`` is the tool's ``idempotentHint`` (tools/call only)."""
    if method in SAFE_METHODS:
        return RequestKind.SAFE
    if method == "tools/call" and idempotent:
        return RequestKind.IDEMPOTENT_CALL
    return RequestKind.CALL


def rpc_failure(code: int) -> Failure:
    """The failure a JSON-RPC error code is."""
    if code == METHOD_NOT_FOUND:
        return Failure.METHOD_NOT_FOUND
    if code == INVALID_PARAMS:
        return Failure.INVALID_PARAMS
    if code == RESOURCE_NOT_FOUND:
        return Failure.NOT_FOUND
    return Failure.RPC_ERROR


def classify(exc: McpError) -> Failure:
    """The failure an error from the client is (agentd.errors; the transport marks what was never sent)."""
    if isinstance(exc, McpRpcError):
        return rpc_failure(exc.code)
    if isinstance(exc, McpTransportError):
        if exc.timed_out:
            return Failure.TIMEOUT
        return Failure.UNSENT if exc.unsent else Failure.BROKEN
    if isinstance(exc, McpProtocolError):
        return Failure.PROTOCOL
    return Failure.REFUSED


def decide(failure: Failure, kind: RequestKind) -> Decision:
    return POLICY[(failure, kind)]


def backoff(retry: int) -> float:
    """Seconds to wait before retry number ``retry`` (1-based)."""
    return float(min(BACKOFF_MAX, BACKOFF_BASE * 2 ** max(0, retry - 1)))
