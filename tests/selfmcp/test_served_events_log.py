"""The served event log's rules, on the log itself and over a real SQLite journal:

- the bounds (count and age) drop the oldest events, and a cursor behind them reads ``truncated: true``;
- a poll sees only what its predicate accepts, goes on from its cursor, pages with ``hasMore``;
- a log read back from the journal keeps its epoch and head: old cursors go on, new events follow the old ones;
- :meth:`ServedEvents.ensure_finished` writes a journaled run's missing ``subagent.finished`` once, never twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from agentd.journal.sqlite import open_journal
from agentd.mcp.served_events import EventLog, PollError, parse_poll
from agentd.selfmcp.served_events import ServedEvents


def _poll(log: EventLog, cursor: str | None, *, visible: str | None = None, now: float = 100.0, **params: object,
          ) -> dict[str, object]:
    request = parse_poll({"name": "subagent.finished", "cursor": cursor, **params})
    return log.poll(request, lambda owner: visible is None or owner == visible, now, 1000)


def _handles(result: dict[str, object]) -> list[str]:
    events = result["events"]
    assert isinstance(events, list)
    return [e["data"]["handle"] for e in events]


def test_bounds_drop_the_oldest_and_a_cursor_behind_them_is_truncated() -> None:
    log = EventLog("0123456789abcdef", max_kept=3, max_age=50.0)
    start = _poll(log, None)["cursor"]
    assert isinstance(start, str)
    for n in range(5):
        log.append("subagent.finished", "a", {"handle": f"served.{n}"}, 10.0 + n)
    assert [e.seq for e in log.trim(20.0)] == [1, 2]
    behind = _poll(log, start, now=20.0)
    assert behind["truncated"] is True and _handles(behind) == ["served.2", "served.3", "served.4"]
    assert behind["cursor"] == log.cursor(5)
    caught_up = _poll(log, log.cursor(5), now=20.0)
    assert caught_up["events"] == [] and caught_up["truncated"] is False
    assert [e.seq for e in log.trim(63.5)] == [3, 4]  # older than max_age
    assert _handles(_poll(log, start, now=63.5)) == ["served.4"]
    too_old = _poll(log, log.cursor(4), now=63.5, maxAgeMs=100)  # served.4 happened at 14.0
    assert too_old["events"] == [] and too_old["truncated"] is True


def test_a_poll_sees_its_principals_events_and_pages() -> None:
    log = EventLog("0123456789abcdef", max_kept=100, max_age=1e9)
    start = _poll(log, None)["cursor"]
    for n in range(5):
        log.append("subagent.finished", "alice" if n % 2 == 0 else "bob", {"handle": f"served.{n}"}, 1.0)
    log.append("budget.exhausted", "alice", {"handle": "served.4"}, 1.0)
    assert _handles(_poll(log, start, visible="bob")) == ["served.1", "served.3"]
    page = _poll(log, start, visible="alice", maxEvents=2)
    assert _handles(page) == ["served.0", "served.2"] and page["hasMore"] is True
    assert isinstance(page["cursor"], str)
    rest = _poll(log, page["cursor"], visible="alice", maxEvents=2)
    assert _handles(rest) == ["served.4"] and rest["hasMore"] is False
    assert rest["cursor"] == log.cursor(6)  # past the other type's event too: nothing to re-read
    with pytest.raises(PollError):
        _poll(log, log.cursor(7))  # past the head: never handed out


async def test_a_journaled_log_goes_on_after_a_restart_and_fills_a_missing_end_once(tmp_path: Path) -> None:
    clock = iter(float(n) for n in range(1000, 2000))
    async with open_journal(str(tmp_path)) as store:
        first = ServedEvents(store, clock=lambda: next(clock))
        await first.load()
        start = first.poll({"name": "subagent.finished", "cursor": None}, lambda _: True)["cursor"]
        await first.finished("served.1", "", {"handle": "served.1", "status": "completed", "result": "x"})
        await first.finished("served.2", "", {"handle": "served.2", "status": "budget_exhausted"})

    async with open_journal(str(tmp_path)) as store:
        second = ServedEvents(store, clock=lambda: next(clock))
        await second.load()
        again = second.poll({"name": "subagent.finished", "cursor": start}, lambda _: True)
        assert [e["data"]["handle"] for e in again["events"]] == ["served.1", "served.2"]
        assert again["truncated"] is False
        budget = second.poll({"name": "budget.exhausted", "cursor": start}, lambda _: True)
        assert [e["data"] for e in budget["events"]] == [{"handle": "served.2", "status": "budget_exhausted"}]
        await second.ensure_finished("served.1", "", {"handle": "served.1", "status": "completed"}, since=999.0)
        await second.ensure_finished("served.3", "", {"handle": "served.3", "status": "lost"}, since=999.0)
        after = second.poll({"name": "subagent.finished", "cursor": again["cursor"]}, lambda _: True)
        assert [e["data"]["handle"] for e in after["events"]] == ["served.3"]
        assert after["events"][0]["cursor"] == second.events.cursor(4)  # numbered after the journaled ones


async def test_memory_only_log_needs_no_journal() -> None:
    events = ServedEvents()
    await events.load()
    start = events.poll({"name": "subagent.finished"}, lambda _: True)
    assert start["events"] == [] and start["cursor"].startswith("v1.")
    with trio.fail_after(5):
        await events.finished("served.1", "", {"handle": "served.1", "status": "completed"})
    got = events.poll({"name": "subagent.finished", "cursor": start["cursor"]}, lambda _: True)
    assert [e["data"]["handle"] for e in got["events"]] == ["served.1"]
