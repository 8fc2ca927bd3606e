"""Server-sent events: an incremental decoder and an encoder, per the WHATWG event-stream format.

The decoder takes bytes in arbitrary chunks and yields complete events. It accepts LF, CRLF and CR line
ends (sse-starlette uses CRLF), skips ``:`` comments (keepalives), joins multi-line ``data``, and keeps
``id`` and ``retry`` even on events with empty data (2025-11-25 *priming* events), which callers must not
JSON-parse. An event larger than ``max_event_bytes`` raises :class:`SseError` instead of growing forever.
"""

from __future__ import annotations

from typing import Final

import attrs

DEFAULT_MAX_EVENT_BYTES: Final = 16 * 1024 * 1024


class SseError(ValueError):
    """The stream broke the format or a size limit."""


@attrs.frozen
class SseEvent:
    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SseDecoder:
    """Feed bytes with :meth:`feed`; it returns the events completed by them."""

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._buffer = b""
        self._data: list[str] = []
        self._data_size = 0
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._saw_field = False
        self._first = True
        #: The last event id seen on this stream (what ``Last-Event-ID`` should carry).
        self.last_event_id: str | None = None
        #: The last ``retry`` value seen, in milliseconds.
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        self._buffer += chunk
        if self._first and self._buffer:
            if len(self._buffer) < 3 and b"\xef\xbb\xbf".startswith(self._buffer):
                return []
            if self._buffer.startswith(b"\xef\xbb\xbf"):
                self._buffer = self._buffer[3:]
            self._first = False
        events: list[SseEvent] = []
        while True:
            line, found = self._take_line()
            if not found:
                break
            event = self._line(line)
            if event is not None:
                events.append(event)
        if len(self._buffer) > self._max:
            raise SseError(f"an SSE line exceeds {self._max} bytes")
        return events

    def pending(self) -> bool:
        """True when a partial event is buffered (a stream that ends now was truncated)."""
        return bool(self._buffer.strip()) or self._saw_field

    def _take_line(self) -> tuple[bytes, bool]:
        buf = self._buffer
        cr = buf.find(b"\r")
        lf = buf.find(b"\n")
        if cr == -1 and lf == -1:
            return b"", False
        if cr != -1 and (lf == -1 or cr < lf):
            if cr + 1 == len(buf):
                # A CR at the end may be half of a CRLF: wait for the next byte.
                return b"", False
            end = cr + 2 if buf[cr + 1 : cr + 2] == b"\n" else cr + 1
            line = buf[:cr]
        else:
            end = lf + 1
            line = buf[:lf]
        self._buffer = buf[end:]
        return line, True

    def _line(self, raw: bytes) -> SseEvent | None:
        if not raw:
            return self._dispatch()
        if raw.startswith(b":"):
            return None
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SseError("an SSE line is not UTF-8") from None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._saw_field = True
            self._data.append(value)
            self._data_size += len(value) + 1
            if self._data_size > self._max:
                raise SseError(f"an SSE event exceeds {self._max} bytes")
        elif name == "event":
            self._saw_field = True
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._saw_field = True
                self._id = value
                self.last_event_id = value
        elif name == "retry" and value.isdigit():
            self._saw_field = True
            self._retry = int(value)
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> SseEvent | None:
        if not self._saw_field:
            return None
        event = SseEvent(
            data="\n".join(self._data), event=self._event or "message", id=self._id, retry=self._retry
        )
        self._data = []
        self._data_size = 0
        self._event = ""
        self._id = None
        self._retry = None
        self._saw_field = False
        return event


def encode_event(data: str, *, id: str | None = None, event: str | None = None, retry: int | None = None) -> bytes:
    """One SSE event. ``data`` may hold newlines; each becomes its own ``data:`` line."""
    parts: list[str] = []
    if event:
        parts.append(f"event: {event}\n")
    if id is not None:
        parts.append(f"id: {id}\n")
    if retry is not None:
        parts.append(f"retry: {retry}\n")
    for line in data.split("\n"):
        parts.append(f"data: {line}\n")
    parts.append("\n")
    return "".join(parts).encode()


def encode_comment(text: str = "") -> bytes:
    """A comment line, used as a keepalive."""
    return f": {text}\n\n".encode()
