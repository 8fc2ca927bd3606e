"""The control channel's framing, sans-io: a 4-byte big-endian length, then that many bytes of JSON.

Frames are JSON objects and are capped at :data:`MAX_FRAME` (16 MiB). The decoder is fed raw bytes and
hands back whole objects; anything else (an oversized length, bytes that are not a JSON object, a stream
that ends inside a frame) is a :class:`FrameError`, which the side that reads treats as a broken peer.
No I/O here: :mod:`agentd.supervisor.channel` is the trio adapter.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final

from agentd.formats import jsontext as json_text

MAX_FRAME: Final = 16 * 1024 * 1024
_HEADER: Final = struct.Struct(">I")


class FrameError(ValueError):
    """The byte stream is not a valid sequence of frames. Never carries the frame's content."""


def encode_frame(obj: Mapping[str, Any], *, max_frame: int = MAX_FRAME) -> bytes:
    """One frame for ``obj``; refuses to build a frame the peer would have to reject."""
    return frame_of(json_text.compact_utf8(obj), max_frame=max_frame)  # dumps_utf8's bytes, one encoder


def frame_of(body: bytes, *, max_frame: int = MAX_FRAME) -> bytes:
    """The frame carrying ``body``, a JSON object already encoded (UTF-8)."""
    if len(body) > max_frame:
        raise FrameError(f"frame of {len(body)} bytes exceeds the {max_frame}-byte cap")
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental decoder: :meth:`feed` bytes, then call :meth:`next_frame` until it returns None."""

    def __init__(self, *, max_frame: int = MAX_FRAME) -> None:
        self._max_frame = max_frame
        self._buffer = bytearray()
        self._need: int | None = None

    def feed(self, data: bytes | bytearray) -> None:
        self._buffer += data

    def next_frame(self) -> dict[str, Any] | None:
        if self._need is None:
            if len(self._buffer) < _HEADER.size:
                return None
            (length,) = _HEADER.unpack_from(self._buffer)
            if length > self._max_frame:
                # Checked before buffering the body, so a hostile length cannot make us allocate 4 GiB.
                raise FrameError(f"frame length {length} exceeds the {self._max_frame}-byte cap")
            del self._buffer[: _HEADER.size]
            self._need = length
        if len(self._buffer) < self._need:
            return None
        body = bytes(self._buffer[: self._need])
        del self._buffer[: self._need]
        self._need = None
        try:
            obj = json_text.loads(body, "replace")
        except ValueError:
            raise FrameError(f"frame of {len(body)} bytes is not valid JSON") from None
        if not isinstance(obj, dict):
            raise FrameError("frame is not a JSON object")
        return obj

    def close(self) -> None:
        """The stream ended: fine at a frame boundary, a :class:`FrameError` inside a frame."""
        if self._buffer or self._need is not None:
            raise FrameError("stream ended inside a frame")
