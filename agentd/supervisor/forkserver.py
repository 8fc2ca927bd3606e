"""A fork server: a pre-imported agentd process that forks subagent children on request.

Why: a re-exec pays the interpreter start plus every import on each spawn (trio alone ~165 ms; the loop's
path with httpx, jsonschema and the client ~0.5 s of CPU, more under load), far above the 250 ms
spawn-to-first-model-request target. The fork server is ``python -m agentd`` itself (``AGENT_SUBAGENT=1``
plus ``AGENTD_FORKSERVER=<fd>``): it imports the child's whole code path once, then forks a child per
spawn. It execs nothing, and runs no trio loop (it is a plain blocking loop), so forking it is safe.

Protocol, over a ``SOCK_SEQPACKET`` Unix socket pair (message boundaries for free):

- supervisor → server: ``{"env": {...}}`` with the child's stdin/stdout/stderr pipe ends as SCM_RIGHTS;
- server → supervisor: ``{"ready": pid}`` once, then ``{"spawned": pid}`` per request (always before
  that pid's exit notice), ``{"exited": pid, "returncode": n}`` as it reaps, ``{"error": text}``.

Orphan safety is a chain: the server exits when the supervisor does (it watches a pidfd of its parent;
``PR_SET_PDEATHSIG`` cannot be used there, since trio starts processes from a worker thread and the signal
follows the thread), every forked child dies with the server (``PR_SET_PDEATHSIG`` is sound there: the
server is single-threaded) and watches it too, and each child is its own session leader, so the kill
ladder's ``killpg`` works exactly as for a re-exec.
"""

from __future__ import annotations

import array
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from agentd.events import EventLog

_MSG = 1 << 16


#: Everything a child's turn may touch, including what the daemon imports lazily per run: each import
#: here is time no forked child pays again.
PREIMPORT = (
    "agentd.daemon", "agentd.client", "agentd.intelligence", "agentd.secrets", "agentd.transport.http_client",
    "agentd.transport.tls",
    "agentd.supervisor.child", "agentd.supervisor.graph", "agentd.supervisor.loop_runner",
    "agentd.supervisor.scripted", "agentd.supervisor.supervisor", "agentd.supervisor.tools",
    "agentd.supervisor.wiring",
    # Imported lazily by httpx/httpcore on a client's first request (~15 ms of CPU in every child otherwise).
    "httpcore", "httpcore._backends.auto", "httpcore._backends.trio", "encodings.idna",
)


def _preimport() -> None:
    import importlib

    for name in PREIMPORT:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a partial build: the child imports lazily, as a re-exec would
    try:
        # cattrs generates its (un)structure hooks on first use: do it once here, not in every child.
        from agentd.config.model import Config
        from agentd.supervisor.wiring import config_from_wire, config_to_wire

        config_from_wire(config_to_wire(Config()))
    except Exception:  # a warm-up only: the child does the real work and reports failures
        pass
    try:
        # The public CA bundle (~30 ms of CPU to load): built here once, every forked child inherits it.
        from agentd.transport.tls import warm

        warm()
    except Exception:  # the child would build it itself
        pass


