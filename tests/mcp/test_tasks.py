"""agentd.mcp.tasks: which tool calls become tasks, and what each wire's task answers mean (sans-io)."""

from __future__ import annotations

import pytest

from agentd.mcp import tasks
from agentd.mcp.client_session import ResultTypeError
from agentd.mcp.streamable_http import request_headers
from agentd.mcp.versions import Era

CAN = {"tasks": {"cancel": {}, "requests": {"tools": {"call": {}}}}}


def test_call_mode_follows_task_support_and_the_servers_capability() -> None:
    assert tasks.task_support({"taskSupport": "required"}) == "required"
    assert tasks.task_support({"taskSupport": "sometimes"}) == tasks.task_support(None) == "forbidden"
    assert tasks.call_mode(Era.LEGACY, "required", CAN) is tasks.CallMode.TASK
    assert tasks.call_mode(Era.LEGACY, "required", {"tasks": {}}) is tasks.CallMode.UNUSABLE
    assert tasks.call_mode(Era.LEGACY, "optional", CAN) is tasks.CallMode.PLAIN  # the default wire unchanged
    assert tasks.call_mode(Era.MODERN, "required", {}) is tasks.CallMode.PLAIN  # the server decides there
    assert tasks.augment({"name": "t"}, 5000) == {"name": "t", "task": {"ttl": 5000}}


def test_legacy_answers() -> None:
    created = tasks.created({"task": {"taskId": "a", "status": "working", "pollInterval": 1500}}, Era.LEGACY)
    assert created == tasks.Task("a", "working", None, 1.5)
    assert tasks.created({"content": [], "isError": False}, Era.LEGACY) is None
    seen = tasks.observed({"taskId": "a", "status": "completed", "statusMessage": "ok"}, Era.LEGACY, "a")
    assert seen.terminal and seen.status_message == "ok"
    with pytest.raises(ResultTypeError, match="another task"):
        tasks.observed({"taskId": "b", "status": "working"}, Era.LEGACY, "a")
    with pytest.raises(ResultTypeError, match="unknown status"):
        tasks.observed({"taskId": "a", "status": "done"}, Era.LEGACY, "a")
    assert tasks.cancel_params("a", Era.LEGACY, CAN) == {"taskId": "a"}
    assert tasks.cancel_params("a", Era.LEGACY, {"tasks": {"requests": {}}}) is None


def test_modern_answers() -> None:
    handle = {"resultType": "task", "taskId": "m", "status": "working", "ttlMs": None, "pollIntervalMs": 250}
    assert tasks.created(handle, Era.MODERN) == tasks.Task("m", "working", None, 0.25)
    assert tasks.created({"resultType": "complete", "content": []}, Era.MODERN) is None
    done = tasks.observed({"taskId": "m", "status": "completed", "result": {"content": []}}, Era.MODERN, "m")
    assert tasks.modern_outcome(done) == {"content": []}
    with pytest.raises(ResultTypeError, match="without a result"):
        tasks.observed({"taskId": "m", "status": "completed"}, Era.MODERN, "m")
    failed = tasks.observed({"taskId": "m", "status": "failed", "error": {"code": -32603, "message": "x"}},
                            Era.MODERN, "m")
    with pytest.raises(tasks.TaskFailed) as info:
        tasks.modern_outcome(failed)
    assert info.value.code == -32603 and info.value.detail == "x"
    assert tasks.cancel_params("m", Era.MODERN, {}) == {"taskId": "m"}


def test_input_required_is_answered_once_per_key() -> None:
    asking = tasks.Task("m", "input_required", input_requests={
        "a": {"method": "elicitation/create", "params": {}}, "b": {"method": "roots/list"}})
    answered: set[str] = {"b"}
    assert tasks.update_params(asking, answered) == {"taskId": "m", "inputResponses": {"a": {"action": "decline"}}}
    assert tasks.update_params(asking, {"a", "b"}) is None
    sampling = tasks.Task("m", "input_required", input_requests={"s": {"method": "sampling/createMessage"}})
    with pytest.raises(ResultTypeError, match="sampling"):
        tasks.update_params(sampling, set())


def test_poll_delay_honours_the_server_within_bounds() -> None:
    bounds = {"default": 1.0, "floor": 0.05, "cap": 30.0}
    assert tasks.poll_delay(tasks.Task("a", "working", poll_interval=5.0), **bounds) == 5.0
    assert tasks.poll_delay(tasks.Task("a", "working"), **bounds) == 1.0
    assert tasks.poll_delay(tasks.Task("a", "working", poll_interval=0.0), **bounds) == 0.05
    assert tasks.poll_delay(tasks.Task("a", "working", poll_interval=3600.0), **bounds) == 30.0


def test_task_requests_route_by_task_id_on_the_modern_wire() -> None:
    headers = request_headers(era=Era.MODERN, protocol_version="2026-07-28", session_id=None, method="tasks/get",
                              params={"taskId": "t-1"})
    assert headers["Mcp-Name"] == "t-1" and headers["Mcp-Method"] == "tasks/get"
