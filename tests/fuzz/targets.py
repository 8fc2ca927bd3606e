"""Fuzz targets for the sans-io parsers: one function per parser, taking raw bytes, checking invariants.

Each target is shared by the CI run (``tests/fuzz/test_parsers.py``: hypothesis, deterministic, plus a replay
of the committed corpus in ``tests/fuzz/corpus/<target>/``) and the longer, coverage-guided run on demand
(``scripts/fuzz <target>``: atheris/libFuzzer mutating that same corpus). A target fails by raising anything
but its parser's documented error (:class:`TargetRejected` carries those, so the harness can tell a clean
refusal from a crash) or by an ``AssertionError`` when an invariant breaks:

* only the documented exception type escapes (``InvalidMessage``, ``SseError``, ``FrameError``,
  ``A2aShapeError``), or none at all (the control socket's request parser answers every input);
* whatever is accepted survives a round trip through the encoder;
* the work and the retained state are bounded by the input's size (a cap, not "whatever the input says").

The first four bytes of some inputs steer the target (chunk sizes, limits), so the fuzzer explores them too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final

from agentd.a2a import types as a2a
from agentd.ctl import server as ctl
from agentd.formats import jsontext
from agentd.mcp import jsonrpc, sse, streamable_http
from agentd.supervisor import framing

#: Small caps so the fuzzer reaches the limit paths with short inputs.
SSE_MAX: Final = 512
FRAME_MAX: Final = 16 * 1024


class TargetRejected(Exception):
    """The parser refused the input with its documented error."""


def _chunks(data: bytes, seed: int) -> list[bytes]:
    """Split ``data`` into chunks whose sizes cycle through 1..(seed % 17 + 1)."""
    width = seed % 17 + 1
    out: list[bytes] = []
    pos, step = 0, 1
    while pos < len(data):
        out.append(data[pos : pos + step])
        pos += step
        step = step % width + 1
    return out


# -- JSON-RPC bodies --------------------------------------------------------------------------------------------


def jsonrpc_body(data: bytes) -> None:
    """``parse_body``: a message/batch or ``InvalidMessage`` with a JSON-RPC code; accepted ones re-encode."""
    try:
        parsed = jsonrpc.parse_body(data)
    except jsonrpc.InvalidMessage as exc:
        assert exc.code in (jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST, jsonrpc.INVALID_PARAMS), exc.code
        assert exc.id is None or jsonrpc._valid_id(exc.id)
        # the error answer itself must always be encodable and bounded
        answer = jsonrpc.dumps(jsonrpc.error_for(exc))
        assert len(answer) <= 4 * len(data) + 1024, len(answer)
        raise TargetRejected from None
    messages = parsed if isinstance(parsed, list) else [parsed]
    assert messages
    for message in messages:
        assert isinstance(message, jsonrpc.Request | jsonrpc.Notification | jsonrpc.Response
                          | jsonrpc.ErrorResponse)
    encoded = jsonrpc.dumps(parsed)
    # re-encoding may grow numbers (1e5 -> 100000.0) but only by a constant factor
    assert len(encoded) <= 8 * len(data) + 64, (len(encoded), len(data))
    again = jsonrpc.parse_body(encoded)
    assert jsonrpc.dumps(again) == encoded


# -- SSE decoding -----------------------------------------------------------------------------------------------


def _decode_sse(chunks: list[bytes]) -> tuple[list[sse.SseEvent], bool]:
    decoder = sse.SseDecoder(max_event_bytes=SSE_MAX)
    events: list[sse.SseEvent] = []
    fed = 0
    biggest = 0
    for chunk in chunks:
        fed += len(chunk)
        biggest = max(biggest, len(chunk))
        events.extend(decoder.feed(chunk))
        # retained input never exceeds the cap plus what one feed brought
        assert len(decoder._buffer) - decoder._start <= SSE_MAX + biggest
        assert decoder._data_size <= SSE_MAX + 1
        # linear work, however the bytes are chunked
        assert decoder._work <= 6 * fed + 64, (decoder._work, fed)
    for event in events:
        assert isinstance(event, sse.SseEvent)
        assert len(event.data) <= SSE_MAX
    return events, decoder.pending()


def sse_stream(data: bytes) -> None:
    """The SSE decoder: ``SseError`` only, the same events however the bytes are chunked, bounded state."""
    seed, body = (data[0], data[1:]) if data else (0, b"")
    try:
        whole = _decode_sse([body])
    except sse.SseError:
        whole = None
    try:
        chunked = _decode_sse(_chunks(body, seed))
    except sse.SseError:
        chunked = None
    if whole is None or chunked is None:
        # a size error may fire a little earlier when a whole line arrives at once, never only one way
        # for a format error (bad UTF-8 is found on the line, however it was chunked)
        raise TargetRejected
    assert whole == chunked, (whole, chunked)


def sse_roundtrip(data: bytes) -> None:
    """``encode_event`` then decode gives the same event back (text without CR, which is a line end)."""
    text = data.decode("utf-8", errors="ignore").replace("\r", "")
    if len(text) > SSE_MAX // 2:
        text = text[: SSE_MAX // 2]
    head, _, rest = text.partition("\x00")
    event_id = head.replace("\n", "") or None
    encoded = sse.encode_event(rest, id=event_id, event="message")
    events, pending = _decode_sse([encoded])
    assert not pending
    assert events == [sse.SseEvent(data=rest, event="message", id=event_id)], (events, rest, event_id)


# -- Streamable HTTP header rules -------------------------------------------------------------------------------


def _header_safe(value: str) -> bool:
    return all(0x20 <= ord(c) <= 0x7E for c in value) and value == value.strip()


def header_rules(data: bytes) -> None:
    """Header values: encode/decode round trip, header-safe output; schema annotations never raise and
    never produce a header name or value that is not a token / printable ASCII."""
    text = data.decode("utf-8", errors="replace")
    encoded = streamable_http.encode_header_value(text)
    assert _header_safe(encoded), encoded
    assert streamable_http.decode_header_value(encoded) == text
    streamable_http.decode_header_value(text)  # anything at all: never raises
    streamable_http.media_type(text)
    streamable_http.accepts(text, streamable_http.JSON)
    streamable_http.valid_session_id(text)
    for status in (200, 202, 204, 307, 404, 405, 500, data[0] * 3 if data else 0):
        for method in ("POST", "GET"):
            assert isinstance(streamable_http.classify(status, text, method=method, had_session=True),
                              streamable_http.Body)
    try:
        schema = json.loads(data)
    except (ValueError, RecursionError):
        schema = {"type": "object", "properties": {"a": {"type": "string", "x-mcp-header": text}}}
    try:
        reason = streamable_http.invalid_header_annotation(schema)
    except RecursionError:  # pragma: no cover - the walk is iterative; this would be a finding
        raise AssertionError("invalid_header_annotation recursed") from None
    if reason is None:
        arguments = {"a": text, "b": 1, "c": True}
        for name, value in streamable_http.param_headers(schema, arguments).items():
            assert streamable_http._TOKEN.fullmatch(name[len(streamable_http.PARAM_PREFIX):]), name
            assert _header_safe(value), value


# -- the control channel's framing ------------------------------------------------------------------------------


def frames(data: bytes) -> None:
    """The frame decoder: dict frames or ``FrameError`` only, buffers bounded by the cap, the same frames
    however the bytes are chunked, and accepted frames re-encode to the same bytes."""
    seed, body = (data[0], data[1:]) if data else (0, b"")

    def decode(chunks: list[bytes]) -> list[dict[str, object]] | None:
        decoder = framing.FrameDecoder(max_frame=FRAME_MAX)
        out: list[dict[str, object]] = []
        try:
            for chunk in chunks:
                decoder.feed(chunk)
                while (frame := decoder.next_frame()) is not None:
                    assert isinstance(frame, dict)
                    out.append(frame)
                assert len(decoder._buffer) <= FRAME_MAX + 4 + len(chunk)
            decoder.close()
        except framing.FrameError:
            return None
        return out

    whole = decode([body])
    chunked = decode(_chunks(body, seed))
    assert (whole is None) == (chunked is None)
    if whole is None:
        raise TargetRejected
    assert whole == chunked or json.dumps(whole, default=str) == json.dumps(chunked, default=str)
    for frame in whole:
        encoded = framing.encode_frame(frame, max_frame=4 * FRAME_MAX)
        redecoded = framing.FrameDecoder(max_frame=4 * FRAME_MAX)
        redecoded.feed(encoded)
        assert json.dumps(redecoded.next_frame(), default=str) == json.dumps(frame, default=str)


# -- the control socket's request line -----------------------------------------------------------------------


def ctl_request(data: bytes) -> None:
    """``parse_request``: a request object or a short reason, never an exception (deep nesting included)."""
    parsed = ctl.parse_request(data)
    if isinstance(parsed, str):
        assert len(parsed) <= 200, parsed
        json.dumps({"error": parsed})  # the answer can always be written
        raise TargetRejected
    assert isinstance(parsed.get("op"), str)
    json.dumps(parsed)  # anything accepted can be walked and written again
    assert jsontext.depth(parsed) <= jsontext.MAX_DEPTH


# -- A2A replies and requests -------------------------------------------------------------------------------------


def a2a_message(data: bytes) -> None:
    """An A2A peer's JSON (a card, a task result, a streamed event) or a served request's message: decoded
    with the network rule, then shaped; ``ValueError`` (``A2aShapeError`` is one) is the only refusal."""
    selector, body = (data[0] % 4, data[1:]) if data else (0, b"")
    try:
        obj = jsontext.loads(body, "replace")
        if selector == 0:
            card = a2a.parse_card(obj, "https://peer.example/")
            assert card.rpc_url
        elif selector == 1:
            outcome = a2a.render_outcome(a2a.parse_result(obj))
            assert len(outcome) <= 64 * len(body) + 4096
        elif selector == 2:
            a2a.parse_event(obj)
        else:
            a2a.render_parts([a2a.parse_part(p) for p in (obj if isinstance(obj, list) else [obj])])
    except ValueError:
        raise TargetRejected from None


TARGETS: Final[dict[str, Callable[[bytes], None]]] = {
    "jsonrpc_body": jsonrpc_body,
    "sse_stream": sse_stream,
    "sse_roundtrip": sse_roundtrip,
    "header_rules": header_rules,
    "frames": frames,
    "ctl_request": ctl_request,
    "a2a_message": a2a_message,
}
