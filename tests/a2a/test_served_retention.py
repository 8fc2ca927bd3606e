"""Finished served A2A tasks are bounded per caller and in all, by count and by bytes, and expire without a
timer per task (agentd.selfmcp.a2a.A2aService, on virtual time).

The refusals are real: the service's slots are taken (``busy``), so every ``SendMessage`` is answered with a
``rejected`` task and no run is spawned; the supervisor is never reached on that path.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from agentd.a2a import types as a2a
from agentd.selfmcp.a2a import A2aService, RpcError, ServedLimits
from agentd.transport.tenancy import Principal

ALICE, BOB = Principal("alice"), Principal("bob")


def _service(**limits: Any) -> A2aService:
    return A2aService(None, limits=ServedLimits(max_running=1, **limits), busy=lambda: 1)  # type: ignore[arg-type]


async def _refused(service: A2aService, owner: Principal, text: str = "hello") -> str:
    task = await service.send({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": text}]}}, owner)
    assert task.state == "rejected"
    return task.id


def _known(service: A2aService, owner: Principal, task_id: str) -> bool:
    try:
        service.task({"id": task_id}, owner)
    except RpcError as exc:
        assert exc.code == a2a.TASK_NOT_FOUND
        return False
    return True


async def test_refused_tasks_are_bounded_per_caller_and_in_all(autojump_clock: Any) -> None:
    service = _service(kept_per_caller=3, kept=5)
    alice = [await _refused(service, ALICE) for _ in range(4)]
    assert not _known(service, ALICE, alice[0])  # the caller's oldest went first
    assert all(_known(service, ALICE, t) for t in alice[1:])
    assert service.list({}, ALICE)["totalSize"] == 3
    bob = [await _refused(service, BOB) for _ in range(3)]
    # six kept, five allowed: the oldest of all (alice's) goes
    assert not _known(service, ALICE, alice[1])
    assert all(_known(service, BOB, t) for t in bob)
    assert len(service.tasks) == 5


async def test_refused_tasks_are_bounded_in_bytes(autojump_clock: Any) -> None:
    service = _service(kept_bytes_per_caller=2000, kept_bytes=100_000)
    ids = [await _refused(service, ALICE, "x") for _ in range(20)]
    kept = [t for t in ids if _known(service, ALICE, t)]
    assert 1 <= len(kept) < 20 and kept == ids[-len(kept):]  # the newest, within 2000 bytes of JSON
    assert sum(service.tasks[t].size for t in kept) <= 2000


async def test_finished_tasks_expire_without_a_timer_each(autojump_clock: Any) -> None:
    service = _service(retention=600.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        first = [await _refused(service, ALICE) for _ in range(100)]
        assert service._nursery is not None and not service._nursery.child_tasks  # no sleeper per task
        await trio.sleep(300)
        second = await _refused(service, ALICE)
        await trio.sleep(301)
        assert not any(_known(service, ALICE, t) for t in first)  # past the retention
        assert _known(service, ALICE, second)
        assert service.list({}, ALICE)["totalSize"] == 1
        await trio.sleep(300)
        assert service.list({}, ALICE)["totalSize"] == 0 and not service.tasks
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("context_id", ["\ud800", "x" * 100_000])
async def test_a_refusal_keeps_no_more_than_its_bounds_whatever_its_context(autojump_clock: Any,
                                                                             context_id: str) -> None:
    service = _service(kept_per_caller=2)
    for _ in range(5):
        await service.send({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "t"}],
                                         "contextId": context_id}}, ALICE)
    assert service.list({}, ALICE)["totalSize"] == 2
