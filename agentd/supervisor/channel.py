"""The trio adapter over the framing: typed control messages on a pair of byte streams.

The parent uses a child process's stdin/stdout; the child uses its own fds 0/1; tests use memory
streams. Sends are serialised by a lock because the pinger, the reader (answering admissions) and the
turn runner all write; a small frame (a ping, a pong) can also go out with :meth:`ControlChannel.send_nowait`,
a plain write with no task switch, when that can neither block nor split a frame. A peer that sends garbage,
oversized frames, or stops mid-frame makes :meth:`ControlChannel.receive` raise :class:`ChannelBroken` with a
reason that is safe to log.
"""

from __future__ import annotations

import errno
import os
import select
import stat

import attrs
import trio

from agentd.supervisor.framing import MAX_FRAME, FrameDecoder, FrameError, encode_frame, frame_of
from agentd.supervisor.messages import Message, MessageError, Ping, Pong, from_frame, to_frame

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
    #: Whether the send stream is a pipe's FdStream (None: not looked at yet); see :meth:`send_nowait`.
    _pipe: bool | None = attrs.field(init=False, default=None)
    #: Reads that returned data since the reader last waited (see :meth:`_receive_some`).
    _reads: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._decoder = FrameDecoder(max_frame=self.max_frame)

    async def send(self, message: Message) -> None:
        """Send one message. Raises ``trio.BrokenResourceError``/``ClosedResourceError`` if the pipe is gone."""
        data = _encode(message, self.max_frame)
        async with self._send_lock:
            await self.send_stream.send_all(data)

    def send_nowait(self, message: Message) -> bool:
        """Send a small message now, without waiting; False when it must go through :meth:`send` instead.

        Only on a pipe (the child process's stdin, the child's own stdout), only while no other send holds
        the channel, and only for a frame of at most ``PIPE_BUF`` bytes: such a write is atomic, so the frame
        is written whole or not at all (a full pipe). Saves the lock, the stream's checkpoint and a task
        switch per ping and pong. Raises like :meth:`send` if the pipe is gone.
        """
        if self._pipe is None:
            self._pipe = _is_pipe(self.send_stream)
        if not self._pipe or self._send_lock.locked():
            return False
        data = _seq_frame(message, self.max_frame) or _encode(message, self.max_frame)
        if len(data) > select.PIPE_BUF:
            return False
        assert isinstance(self.send_stream, trio.lowlevel.FdStream)
        fd = self.send_stream.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("the channel is closed")
        try:
            os.write(fd, data)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno == errno.EBADF:
                raise trio.ClosedResourceError("the channel is closed") from None
            raise trio.BrokenResourceError from exc
        return True

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
            data = await self._receive_some()
            if not data:
                self._eof = True
                try:
                    self._decoder.close()
                except FrameError as exc:
                    raise ChannelBroken(f"bad frame: {exc}") from None
            else:
                self._decoder.feed(data)

    async def _receive_some(self) -> bytes | bytearray:
        """The next bytes from the peer, b"" at the end.

        On a descriptor the read is tried first and the reader waits only when nothing is there: a frame that
        wakes it costs one task step, not the stream's checkpoint and a second step. A peer that keeps the
        pipe full still lets the other tasks run: the reader checkpoints every second read that did not wait.
        """
        stream = self.receive_stream
        if not isinstance(stream, trio.lowlevel.FdStream):
            try:
                return await stream.receive_some(_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return b""
        if self._reads >= 2:
            self._reads = 0
            await trio.lowlevel.checkpoint()
        while True:
            fd = stream.fileno()
            if fd < 0:
                return b""
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_readable(fd)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return b""
                self._reads = 0
                continue
            except OSError:
                return b""
            self._reads += 1
            return data

    async def close_send(self) -> None:
        """Close our sending side (the peer sees EOF). Idempotent; never raises on a dead pipe.

        Deliberately not under the send lock: a send blocked on a peer that stopped reading must not
        keep the kill ladder from closing the pipe (closing it wakes that send with an error).
        """
        try:
            await self.send_stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _is_pipe(stream: trio.abc.SendStream) -> bool:
    if not isinstance(stream, trio.lowlevel.FdStream):
        return False
    fd = stream.fileno()
    try:
        return fd >= 0 and stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def _encode(message: Message, max_frame: int) -> bytes:
    try:
        return encode_frame(to_frame(message), max_frame=max_frame)
    except TypeError:  # an attrs value inside a field: converted as attrs.asdict does
        return encode_frame(to_frame(message, deep=True), max_frame=max_frame)


def _seq_frame(message: Message, max_frame: int) -> bytes | None:
    """A ping's or pong's frame from a template (every idle ping: ~1 µs, not ~10 for attrs + json); None for
    any other message. The bytes are exactly :func:`encode_frame` of :func:`to_frame`."""
    if (type(message) is Ping or type(message) is Pong) and type(message.seq) is int:
        body = b'{"jsonrpc":"2.0","method":"%s","params":{"seq":%d}}' % (message.METHOD.encode(), message.seq)
        return frame_of(body, max_frame=max_frame)
    return None
