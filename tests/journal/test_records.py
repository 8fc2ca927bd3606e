"""Records round-trip through JSON and refuse what they cannot read."""

from __future__ import annotations

import json

import pytest

from agentd.journal import records as r
from agentd.journal.errors import JournalFormatError

SAMPLES = [
    r.RunStarted("sha256:ab", "Do it.", {"type": "object"}, parent="h-1"),
    r.ModelReply(0, {"role": "assistant", "content": "hi"}),
    r.ToolCallRequested(0, "c1", "a__b", {"q": "é"}),
    r.ToolCallOutcome(0, "c1", False, "boom"),
    r.ToolTaskStarted(0, "c1", "task-9"),
    r.Spawned(1, "h-2", "sub", budget=500),
    r.ChildResult("h-2", "completed", {"x": 1}, tokens=120),
    r.Usage(1, 10, 2),
    r.RunEnded("completed", "done"),
    r.ClaimTaken("member-a", 7, attempt=2),
    r.SubscriptionAdded("docs", "file:///a", origin="self"),
    r.SubscriptionRemoved("docs", "file:///a"),
    r.ScheduleAdded("s1", 1.5, "later"),
    r.ScheduleFired("s1", "run-9"),
    r.HandleState("h-3", "done", [1, 2]),
    r.BudgetReserved("h-2", "root", 500),
    r.BudgetCharged("h-2", 20),
    r.BudgetRefunded("h-2", 480),
    r.ApprovalPending(1, "c1", "pay", "charge", {"amount": 3, "token": "***"}),
    r.ApprovalDecided(1, "c1", "deny", "too much"),
    r.ElicitationPending(2, "c2", "ev", "Your name?", {"type": "object", "properties": {"name": {"type": "string"}}}),
    r.ElicitationDecided(2, "c2", "accept", {"name": "Ada"}),
]


def test_every_kind_has_a_sample():
    assert {type(s) for s in SAMPLES} == set(r.KINDS.values())


@pytest.mark.parametrize("record", SAMPLES, ids=lambda s: s.KIND)
def test_round_trip_through_json(record):
    data = json.loads(json.dumps(r.encode(record)))
    assert data["v"] == r.RECORD_VERSION and data["kind"] == record.KIND
    assert r.decode(data) == record


def test_newer_version_is_refused():
    data = r.encode(r.Usage(0, 1, 1)) | {"v": r.RECORD_VERSION + 1}
    with pytest.raises(JournalFormatError, match="newer"):
        r.decode(data)


def test_unknown_kind_and_bad_fields_are_refused():
    with pytest.raises(JournalFormatError, match="unknown journal record kind"):
        r.decode({"v": 1, "kind": "nope"})
    with pytest.raises(JournalFormatError, match="malformed usage"):
        r.decode({"v": 1, "kind": "usage", "step": 0, "bogus": 1})