def serve_forks(sock_fd: int) -> int:
    """The fork server's main loop (blocking; no trio). Returns when the supervisor goes away."""
    from agentd.supervisor.child import _die_with_parent, _expected_parent, parent_pidfd

    _die_with_parent()
    _preimport()
    # Everything imported so far lives as long as the children: the collector in a child never needs to
    # scan it. Frozen objects cost a child no collection time and no copy-on-write faults from the
    # collector writing their headers (the fork server allocates little after this point).
    gc.collect()
    gc.freeze()
    parent_fd = parent_pidfd()
    sock = socket.socket(fileno=sock_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    if parent_fd is not None:
        selector.register(parent_fd, selectors.EVENT_READ)
    expected_parent = _expected_parent()

    def tell(obj: Mapping[str, Any]) -> bool:
        try:
            sock.send(json.dumps(obj).encode())
            return True
        except OSError:
            return False

    tell({"ready": os.getpid()})
    while True:
        events = selector.select(timeout=None if parent_fd is not None else 1.0)
        if parent_fd is None and os.getppid() != expected_parent:
            return 0
        for key, _ in events:
            if key.fileobj == parent_fd:
                return 0  # the supervisor is gone: our children follow via PDEATHSIG
            if key.fileobj is sock:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(sock, _MSG, 3)
                except OSError:
                    data, fds = b"", []
                if not data:
                    return 0  # the supervisor closed its end: our children follow us via PDEATHSIG
                if len(fds) != 3:
                    for fd in fds:
                        os.close(fd)
                    tell({"error": "spawn request without three descriptors"})
                    continue
                env = json.loads(data)["env"]
                pid = os.fork()
                if pid == 0:
                    _become_child(sock, selector, (wake_r, wake_w, *([] if parent_fd is None else [parent_fd])),
                                  fds, env)
                for fd in fds:
                    os.close(fd)
                tell({"spawned": pid})
            else:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    tell({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _become_child(sock: socket.socket, selector: selectors.BaseSelector, wake: tuple[int, ...],
                  fds: list[int], env: dict[str, str]) -> None:
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        selector.close()
        sock.close()
        for fd in wake:
            os.close(fd)
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        os.environ["AGENTD_PARENT_PID"] = str(os.getppid())
        os.environ["AGENTD_FORKED"] = "1"  # the fork server is single-threaded: PDEATHSIG is sound here
        from agentd.supervisor.child import child_main

        code = child_main()
    except BaseException:  # a forked child must never return into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# -- the supervisor's side -----------------------------------------------------------------------


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


class ForkServerGone(Exception):
    """The fork server is not running (it died, or never started); callers fall back to re-exec."""


@attrs.define(eq=False)
class ForkServer:
    sock: trio.socket.SocketType
    proc: trio.Process
    log: EventLog
    _lock: trio.Lock = attrs.field(factory=trio.Lock)
    _replies: tuple[trio.MemorySendChannel[dict[str, Any]], trio.MemoryReceiveChannel[dict[str, Any]]] = (
        attrs.field(factory=lambda: trio.open_memory_channel[dict[str, Any]](16)))
    _children: dict[int, ForkedProcess] = attrs.field(factory=dict)
    _early: dict[int, int] = attrs.field(factory=dict)
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
        try:
            async with self._lock:
                request = json.dumps({"env": dict(env)}).encode()
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs))]
                try:
                    # Shielded (and bounded): abandoning the exchange half-way would leave an untracked
                    # child and hand its "spawned" reply to the next launch.
                    with trio.CancelScope(shield=True), trio.fail_after(10):
                        await self.sock.sendmsg([request], rights)
                        reply = await self._replies[1].receive()
                except (OSError, trio.EndOfChannel, trio.TooSlowError) as exc:
                    raise ForkServerGone(f"fork server unreachable ({type(exc).__name__})") from None
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
                    data = await self.sock.recv(_MSG)
                    if not data:
                        break
                    message = json.loads(data)
                    if "ready" in message and not started:
                        started = True
                        task_status.started()
                    elif "exited" in message:
                        pid, code = int(message["exited"]), int(message["returncode"])
                        child = self._children.pop(pid, None)
                        if child is None:
                            self._early[pid] = code
                        else:
                            child._reaped(code)
                    else:
                        await self._replies[0].send(message)
            except (OSError, trio.ClosedResourceError):
                pass
            finally:
                self._gone = True
                # The server is gone, so are its children (PDEATHSIG): nobody will report their exits.
                for child in self._children.values():
                    child._reaped(-signal.SIGKILL)
                self._children.clear()
                self._replies[0].close()
        if not started:
            raise ForkServerGone("the fork server exited before it was ready")

    async def aclose(self) -> None:
        """Stop the server (its remaining children die with it); bounded, call shielded."""
        self._scope.cancel()
        self.sock.close()
        with trio.move_on_after(2.0):
            await self.proc.wait()
        if self.proc.returncode is None:
            self.proc.kill()
            with trio.move_on_after(2.0):
                await self.proc.wait()
        self._scope.cancel()


async def start_fork_server(nursery: trio.Nursery, *, env: Mapping[str, str], log: EventLog,
                            python: str = sys.executable) -> ForkServer:
    """Start the server as a child of this process and wait until it has pre-imported everything."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        proc = await trio.lowlevel.open_process(
            [python, "-m", "agentd"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True,
            env={**env, "AGENT_SUBAGENT": "1", "AGENTD_FORKSERVER": str(theirs.fileno()),
                 "AGENTD_PARENT_PID": str(os.getpid())},
        )
    finally:
        theirs.close()
    server = ForkServer(trio.socket.from_stdlib_socket(ours), proc, log)
    try:
        with trio.fail_after(30):
            await nursery.start(server._read)
    except BaseException:
        with trio.CancelScope(shield=True):
            await server.aclose()
        raise
    return server
