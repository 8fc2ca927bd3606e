"""The fork server's own program: a pre-imported agentd process that forks subagent children on request.

Why: a re-exec pays the interpreter start plus every import on each spawn (trio alone ~165 ms; the loop's
path with httpx, jsonschema and the client ~0.5 s of CPU, more under load). The fork server is
``python -m agentd`` itself (``AGENT_SUBAGENT=1`` plus ``AGENTD_FORKSERVER=<fd>``): it imports the child's
whole code path once, then forks a child per spawn. It execs nothing and runs no trio loop (a plain blocking
loop), so forking it is safe. The supervisor's handle on it, and the protocol, are in
agentd.supervisor.forkserver.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import sys
from collections.abc import Mapping
from typing import Any, cast

from agentd.child.parent import PARENT_PIDFD_ENV, die_with_parent, expected_parent, parent_pidfd
from agentd.supervisor.forkserver import FORKS_ENV, MESSAGE_SIZE

#: Everything a child's turn may touch, including what the daemon imports lazily per run: each import
#: here is time no forked child pays again.
PREIMPORT = (
    "agentd.run", "agentd.client", "agentd.intelligence", "agentd.secrets", "agentd.transport.http_client",
    "agentd.transport.tls",
    "agentd.child.session", "agentd.child.turn", "agentd.child.scripted",
    "agentd.supervisor.graph", "agentd.supervisor.supervisor", "agentd.supervisor.tools",
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
        # cattrs generates its (un)structure hooks on first use: do it once here, not in every child. Twice:
        # generating the nested hooks clears cattrs' dispatch cache, and only the second pass leaves every
        # hook cached (one pass left ~20-90 ms of hook generation to each child's first Config).
        from agentd.config.model import Config
        from agentd.supervisor.wiring import config_from_wire, config_to_wire

        for _ in range(2):
            config_from_wire(config_to_wire(Config()))
    except Exception:  # a warm-up only: the child does the real work and reports failures
        pass
    try:
        # The control tools every real child offers: their input schemas are checked against the
        # meta-schema and compiled once here (the catalogue memoizes validators by schema), not in each
        # child's first turn (~25 ms of CPU, more than the rest of its start).
        from agentd.loop.builtin import resource_read_tool
        from agentd.loop.catalogue import build_catalogue
        from agentd.loop.control import ControlToolRegistry
        from agentd.supervisor.supervisor import Caller, Origin
        from agentd.supervisor.tools import register_subagent_tools

        registry = ControlToolRegistry()
        register_subagent_tools(registry, cast(Any, None), Caller(Origin.STDIO, "0"))  # only the schemas
        registry.register(resource_read_tool(cast(Any, None)))
        build_catalogue((), registry)
        # A run defers compiling a control tool's validator to the tool's first call (a once run that never
        # spawns skips jsonschema's import); a forked child must not pay it on its first spawn: compile here.
        from agentd.loop.catalogue import precompile

        precompile(tool.input_schema for tool in registry)
    except Exception:  # a warm-up only
        pass
    try:
        # The C library, loaded once (ctypes' load and symbol lookup are ~80 µs per use in each child).
        from agentd.child.parent import libc

        for name in ("prctl", "malloc_trim"):
            getattr(libc(), name)
    except (OSError, AttributeError):
        pass
    try:
        # The public CA bundle (~30 ms of CPU to load): built here once, every forked child inherits it.
        from agentd.transport.tls import warm

        warm()
    except Exception:  # the child would build it itself
        pass


#: Whole child sessions the server runs on itself before its first fork (see :func:`_rehearse`): enough for
#: CPython to quicken every function they run (8 runs) and specialise most of it; ~5 ms of CPU each.
REHEARSALS = 12


def _rehearse(times: int = REHEARSALS) -> None:
    """Run ``times`` whole child sessions here, each against a parent in the same loop, before the first fork.

    Why: CPython (3.11+) quickens and specialises a function's bytecode in place once it has run a few times,
    writing to its code object on each of those first runs. A forked child running the session's code for the
    first time would copy (copy-on-write) the page of every code object it runs and run it unspecialised;
    rehearsed here, every child inherits that code warm, trio's loop included. No model (the turn answers at
    once), no thread, no process; the pipes are closed before the first fork.
    """
    import trio

    from agentd.child.session import _child
    from agentd.supervisor.channel import ControlChannel
    from agentd.supervisor.messages import Inject, Ping, Result, RunPayload, Spawn

    async def turn(ctx: Any, message: str) -> Result:
        await ctx.progress("rehearsal")
        return Result(status="completed", result=message)

    async def one() -> None:
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        parent = ControlChannel(trio.lowlevel.FdStream(down_w), trio.lowlevel.FdStream(up_r))
        try:
            with trio.fail_after(5):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_child, down_r, up_w, None, turn)  # closes its ends when it returns
                    await parent.send(Spawn(RunPayload(handle="0.0", depth=1, instruction="rehearse", warm=True)))
                    for message in ("next", None):
                        while not isinstance(await parent.receive(), Result):
                            pass
                        if not parent.send_nowait(Ping(seq=1)):
                            await parent.send(Ping(seq=1))
                        await parent.receive()  # the pong
                        if message is None:
                            await parent.close_send()  # the session ends, as when its parent closes its stdin
                        else:
                            await parent.send(Inject(message=message))
        finally:
            await parent.send_stream.aclose()
            await parent.receive_stream.aclose()

    for _ in range(times):
        trio.run(one)


def serve_forks(sock_fd: int) -> int:
    """The fork server's main loop (blocking; no trio). Returns when the supervisor goes away."""
    die_with_parent()
    _preimport()
    try:
        _rehearse()
    except Exception:  # a warm-up only: each child runs the code cold instead
        pass
    # Everything imported so far lives as long as the children: the collector in a child never needs to
    # scan it. Frozen objects cost a child no collection time and no copy-on-write faults from the
    # collector writing their headers (the fork server allocates little after this point).
    gc.collect()
    gc.freeze()
    parent_fd = parent_pidfd()
    root = socket.socket(fileno=sock_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    selector = selectors.DefaultSelector()
    selector.register(root, selectors.EVENT_READ, None)
    selector.register(wake_r, selectors.EVENT_READ, None)
    if parent_fd is not None:
        selector.register(parent_fd, selectors.EVENT_READ, None)
    expected = expected_parent()
    #: Each forked child's own connection (it asks for its children there), by the child's pid.
    conns: dict[int, socket.socket] = {}
    #: Which connection asked for each live pid: where its exit is reported.
    asked_by: dict[int, socket.socket] = {}

    def tell(conn: socket.socket, obj: Mapping[str, Any]) -> bool:
        try:
            conn.send(json.dumps(obj).encode())
            return True
        except OSError:
            return False

    def drop(pid: int) -> None:
        conn = conns.pop(pid, None)
        if conn is not None:
            selector.unregister(conn)
            conn.close()

    tell(root, {"ready": os.getpid()})
    while True:
        events = selector.select(timeout=None if parent_fd is not None else 1.0)
        if parent_fd is None and os.getppid() != expected:
            return 0
        for key, _ in events:
            if key.fileobj == parent_fd:
                return 0  # the supervisor is gone: our children follow via PDEATHSIG
            if key.fileobj == wake_r:
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
                    drop(pid)
                    owner = asked_by.pop(pid, None)
                    if owner is not None and owner.fileno() >= 0:
                        tell(owner, {"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})
                continue
            conn = key.fileobj
            assert isinstance(conn, socket.socket)
            asker: int | None = key.data  # None: the supervisor that started us; else a forked child's pid
            try:
                data, fds, _flags, _addr = socket.recv_fds(conn, MESSAGE_SIZE, 3)
            except OSError:
                data, fds = b"", []
            if not data:
                for fd in fds:
                    os.close(fd)
                if asker is None:
                    return 0  # the supervisor closed its end: our children follow us via PDEATHSIG
                drop(asker)  # that child is ending; its own children watch it and end themselves
                continue
            reply = _fork_one(data, fds, asker, root, selector, (wake_r, wake_w), parent_fd, conns)
            if "spawned" in reply:
                asked_by[int(reply["spawned"])] = conn
            tell(conn, reply)


def _fork_one(data: bytes, fds: list[int], asker: int | None, root: socket.socket,
              selector: selectors.BaseSelector, wake: tuple[int, int], parent_fd: int | None,
              conns: dict[int, socket.socket]) -> dict[str, Any]:
    """Fork one child for a request; the reply to send back (``spawned`` or ``error``)."""
    try:
        env = json.loads(data)["env"]
        if len(fds) != 3 or not isinstance(env, dict):
            raise ValueError("a spawn request carries an env object and three descriptors")
    except (ValueError, KeyError, TypeError) as exc:
        for fd in fds:
            os.close(fd)
        return {"error": str(exc)[:200]}
    # The logical parent a nested child watches (and dies with): the forked child that asked. A pidfd of it,
    # taken while it is our unreaped child, cannot name a recycled pid.
    asker_fd: int | None = None
    mine = theirs = None
    try:
        if asker is not None:
            asker_fd = os.pidfd_open(asker)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.send(json.dumps({"ready": os.getpid()}).encode())  # waits in the buffer for the child
        pid = os.fork()
    except OSError as exc:
        for fd in (*fds, *([] if asker_fd is None else [asker_fd])):
            os.close(fd)
        for end in (mine, theirs):
            if end is not None:
                end.close()
        return {"error": f"fork failed: {exc.strerror or type(exc).__name__}"}
    if pid == 0:
        closing = [root.fileno(), *wake, *(c.fileno() for c in conns.values()), mine.fileno()]
        if parent_fd is not None:
            closing.append(parent_fd)
        _become_child(selector, closing, fds, env, theirs.detach(), asker, asker_fd)
    for fd in (*fds, *([] if asker_fd is None else [asker_fd])):
        os.close(fd)
    theirs.close()
    conns[pid] = mine
    selector.register(mine, selectors.EVENT_READ, pid)
    return {"spawned": pid}


def _become_child(selector: selectors.BaseSelector, closing: list[int], fds: list[int], env: dict[str, str],
                  forks_fd: int, asker: int | None, asker_fd: int | None) -> None:
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        selector.close()
        for fd in closing:
            try:
                os.close(fd)
            except OSError:
                pass
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        os.environ["AGENTD_FORKED"] = "1"  # the fork server is single-threaded: PDEATHSIG is sound here
        #: This child's own connection to the server: its nested supervisor forks its children there.
        os.environ[FORKS_ENV] = str(forks_fd)
        if asker is None:
            os.environ["AGENTD_PARENT_PID"] = str(os.getppid())
        else:  # forked for a child of the tree: that child is the parent this one watches
            os.environ["AGENTD_PARENT_PID"] = str(asker)
            os.environ[PARENT_PIDFD_ENV] = str(asker_fd)
        from agentd.child.session import session_main

        code = session_main()
    except BaseException:  # a forked child must never return into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
