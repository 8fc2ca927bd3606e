"""Event lines are built on every hot path (a wake writes several before its model request): the shortcuts that
make them cheap must not change a line."""

from __future__ import annotations

import json
import os
import time

from agentd.telemetry.events import EventLog, _rfc3339_ms


def test_timestamps_match_the_full_format_across_seconds() -> None:
    start = 1_796_000_000.0
    for step in range(4000):  # 0.7 ms apart: many lines within a second, and 2.8 s of second boundaries
        now = start + step * 0.0007
        seconds = int(now)
        full = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((now - seconds) * 1000):03d}Z"
        assert _rfc3339_ms(now) == full
    assert _rfc3339_ms(start - 86_400.5) < _rfc3339_ms(start)  # going back in time is formatted too


def test_a_forked_child_writes_its_own_pid() -> None:
    lines: list[dict[str, object]] = []
    log = EventLog(sink=lines.append)
    log.info("run.start", mode="once")
    assert lines[-1]["pid"] == os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        try:
            log.info("run.start", mode="once")
            os.write(write, json.dumps({"pid": lines[-1]["pid"], "real": os.getpid()}).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = json.loads(pipe.read())
    os.waitpid(child, 0)
    assert seen["pid"] == seen["real"] != os.getpid()


def test_scalar_and_nested_fields_are_written_as_before() -> None:
    lines: list[dict[str, object]] = []
    log = EventLog(sink=lines.append)
    log.info("loop.start", tools=3, deadline=1.5, ok=True, none=None, servers=["a", "b"], usage={"x": 1},
             names=tuple(f"n{i}" for i in range(300)))
    line = lines[-1]
    assert (line["tools"], line["deadline"], line["ok"], line["none"]) == (3, 1.5, True, None)
    assert line["servers"] == ["a", "b"]
    assert line["usage"] == {"x": 1}
    names = line["names"]
    assert isinstance(names, list)
    assert names[0] == "n0"
    assert str(names[-1]).startswith("…[")


def test_text_fields_are_scrubbed_and_cut_as_before() -> None:
    """Short text goes straight into the line only while no secret is registered; a secret is still scrubbed
    out of every text field once one is, and a long field is still cut."""
    from agentd.telemetry.events import MAX_FIELD_CHARS

    lines: list[dict[str, object]] = []
    log = EventLog(sink=lines.append)
    log.info("run.start", mode="once", uri="test://token-1234", long="x" * (MAX_FIELD_CHARS + 1))
    assert lines[-1]["uri"] == "test://token-1234"
    assert str(lines[-1]["long"]).endswith(f"…[truncated: {MAX_FIELD_CHARS + 1} chars]")
    log.redactor.add("token-1234")
    log.info("run.start", mode="once", uri="test://token-1234", reason="bad token-1234")
    assert (lines[-1]["uri"], lines[-1]["reason"], lines[-1]["mode"]) == ("test://***", "bad ***", "once")


def test_short_lists_and_flat_maps_are_written_as_the_general_path_writes_them() -> None:
    """Lists of short text and numbers, and flat maps of them, go straight into the line while no secret is
    registered: the same values the general path writes (a copy, keys as text), and scrubbed once one is."""
    from agentd.telemetry.events import KEY_CHARS, MAX_FIELD_CHARS

    lines: list[dict[str, object]] = []
    log = EventLog(sink=lines.append)
    names = ("subagent.spawn", "token-1234", 7)
    usage = {"prompt_tokens": 3, "note": "token-1234"}
    odd = {1: "int key", "k" * (KEY_CHARS + 1): "long key"}
    long_item = ["x" * (MAX_FIELD_CHARS + 1)]
    log.info("loop.start", control_tools=names, usage=usage, odd=odd, long=long_item)
    fast = lines[-1]
    general = {key: log._clean(value, 0) for key, value in
               {"control_tools": names, "usage": usage, "odd": odd, "long": long_item}.items()}
    for key, value in general.items():
        assert fast[key] == value and type(fast[key]) is type(value), key
    assert fast["usage"] is not usage and fast["control_tools"] == ["subagent.spawn", "token-1234", 7]
    assert list(fast["odd"]) == ["1", "k" * KEY_CHARS + f"…[truncated: {KEY_CHARS + 1} chars]"]  # type: ignore[call-overload]
    log.redactor.add("token-1234")
    log.info("loop.start", control_tools=names, usage=usage)
    assert lines[-1]["control_tools"] == ["subagent.spawn", "***", 7]
    assert lines[-1]["usage"] == {"prompt_tokens": 3, "note": "***"}
