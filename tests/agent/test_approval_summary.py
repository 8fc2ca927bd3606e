"""What a person is shown of a call waiting for approval: short values whole, long ones cut with their length,
and no secret, whether the run knows it (the journal's and the log's redaction) or it looks like one."""

from __future__ import annotations

from agentd.agent.approval import MAX_ARGUMENTS, SHORT_VALUE, summary
from agentd.telemetry.events import Redactor


def test_short_values_whole_long_ones_cut_and_counted() -> None:
    shown = summary({"to": "c-811", "amount": 120, "urgent": True, "note": None, "memo": "x" * 200,
                     "lines": [{"sku": "a"}, {"sku": "b"}]}, None)
    assert shown["to"] == "c-811" and shown["amount"] == 120 and shown["urgent"] is True and shown["note"] is None
    assert shown["memo"] == "x" * SHORT_VALUE + "… (200 chars)"
    assert shown["lines"] == [{"sku": "a"}, {"sku": "b"}]  # short: whole, as it is


def test_secrets_are_never_shown() -> None:
    redactor = Redactor()
    redactor.add("tenant-secret-7781")
    shown = summary({"header": "Bearer tenant-secret-7781", "nested": {"k": "tenant-secret-7781"},
                     "password": "correct horse", "token": "abc12345xyz", "ref": "sk-live-0123456789abcdef",
                     "city": "Lisbon"}, redactor)
    assert shown["header"] == "Bearer ***"  # the run's own secret, scrubbed as the journal scrubs it
    assert shown["nested"] == '{"k": "***"}'  # the run's own secret, scrubbed inside an object
    assert shown["password"] == "***" and shown["token"] == "***" and shown["ref"] == "***"
    assert shown["city"] == "Lisbon"
    assert "tenant-secret-7781" not in repr(shown)


def test_many_arguments_are_counted_not_listed() -> None:
    shown = summary({f"a{i}": i for i in range(MAX_ARGUMENTS + 5)}, None)
    assert len(shown) == MAX_ARGUMENTS + 1 and shown["…"] == "5 more arguments"
