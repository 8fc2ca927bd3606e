"""The trio adapter over the framing: typed control messages on a pair of byte streams.

The parent uses a child process's stdin/stdout; the child uses its own fds 0/1; tests use memory
streams. Sends are serialised by a lock because the pinger, the reader (answering admissions) and the
turn runner all write. A peer that sends garbage, oversized frames, or stops mid-frame makes
:meth:`ControlChannel.receive` raise :class:`ChannelBroken` with a reason that is safe to log.
"""

from __future__ import annotations

import attrs
import trio

from agentd.supervisor.framing import MAX_FRAME, FrameDecoder, FrameError, encode_frame
from agentd.supervisor.messages import Message, MessageError, from_frame, to_frame

_CHUNK = 65536


class ChannelBroken(Exception):
    """The peer broke the framing or the message shapes; ``reason`` is loggable (no content)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@attrs.define(eq=False)
class ControlChannel:
    send_stream: trio.abc.SendStream
    receive_stream: trio.abc.ReceiveStream
    max_frame: int = MAX_FRAME
    _decoder: FrameDecoder = attrs.field(init=False)
    _send_lock: trio.Lock = attrs.field(init=False, factory=trio.Lock)
    _eof: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._decoder = FrameDecoder(max_frame=self.max_frame)

    async def send(self, message: Message) -> None:
        """Send one message. Raises ``trio.BrokenResourceError``/``ClosedResourceError`` if the pipe is gone."""
        data = encode_frame(to_frame(message), max_frame=self.max_frame)
        async with self._send_lock:
            await self.send_stream.send_all(data)

    async def receive(self) -> Message | None:
        """The next message, or None at a clean end of stream."""
        while True:
            try:
                frame = self._decoder.next_frame()
                if frame is not None:
                    return from_frame(frame)
                if self._eof:
                    return None
            except FrameError as exc:
                raise ChannelBroken(f"bad frame: {exc}") from None
            except MessageError as exc:
                raise ChannelBroken(f"bad message: {exc}") from None
            try:
                data = await self.receive_stream.receive_some(_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self._eof = True
                try:
                    self._decoder.close()
                except FrameError as exc:
                    raise ChannelBroken(f"bad frame: {exc}") from None
            else:
                self._decoder.feed(data)

    async def close_send(self) -> None:
        """Close our sending side (the peer sees EOF). Idempotent; never raises on a dead pipe.

        Deliberately not under the send lock: a send blocked on a peer that stopped reading must not
        keep the kill ladder from closing the pipe (closing it wakes that send with an error).
        """
        try:
            await self.send_stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
