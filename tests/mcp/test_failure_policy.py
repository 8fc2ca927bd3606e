"""The failure policy table itself: complete, and what each row promises (the behaviour through real sockets is
tests/client/test_failure_policy.py)."""

from __future__ import annotations

import itertools

from agentd.errors import McpError, McpProtocolError, McpRpcError, McpTransportError, ResourceNotFound
from agentd.mcp import failure_policy as fp
from agentd.mcp.failure_policy import Failure, Outcome, RequestKind


def test_every_failure_and_kind_has_a_decision() -> None:
    assert set(fp.POLICY) == set(itertools.product(Failure, RequestKind))


def test_what_the_table_promises() -> None:
    retried = {key for key, d in fp.POLICY.items() if d.retries}
    # Only transport failures are retried; a tools/call only when idempotent and never sent.
    assert retried == {(Failure.UNSENT, RequestKind.SAFE), (Failure.UNSENT, RequestKind.IDEMPOTENT_CALL),
                       (Failure.BROKEN, RequestKind.SAFE)}
    assert all(fp.POLICY[key].retries == fp.RETRIES for key in retried)
    for kind in (RequestKind.CALL, RequestKind.IDEMPOTENT_CALL):
        assert fp.decide(Failure.METHOD_NOT_FOUND, kind).outcome is Outcome.CORRECTABLE
        assert fp.decide(Failure.INVALID_PARAMS, kind).outcome is Outcome.CORRECTABLE
        assert not fp.decide(Failure.INVALID_PARAMS, kind).counts_down
    assert fp.decide(Failure.NOT_FOUND, RequestKind.SAFE).outcome is Outcome.OBSERVATION
    assert not any(fp.decide(Failure.REFUSED, kind).counts_down for kind in RequestKind)
    assert all(fp.decide(f, k).counts_down for f in (Failure.TIMEOUT, Failure.RPC_ERROR) for k in RequestKind)
    assert not any(fp.decide(Failure.PROTOCOL, k).counts_down for k in RequestKind)


def test_kinds_classification_and_backoff() -> None:
    assert fp.request_kind("resources/read") is RequestKind.SAFE
    assert fp.request_kind("tools/call") is RequestKind.CALL
    assert fp.request_kind("tools/call", idempotent=True) is RequestKind.IDEMPOTENT_CALL
    assert fp.request_kind("resources/read", idempotent=True) is RequestKind.SAFE
    assert fp.classify(McpRpcError(-32601, "no")) is Failure.METHOD_NOT_FOUND
    assert fp.classify(McpRpcError(-32602, "bad")) is Failure.INVALID_PARAMS
    assert fp.classify(McpRpcError(-32603, "boom")) is Failure.RPC_ERROR
    assert fp.classify(ResourceNotFound("r://x", -32002, "gone")) is Failure.NOT_FOUND
    assert fp.classify(McpTransportError("x", unsent=True)) is Failure.UNSENT
    assert fp.classify(McpTransportError("x", timed_out=True)) is Failure.TIMEOUT
    assert fp.classify(McpTransportError("x")) is Failure.BROKEN
    assert fp.classify(McpProtocolError("x")) is Failure.PROTOCOL
    assert fp.classify(McpError("not in the allowlist")) is Failure.REFUSED
    assert [fp.backoff(n) for n in (1, 2, 3, 9)] == [0.25, 0.5, 1.0, fp.BACKOFF_MAX]
