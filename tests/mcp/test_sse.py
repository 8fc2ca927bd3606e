"""The SSE decoder against the event-stream format, fed in every possible chunking."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentd.mcp.sse import (
    DEFAULT_MAX_EVENT_BYTES,
    SseDecoder,
    SseError,
    SseEvent,
    encode_comment,
    encode_event,
)

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


def _feed_all(decoder: SseDecoder, stream: bytes, chunk: int) -> list[SseEvent]:
    view = memoryview(stream)
    events: list[SseEvent] = []
    for start in range(0, len(stream), chunk):
        events += decoder.feed(bytes(view[start : start + chunk]))
    return events


def test_a_16_mib_event_in_4_kib_chunks_decodes_with_linear_work() -> None:
    # The largest event the decoder accepts, fed as a socket would deliver it. The decoder counts the bytes
    # it searches, copies out and moves; a decoder that re-copies or re-searches its buffer per chunk or per
    # line does ~(chunks x buffer) of that, here tens of GiB instead of a small multiple of 16 MiB.
    payload = DEFAULT_MAX_EVENT_BYTES - 64
    stream = b"id: big\r\ndata: " + b"x" * (payload // 2) + "é".encode() + b"y" * (payload // 2 - 2) + b"\r\n\r\n"
    decoder = SseDecoder()
    events = _feed_all(decoder, stream, 4096)
    assert len(events) == 1 and events[0].id == "big"
    data = events[0].data
    assert len(data) == payload - 1 and data[payload // 2] == "é" and data.endswith("y")
    assert decoder._work <= 4 * len(stream) + len(stream) // 4096
    assert not decoder.pending()


@pytest.mark.parametrize("end", [b"\n", b"\r", b"\r\n"])
def test_many_lines_in_one_feed_take_linear_work(end: bytes) -> None:
    lines = 30_000
    stream = (b"data: " + b"z" * 40 + end) * lines + end
    decoder = SseDecoder()
    [event] = decoder.feed(stream) + decoder.feed(b":\n")  # a CR at the very end waits for the next byte
    assert event.data.count("\n") == lines - 1
    assert decoder._work <= 4 * len(stream)
