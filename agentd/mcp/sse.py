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
_BOM: Final = b"\xef\xbb\xbf"


class SseError(ValueError):
    """The stream broke the format or a size limit."""


@attrs.frozen
class SseEvent:
    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SseDecoder:
    """Feed bytes with :meth:`feed`; it returns the events completed by them.

    The work is linear in the bytes fed, however they are chunked: unconsumed input stays in one
    ``bytearray`` read from an offset (compacted once the consumed part is at least half of it), and the
    search for a line end resumes where the previous search stopped instead of rescanning a long line.
    """

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._buffer = bytearray()
        #: Where the unconsumed input starts in ``_buffer``.
        self._start = 0
        #: ``_buffer[_start:_scanned]`` is known to hold no line end.
        self._scanned = 0
        #: The next LF at or after ``_scanned`` (-1: none in ``_buffer[:_lf_searched]``).
        self._lf = -1
        self._lf_searched = 0
        #: Bytes searched, copied out as lines or moved by compaction: what the linear-work test bounds.
        self._work = 0
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
        if self._first and len(self._buffer) > self._start:
            head = bytes(self._buffer[self._start : self._start + 3])
            if len(head) < 3 and _BOM.startswith(head):
                return []
            if head == _BOM:
                self._start = self._scanned = self._lf_searched = self._start + 3
            self._first = False
        events: list[SseEvent] = []
        while True:
            line = self._take_line()
            if line is None:
                break
            event = self._line(line)
            if event is not None:
                events.append(event)
        if self._start and self._start * 2 >= len(self._buffer):
            self._work += len(self._buffer) - self._start
            del self._buffer[: self._start]
            self._scanned -= self._start
            self._lf_searched = max(0, self._lf_searched - self._start)
            self._lf = -1 if self._lf == -1 else self._lf - self._start
            self._start = 0
        if len(self._buffer) - self._start > self._max:
            raise SseError(f"an SSE line exceeds {self._max} bytes")
        return events

    def pending(self) -> bool:
        """True when a partial event is buffered (a stream that ends now was truncated)."""
        return bool(self._buffer[self._start :].strip()) or self._saw_field

    def _take_line(self) -> bytearray | None:
        """The next complete line (without its end), or None until more input arrives.

        Two ``find`` calls (memchr) per line: the next LF is searched once and remembered, and a CR is
        looked for only before it, so no byte is searched twice for the same character.
        """
        buf, pos = self._buffer, self._scanned
        lf = self._lf
        if lf < pos:  # no LF known ahead: search the part not searched yet
            origin = max(pos, self._lf_searched)
            lf = buf.find(b"\n", origin)
            self._lf_searched = len(buf) if lf == -1 else lf
            self._work += self._lf_searched - origin
            self._lf = lf
        limit = len(buf) if lf == -1 else lf
        cr = buf.find(b"\r", pos, limit)
        self._work += (limit if cr == -1 else cr) - pos
        if cr != -1:
            if cr + 1 == len(buf):
                # A CR at the end may be half of a CRLF: wait for the next byte.
                self._scanned = cr
                return None
            at, end = cr, (cr + 2 if cr + 1 == lf else cr + 1)
        elif lf != -1:
            at, end = lf, lf + 1
        else:
            self._scanned = len(buf)
            return None
        line = buf[self._start : at]  # one copy; the buffer itself may be compacted later
        self._work += len(line)
        self._start = self._scanned = end
        return line

    def _line(self, raw: bytearray) -> SseEvent | None:
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
