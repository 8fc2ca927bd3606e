"""``tree.node`` as the recorder builds it from event lines: the tool calls in flight (parallel ones, bounded,
cleared at the run's end, a relayed child's own) and the elapsed time (running: up to now; ended: the
duration). Real lines in, the node out: no daemon needed for the bookkeeping itself."""

from __future__ import annotations

import json
from typing import Any

from agentd.telemetry.report import MAX_CALLS, TOOL_NAME_MAX, Recorder


def line(event: str, handle: str = "0", ts: str = "2026-12-01T10:00:00.000Z", **fields: Any) -> dict[str, Any]:
    return {"ts": ts, "level": "info", "event": event, "run_id": "r1", "agent_path": handle, **fields}


def test_the_node_names_the_tool_calls_in_flight_until_their_results():
    rec = Recorder()
    assert rec.observe(line("run.start"))["tools"] == []
    # before a run starts nothing is made up for it
    assert rec.observe(line("tool.call", handle="0.9", call_id="c0", tool="x")) is None
    assert rec.observe(line("tool.call", call_id="c1", tool="search", server="fs"))["tools"] == ["search"]
    node = rec.observe(line("tool.call", call_id="c2", tool=None, wire_name="made_up"))
    assert node["tools"] == ["search", "made_up"] and node["event"] == "tree.node"
    assert rec.observe(line("tool.result", call_id="c1", kind="result", server="fs"))["tools"] == ["made_up"]
    assert rec.observe(line("tool.result", call_id="nope", kind="result")) is None  # no call of that id
    assert rec.observe(line("tool.result", call_id="c2", kind="rejected"))["tools"] == []
    for i in range(MAX_CALLS + 5):
        rec.observe(line("tool.call", call_id=f"m{i}", tool="t" * (TOOL_NAME_MAX + 50)))
    node = rec.nodes(10)[0]
    assert len(node["tools"]) == MAX_CALLS and {len(t) for t in node["tools"]} == {TOOL_NAME_MAX}
    ended = rec.observe(line("run.end", ts="2026-12-01T10:00:02.500Z", status="completed", steps=1))
    assert ended["tools"] == [] and ended["elapsed_s"] == 2.5
    # a line of the ended run's calls changes nothing
    assert rec.observe(line("tool.call", call_id="late", tool="x")) is None
    assert rec.documents()[0]["servers"]["fs"]["calls"] == 1  # the report's counts are unchanged by this


def test_a_relayed_childs_calls_and_a_running_nodes_elapsed_time():
    rec = Recorder()
    from datetime import UTC, datetime, timedelta

    started = (datetime.now(UTC) - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    rec.observe(line("run.start", handle="served.1", ts=started))
    inner = line("tool.call", handle="served.1", call_id="c1", tool="subagent.spawn")
    node = rec.observe(line("subagent.stderr", handle="served.1", line=json.dumps(inner)))
    assert (node["handle"], node["tools"], node["status"]) == ("served.1", ["subagent.spawn"], "running")
    assert 29 <= node["elapsed_s"] < 3600  # measured from the run's start to now
    assert rec.observe(line("run.start", handle="0.1", ts="not a time"))["elapsed_s"] is None
