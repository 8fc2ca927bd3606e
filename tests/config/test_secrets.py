"""Secret references: resolution, redaction, errors that name the reference and never the value."""

from pathlib import Path

import pytest

from agentd.security.secrets import (
    SecretError,
    SecretResolver,
    check_refs_available,
    has_secret_ref,
    looks_like_inline_credential,
    secret_refs,
)
from agentd.telemetry.events import EventLog, Redactor

VALUE = "s3cr3t-Value-9f8e7d6c5b4a"


def test_env_reference_resolves_and_is_redacted() -> None:
    redactor = Redactor()
    resolver = SecretResolver({"TOKEN": VALUE}, redactor)
    assert resolver.resolve("Bearer {{secret:TOKEN}}") == f"Bearer {VALUE}"
    assert resolver.resolve("Bearer {{ secret : TOKEN }}") == f"Bearer {VALUE}"
    lines: list[dict[str, object]] = []
    log = EventLog(sink=lines.append, redactor=redactor)
    log.info("config.loaded", note=f"oops {VALUE}", nested={"k": [VALUE]})
    assert VALUE not in repr(lines) and "***" in repr(lines)


def test_file_reference_strips_one_trailing_newline(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(VALUE + "\n")
    resolver = SecretResolver({})
    assert resolver.resolve(f"{{{{secret-file:{secret}}}}}") == VALUE
    secret.write_text(VALUE + "\r\n")
    assert resolver.resolve(f"x {{{{secret-file:{secret}}}}} y") == f"x {VALUE} y"


def test_file_reference_with_inner_line_break_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(VALUE + "\nX-Injected: 1\n")
    with pytest.raises(SecretError) as info:
        SecretResolver({}).resolve(f"{{{{secret-file:{secret}}}}}")
    assert VALUE not in str(info.value) and "line break" in str(info.value)


def test_missing_env_names_the_reference_only() -> None:
    with pytest.raises(SecretError) as info:
        SecretResolver({"OTHER": VALUE}).resolve("Bearer {{secret:MISSING_TOKEN}}")
    assert "MISSING_TOKEN" in str(info.value)
    assert VALUE not in str(info.value)
    assert info.value.exit_code == 2


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(SecretError) as info:
        SecretResolver({}).resolve(f"{{{{secret-file:{missing}}}}}")
    assert str(missing) in str(info.value)


@pytest.mark.parametrize("bad", ["{{secret:}}", "{{secret:1ABC}}", "{{secret:A-B}}", "{{secret-file:}}",
                                 "{{secret:TOKEN}", "{{secrt:TOKEN}}", "Bearer {{TOKEN}}"])
def test_malformed_references(bad: str) -> None:
    with pytest.raises(SecretError):
        secret_refs(bad)
    with pytest.raises(SecretError):
        SecretResolver({"TOKEN": VALUE}).resolve(bad)


def test_refs_and_availability(tmp_path: Path) -> None:
    f = tmp_path / "k"
    f.write_text("x")
    template = f"{{{{secret:A}}}}:{{{{secret-file:{f}}}}}"
    assert [r.kind for r in secret_refs(template)] == ["env", "file"]
    assert has_secret_ref(template) and not has_secret_ref("Bearer abc")
    check_refs_available(template, {"A": ""})
    with pytest.raises(SecretError, match=r"\{\{secret:A\}\}"):
        check_refs_available(template, {})
    f.unlink()
    with pytest.raises(SecretError, match="secret-file"):
        check_refs_available(template, {"A": "1"})


def test_resolver_reads_live_values(tmp_path: Path) -> None:
    """No caching: a rotated file is picked up at the next resolve (the next connect)."""
    f = tmp_path / "k"
    f.write_text("first-value")
    resolver = SecretResolver({})
    assert resolver.resolve(f"{{{{secret-file:{f}}}}}") == "first-value"
    f.write_text("second-value")
    assert resolver.resolve(f"{{{{secret-file:{f}}}}}") == "second-value"


@pytest.mark.parametrize(
    "value",
    ["Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", "Bearer abcdefgh12345678", "bearer 0123456789abcdef",
     "Basic dXNlcjpwYXNzd29yZA==", "Token abcdefghijkl", "sk-proj-abcdefghijklmnop", "ghp_abcdefghijklmnopqrstu",
     "AKIAABCDEFGHIJKLMNOP", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
     "xoxb-1234567890-abcdefghij"],
)
def test_inline_credentials_detected(value: str) -> None:
    assert looks_like_inline_credential(value)


@pytest.mark.parametrize(
    "value",
    ["Bearer {{secret:TOKEN}}", "{{secret-file:/run/secrets/token}}", "application/json", "en-US,en;q=0.9",
     "agentd", "no-cache", "Bearer", "my-tenant-name", "2025-11-25", "text/event-stream; charset=utf-8",
     "Hello there, this is a long but ordinary sentence value"],
)
def test_ordinary_values_are_not_credentials(value: str) -> None:
    assert not looks_like_inline_credential(value)


@pytest.mark.parametrize(
    ("name", "value", "inline"),
    [
        ("X-Api-Key", "hunter2hunter2", True),  # low entropy, but the name says credential
        ("X-Auth-Token", "password", True),
        ("Cookie", "session=abcdefgh", True),
        ("Private-Key", "changeme", True),
        ("X-Api-Key", "short", False),
        ("X-Tenant-Id", "123e4567-e89b-12d3-a456-426614174000", False),  # an identifier
        ("X-Api-Key", "123e4567-e89b-12d3-a456-426614174000", True),  # a UUID-shaped key
        ("X-Request-Source", "agentd-nightly", False),
        ("X-Monkey", "banana-bread", False),  # "key" inside a word is not a credential name
        ("X-Author", "Jane Doe-Smith", False),
        ("X-Auth", "letmeinplease", True),
        ("Authorization", "Bearer {{secret:TOKEN}}", False),
    ],
)
def test_header_names_sharpen_detection(name: str, value: str, inline: bool) -> None:
    assert looks_like_inline_credential(value, name=name) is inline


def test_referenced_env_names_accepts_what_the_resolver_accepts() -> None:
    from agentd.security.secrets import referenced_env_names

    template = "Bearer {{ secret:TOK }} {{secret:B}} {{secret-file:/x}} {{secret:bad name}} {{ not a ref"
    assert referenced_env_names(template) == {"TOK", "B"}
    assert SecretResolver({"TOK": "t", "B": "b"}).resolve("{{ secret:TOK }}-{{secret:B}}") == "t-b"
