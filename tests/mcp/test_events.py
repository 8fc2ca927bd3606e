"""The events extension's wire as data (agentd.mcp.events): poll params, answers checked and bounded, the poll
delay, event-type listings and the subscription key."""

from __future__ import annotations

import pytest

from agentd.mcp import events
from agentd.mcp.client_session import ResultTypeError
from agentd.mcp.meta import client_capabilities


def occ(i: int, **data: object) -> dict[str, object]:
    return {"eventId": f"e{i}", "name": "t", "timestamp": "2026-12-07T00:00:00Z", "data": data}


def test_every_events_request_declares_the_extension_and_nothing_else_does() -> None:
    for method in ("events/list", "events/poll", "events/stream"):
        assert client_capabilities(method) == {"extensions": {events.EXTENSION: {}}}
    assert events.EXTENSION not in str(client_capabilities("resources/read"))


def test_a_poll_answer_is_parsed_with_its_cursor_gap_and_interval() -> None:
    result = events.parse_poll({"events": [occ(1, a=1), occ(2, b="x")], "cursor": "c2", "truncated": True,
                                "hasMore": False, "nextPollMs": 2500})
    assert [o.event_id for o in result.events] == ["e1", "e2"]
    assert result.events[0].data == '{"a":1}'
    assert (result.cursor, result.truncated, result.has_more, result.next_poll) == ("c2", True, False, 2.5)
    assert events.parse_poll({"events": [], "cursor": None}).cursor is None


@pytest.mark.parametrize(("answer", "message"), [
    ({"events": "nope", "cursor": "c"}, "'events' must be an array"),
    ({"events": []}, "has no cursor"),
    ({"events": [], "cursor": 12345}, "cursor must be a string or null, not int"),
    ({"events": [], "cursor": "c" * 5000}, "a cursor of 5000 characters"),
    ({"events": [occ(1)] * 3, "cursor": "c"}, "3 events answer a poll for at most 2"),
    ({"events": [{"eventId": 1, "name": "t", "timestamp": "x", "data": {}}], "cursor": "c"}, "string eventId"),
    ({"events": [{**occ(1), "data": [1, 2]}], "cursor": "c"}, "data must be an object"),
])
def test_garbage_answers_are_refused_clearly(answer: dict[str, object], message: str) -> None:
    with pytest.raises(ResultTypeError, match=message):
        events.parse_poll(answer, max_events=2)


def test_huge_data_is_replaced_by_a_note() -> None:
    [item] = events.parse_poll({"events": [occ(1, blob="x" * 100_000)], "cursor": "c"}).events
    assert item.cut is not None and item.cut > events.MAX_DATA_CHARS
    assert len(item.data) < 200 and "over agentd's limit" in item.data


def test_the_poll_delay_honours_next_poll_ms_within_the_floor_and_cap() -> None:
    def delay(**fields: object) -> float:
        result = events.parse_poll({"events": fields.pop("events", []), "cursor": "c", **fields})
        return events.poll_delay(result, default=5.0, floor=1.0, cap=60.0)

    assert delay(nextPollMs=2500) == 2.5
    assert delay(nextPollMs=10) == 1.0  # a misbehaving server cannot make a tight loop
    assert delay(nextPollMs=10_000_000) == 60.0
    assert delay() == 5.0
    assert delay(nextPollMs=2500, hasMore=True, events=[occ(1)]) == 0.0  # drain the backlog at once
    assert delay(nextPollMs="soon") == 5.0


def test_event_types_are_listed_and_malformed_entries_skipped() -> None:
    types, cursor = events.parse_list({"events": [
        {"name": "a", "delivery": ["poll", "push", "carrier-pigeon"]}, {"name": 3}, "junk",
        {"name": "b", "delivery": ["webhook"]}], "nextCursor": "p2"})
    assert [(t.name, sorted(t.delivery)) for t in types] == [("a", ["poll", "push"]), ("b", ["webhook"])]
    assert cursor == "p2"
    with pytest.raises(ResultTypeError):
        events.parse_list({"events": {}})


def test_subscription_keys_tell_arguments_apart() -> None:
    plain = events.subscription_key("s", "t", {})
    assert plain == "event:s/t"
    a = events.subscription_key("s", "t", {"q": 1, "r": 2})
    assert a == events.subscription_key("s", "t", {"r": 2, "q": 1}) != events.subscription_key("s", "t", {"q": 2})
    assert a.startswith(plain + "#")


def test_stream_frames_read_as_poll_answers() -> None:
    active = events.stream_frame("notifications/events/active", {"cursor": "c4", "truncated": True})
    assert active is not None and active.result == events.PollResult((), "c4", truncated=True)
    event = events.stream_frame("notifications/events/event", {**occ(5, k="v"), "cursor": "c5"})
    assert event is not None and event.result is not None
    assert event.result.cursor == "c5" and event.result.events[0].data == '{"k":"v"}'
    beat = events.stream_frame("notifications/events/heartbeat", {"cursor": None})
    assert beat is not None and beat.result == events.PollResult((), None)
    bare = events.stream_frame("notifications/events/heartbeat", {})
    assert bare is not None and bare.result is None  # liveness only: the cursor stays
    error = events.stream_frame("notifications/events/error", {"error": {"code": -32603, "message": "upstream 503"}})
    assert error is not None and error.error == "upstream 503 (-32603)" and not error.ended
    ended = events.stream_frame("notifications/events/terminated", {"error": {"code": -32012, "message": "no"}})
    assert ended is not None and ended.ended
    assert events.stream_frame("notifications/progress", {}) is None
    with pytest.raises(ResultTypeError, match="not int"):
        events.stream_frame("notifications/events/event", {**occ(6), "cursor": 6})
