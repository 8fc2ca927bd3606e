"""The event log's limits: every field capped in size, each event rate-limited, drops counted (errors too)."""

from __future__ import annotations

from typing import Any

from agentd.telemetry.events import MAX_FIELD_CHARS, MAX_FIELD_ITEMS, RATE_LIMIT, EventLog


def log_at(now: list[float]) -> tuple[EventLog, list[dict[str, Any]]]:
    lines: list[dict[str, Any]] = []
    return EventLog(sink=lines.append, clock=lambda: now[0]), lines


def test_strings_lists_and_nesting_are_capped_with_markers() -> None:
    log, lines = log_at([0.0])
    log.redactor.add("Tok3n-Secret-Value")
    log.warn("tool.rejected", reason="Tok3n-Secret-Value " + "y" * 100_000, items=list(range(1000)),
             deep={"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}, blob=b"z" * 50)
    [line] = lines
    assert line["reason"].startswith("*** yyy") and line["reason"].endswith("…[truncated: 100004 chars]")
    assert len(line["reason"]) <= MAX_FIELD_CHARS + 40
    assert len(line["items"]) == MAX_FIELD_ITEMS + 1 and line["items"][-1] == f"…[{1000 - MAX_FIELD_ITEMS} more]"
    assert "nested deeper" in str(line["deep"]) and line["blob"] == 50


def test_a_flood_is_cut_to_the_rate_and_summarised_with_errors_kept_visible() -> None:
    now = [100.0]
    log, lines = log_at(now)
    for _ in range(RATE_LIMIT + 30):
        log.error("mcp.protocol_error", server="evil", what="garbage")
    log.warn("mcp.protocol_error", server="good", what="one line")  # another server has its own budget
    assert len(lines) == RATE_LIMIT + 1
    now[0] += 1.0
    log.info("proc.start")  # the next line after the window carries the summary
    summary = [line for line in lines if line["event"] == "log.suppressed"]
    assert summary == [summary[0]] and summary[0]["level"] == "error"
    assert summary[0]["suppressed"] == 30 and summary[0]["errors"] == 30
    assert summary[0]["suppressed_event"] == "mcp.protocol_error" and summary[0]["scope"] == "evil"
    # A window with drops still pending at exit is flushed by flush().
    for _ in range(RATE_LIMIT + 5):
        log.info("mcp.updated", server="s", uri="u://a")
    log.flush()
    assert lines[-1]["event"] == "log.suppressed" and lines[-1]["suppressed"] == 5 and lines[-1]["level"] == "warn"
