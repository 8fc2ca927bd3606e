"""The supervisor's handle on a fork server: a pre-imported agentd process that forks subagent children.

The server's own program (its blocking loop) is agentd.child.forkserver; this module is the parent side.

Why: a re-exec pays the interpreter start plus every import on each spawn (trio alone ~165 ms; the loop's
path with httpx, jsonschema and the client ~0.5 s of CPU, more under load), far above the 250 ms
spawn-to-first-model-request target. The fork server is ``python -m agentd`` itself (``AGENT_SUBAGENT=1``
plus ``AGENTD_FORKSERVER=<fd>``): it imports the child's whole code path once, then forks a child per
spawn. It execs nothing, and runs no trio loop (it is a plain blocking loop), so forking it is safe.

Protocol, over a ``SOCK_SEQPACKET`` Unix socket pair (message boundaries for free):

- supervisor → server: ``{"env": {...}}`` with the child's stdin/stdout/stderr pipe ends as SCM_RIGHTS;
- server → supervisor: ``{"ready": pid}`` once, then ``{"spawned": pid}`` per request (always before
  that pid's exit notice), ``{"exited": pid, "returncode": n}`` as it reaps, ``{"error": text}``.

Every depth is forked: each forked child gets its own connection to the server (``AGENTD_FORKS=<fd>``,
the same protocol), and its nested supervisor asks there for the child's own children. The server forks
them from its pre-imported image (not from the asking child), reports their exits on that connection,
and hands each a pidfd of the child that asked: that child is its parent in the tree, which it watches and
dies with, while its Unix parent is the server. docs/design/forks.md has the measurements and the choice.

Orphan safety is a chain: the server exits when the supervisor does (it watches a pidfd of its parent;
``PR_SET_PDEATHSIG`` cannot be used there, since trio starts processes from a worker thread and the signal
follows the thread), every forked child dies with the server (``PR_SET_PDEATHSIG`` is sound there: the
server is single-threaded) and watches it too, and each child is its own session leader, so the kill
ladder's ``killpg`` works exactly as for a re-exec.
"""

from __future__ import annotations

import array
import collections
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from agentd.telemetry.events import EventLog

#: How long the server may go without answering any request before a launch gives up on it (re-exec).
_STALL = 10.0
#: The largest control message either side sends over the fork server's socket.
MESSAGE_SIZE = 1 << 16
#: In a forked child: the descriptor of its own connection to the fork server (its nested supervisor
#: forks the child's children there, so every depth of the tree is forked from the one pre-imported image).
FORKS_ENV = "AGENTD_FORKS"
#: Set to ``1`` for the fork server of a tree whose children journal their runs in a SQLite file: it warms
#: that code too before its first fork (agentd.child.forkserver).
JOURNAL_ENV = "AGENTD_FORKSERVER_JOURNAL"


@attrs.define(eq=False)
class ForkedProcess:
    """A child forked by the server: the subset of ``trio.Process`` the node and the ladder use."""

    pid: int
    stdin: trio.lowlevel.FdStream
    stdout: trio.lowlevel.FdStream
    stderr: trio.lowlevel.FdStream
    returncode: int | None = None
    _exited: trio.Event = attrs.field(factory=trio.Event)

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def _reaped(self, returncode: int) -> None:
        self.returncode = returncode
        self._exited.set()


@attrs.define(eq=False)
class _Pending:
    """A request sent to the server whose reply has not been read yet (None once the server is gone)."""

    reply: dict[str, Any] | None = None
    answered: trio.Event = attrs.field(factory=trio.Event)


class ForkServerGone(Exception):
    """The fork server is not running (it died, or never started); callers fall back to re-exec."""


