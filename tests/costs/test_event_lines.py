"""Event lines are built on every hot path (a wake writes several before its model request): the shortcuts that
make them cheap must not change a line."""

from __future__ import annotations

import json
import os
import time

from agentd.events import EventLog, _rfc3339_ms


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
