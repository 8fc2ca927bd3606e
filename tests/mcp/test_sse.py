"""The SSE decoder against the event-stream format, fed in every possible chunking."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentd.mcp.sse import SseDecoder, SseError, SseEvent, encode_comment, encode_event

STREAM = (
    b"id: 1\r\nretry: 500\r\ndata:\r\n\r\n"  # a 2025-11-25 priming event: id + retry, empty data
    b": ping - 2026\r\n\r\n"  # a keepalive comment
    b"event: message\r\ndata: {\"a\":1}\r\ndata: two\r\n\r\n"  # multi-line data, CRLF
    b"data: lf only\n\n"
    b"data: cr only\r\r"
    b"id: 7\ndata:no space\n\n"
)
EXPECTED = [
    SseEvent(data="", id="1", retry=500),
    SseEvent(data='{"a":1}\ntwo'),
    SseEvent(data="lf only"),
    SseEvent(data="cr only"),
    SseEvent(data="no space", id="7"),
]


def decode_in_chunks(data: bytes, sizes: list[int]) -> tuple[list[SseEvent], SseDecoder]:
    decoder = SseDecoder()
    events: list[SseEvent] = []
    position = 0
    for size in sizes:
        events += decoder.feed(data[position : position + size])
        position += size
    events += decoder.feed(data[position:])
    return events, decoder


def test_whole_stream() -> None:
    events, decoder = decode_in_chunks(STREAM, [])
    assert events == EXPECTED
    assert decoder.last_event_id == "7"
    assert decoder.retry_ms == 500
    assert not decoder.pending()


@given(st.lists(st.integers(min_value=0, max_value=7), max_size=60))
def test_any_chunking_gives_the_same_events(sizes: list[int]) -> None:
    events, _ = decode_in_chunks(STREAM, sizes)
    assert events == EXPECTED


def test_byte_order_mark_is_skipped_even_when_split() -> None:
    events, _ = decode_in_chunks(b"\xef\xbb\xbfdata: x\n\n", [1, 1])
    assert events == [SseEvent(data="x")]


def test_truncated_stream_is_visible() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b'data: {"partial"') == []
    assert decoder.pending()


def test_oversized_event_is_an_error_not_growth() -> None:
    decoder = SseDecoder(max_event_bytes=1024)
    with pytest.raises(SseError):
        for _ in range(100):
            decoder.feed(b"data: " + b"x" * 100 + b"\n")


def test_oversized_line_is_an_error() -> None:
    decoder = SseDecoder(max_event_bytes=1024)
    with pytest.raises(SseError):
        decoder.feed(b"data: " + b"x" * 2048)


def test_non_utf8_line_is_an_error() -> None:
    with pytest.raises(SseError):
        SseDecoder().feed(b"data: \xff\xfe\n\n")


@given(st.text(alphabet=st.characters(blacklist_characters="\r\x00", blacklist_categories=["Cs"])), st.booleans())
def test_encoder_round_trips(data: str, with_id: bool) -> None:
    encoded = encode_comment("keepalive") + encode_event(data, id="e-1" if with_id else None, retry=250)
    events = SseDecoder().feed(encoded)
    assert events == [SseEvent(data=data, id="e-1" if with_id else None, retry=250)]