@attrs.define(eq=False)
class ForkServer:
    sock: trio.socket.SocketType
    #: The server process when this supervisor started it; None for a forked child's own connection.
    proc: trio.Process | None
    log: EventLog
    #: Requests go out in the order their slots join ``_pending``; the server answers each connection's
    #: requests in order, so the n-th reply is the n-th slot's. Several spawns are in flight at once: the
    #: next request need not wait for the previous reply (the fork is the server's, the wait ours).
    _send_lock: trio.Lock = attrs.field(factory=trio.Lock)
    _pending: collections.deque[_Pending] = attrs.field(factory=collections.deque)
    #: Replies read so far: a launch waiting behind others times out only if this stops moving.
    _answers: int = 0
    _children: dict[int, ForkedProcess] = attrs.field(factory=dict)
    _early: dict[int, int] = attrs.field(factory=dict)
    #: Called once the server is gone (its socket closed): the supervisor's ``wait_until`` wakes.
    on_gone: Callable[[], None] = lambda: None
    #: The server's pid, as it said when ready.
    pid: int | None = None
    _gone: bool = False
    _scope: trio.CancelScope = attrs.field(factory=lambda: trio.CancelScope(shield=True))

    @property
    def gone(self) -> bool:
        return self._gone

    async def launch(self, env: Mapping[str, str]) -> ForkedProcess:
        if self._gone:
            raise ForkServerGone("the fork server is not running")
        pipes: list[tuple[int, int]] = []
        try:
            for _ in range(3):
                pipes.append(os.pipe())
        except OSError:  # out of descriptors (EMFILE): release the ones taken, the node reports the failure
            for pair in pipes:
                for fd in pair:
                    os.close(fd)
            raise
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        ours = [pipes[0][1], pipes[1][0], pipes[2][0]]
        request = json.dumps({"env": dict(env)}).encode()
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs))]
        try:
            try:
                # Shielded (and bounded): abandoning the exchange half-way would leave an untracked child
                # (its reply still lands in its own slot, never in another launch's).
                with trio.CancelScope(shield=True):
                    slot = _Pending()
                    async with self._send_lock:
                        self._pending.append(slot)
                        try:
                            with trio.fail_after(_STALL):
                                await self.sock.sendmsg([request], rights)
                        except BaseException:
                            self._pending.remove(slot)  # never sent: no reply will come for it
                            raise
                    # Requests queued ahead of this one are answered first: give up only when the server
                    # has answered nothing for a whole _STALL (a burst of hundreds waits its turn).
                    progress = -1
                    while not slot.answered.is_set():
                        if self._answers == progress:
                            raise trio.TooSlowError
                        progress = self._answers
                        with trio.move_on_after(_STALL):
                            await slot.answered.wait()
            except (OSError, trio.TooSlowError) as exc:
                raise ForkServerGone(f"fork server unreachable ({type(exc).__name__})") from None
            reply = slot.reply
            if reply is None:
                raise ForkServerGone("fork server unreachable (it closed the connection)")
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        if "spawned" not in reply:
            for fd in ours:
                os.close(fd)
            raise ForkServerGone(str(reply.get("error", "fork failed")))
        pid = int(reply["spawned"])
        child = ForkedProcess(pid, trio.lowlevel.FdStream(ours[0]), trio.lowlevel.FdStream(ours[1]),
                              trio.lowlevel.FdStream(ours[2]))
        self._children[pid] = child
        if pid in self._early:
            child._reaped(self._early.pop(pid))
        return child

    async def _read(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        with self._scope:
            try:
                while True:
                    data = await self.sock.recv(MESSAGE_SIZE)
                    if not data:
                        break
                    message = json.loads(data)
                    if "ready" in message and not started:
                        started = True
                        self.pid = int(message["ready"])
                        task_status.started()
                    elif "exited" in message:
                        pid, code = int(message["exited"]), int(message["returncode"])
                        child = self._children.pop(pid, None)
                        if child is None:
                            self._early[pid] = code
                        else:
                            child._reaped(code)
                    elif self._pending:
                        self._answers += 1
                        slot = self._pending.popleft()
                        slot.reply = message
                        slot.answered.set()
            except (OSError, trio.ClosedResourceError):
                pass
            finally:
                self._gone = True
                # The server is gone, so are its children (PDEATHSIG): nobody will report their exits.
                for child in self._children.values():
                    child._reaped(-signal.SIGKILL)
                self._children.clear()
                while self._pending:  # their launches fall back to re-exec
                    self._pending.popleft().answered.set()
                self.on_gone()
        if not started:
            raise ForkServerGone("the fork server exited before it was ready")

    async def aclose(self) -> None:
        """Stop the server (its remaining children die with it); bounded, call shielded."""
        self._scope.cancel()
        self.sock.close()
        if self.proc is None:
            return  # a child's connection: the server belongs to the root
        with trio.move_on_after(2.0):
            await self.proc.wait()
        if self.proc.returncode is None:
            self.proc.kill()
            with trio.move_on_after(2.0):
                await self.proc.wait()
        self._scope.cancel()


async def start_fork_server(nursery: trio.Nursery, *, env: Mapping[str, str], log: EventLog,
                            python: str = sys.executable, on_gone: Callable[[], None] = lambda: None,
                            journal: bool = False) -> ForkServer:
    """Start the server as a child of this process and wait until it has pre-imported everything (``journal``:
    the tree's children journal into a SQLite file)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        proc = await trio.lowlevel.open_process(
            [python, "-m", "agentd"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True,
            env={**env, "AGENT_SUBAGENT": "1", "AGENTD_FORKSERVER": str(theirs.fileno()),
                 "AGENTD_PARENT_PID": str(os.getpid()), **({JOURNAL_ENV: "1"} if journal else {})},
        )
    finally:
        theirs.close()
    server = ForkServer(trio.socket.from_stdlib_socket(ours), proc, log, on_gone=on_gone)
    try:
        with trio.fail_after(30):
            await nursery.start(server._read)
    except BaseException:
        with trio.CancelScope(shield=True):
            await server.aclose()
        raise
    return server


async def connect_fork_server(nursery: trio.Nursery, fd: int, *, log: EventLog,
                              on_gone: Callable[[], None] = lambda: None) -> ForkServer:
    """A forked child's handle on the tree's fork server, over the connection the server gave it at fork."""
    sock = socket.socket(fileno=fd)
    server = ForkServer(trio.socket.from_stdlib_socket(sock), None, log, on_gone=on_gone)
    try:
        with trio.fail_after(10):
            await nursery.start(server._read)
    except BaseException:
        with trio.CancelScope(shield=True):
            await server.aclose()
        raise
    return server
