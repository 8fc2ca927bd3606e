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
import select
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
    "agentd.run", "agentd.client", "agentd.intelligence", "agentd.intelligence.failover",
    "agentd.intelligence.gateway", "agentd.backoff", "agentd.security.secrets", "agentd.transport.http_client",
    "agentd.transport.tls",
    "agentd.child.session", "agentd.child.turn", "agentd.child.scripted",
    "agentd.supervisor.graph", "agentd.supervisor.supervisor", "agentd.supervisor.tools",
    "agentd.supervisor.wiring",
    # A child of a tree with a state directory journals its own run (sqlite3 and the recorder, ~6 ms of CPU).
    "agentd.journal.sqlite", "agentd.journal.recorder",
    # ... and drops its run's budget books at its end (~4 ms of CPU to import in every child).
    "agentd.journal.ledger",
    # httpcore (its trio backend is the one agentd passes its pools) and what httpx imports on a first request.
    "httpcore", "encodings.idna",
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
        from agentd.agent.builtin import resource_read_tool
        from agentd.agent.catalogue import build_catalogue
        from agentd.agent.control import ControlToolRegistry
        from agentd.supervisor.supervisor import Caller, Origin
        from agentd.supervisor.tools import register_subagent_tools

        registry = ControlToolRegistry()
        register_subagent_tools(registry, cast(Any, None), Caller(Origin.STDIO, "0"))  # only the schemas
        registry.register(resource_read_tool(cast(Any, None)))
        build_catalogue((), registry)
        # A run defers compiling a control tool's validator to the tool's first call (a once run that never
        # spawns skips jsonschema's import); a forked child must not pay it on its first spawn: compile here.
        from agentd.agent.catalogue import precompile

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


def _rehearse_journal(times: int = REHEARSALS) -> None:
    """Run ``times`` journaled runs' commits here (a tree with a state directory: each child journals its run).

    Why: as :func:`_rehearse`, for the code a journaled child runs and an unjournaled one does not (the
    recorder, the store, the group commit, the records' encoding, SQLite's statements), so that every child
    inherits it quickened instead of copying and warming it; and SQLite's own one-time set-up is done. On a
    throwaway file, its calls on the trio thread (no thread may be running at a fork).
    """
    import tempfile

    import trio

    from agentd.journal.recorder import RunRecorder, config_digest
    from agentd.journal.records import RunStarted
    from agentd.journal.sqlite import JournalFile, SqliteJournal, Worker, db_path
    from agentd.telemetry.events import Redactor

    redactor = Redactor()
    redactor.add("rehearsal-secret")
    reply = {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "subagent_status",
                                                                         "arguments": '{"handle": "0.1"}'}}]}

    async def one(state: str, n: int) -> None:
        journal = SqliteJournal(JournalFile(db_path(state), checked=True), Worker(thread=False), redactor=redactor)
        try:
            recorder = RunRecorder(journal, f"rehearsal/{n}", parent_commits_end=True)  # a run's child, mostly
            await recorder.started(RunStarted(config_digest({"n": n}), "rehearse", None, "rehearsal"), deferred=True)
            await recorder.replied(1, reply, 10, 2)
            await recorder.observed(1, "c1", True, "ok")
            await recorder.replied(2, {"role": "assistant", "content": "done"}, 12, 1)
            await recorder.ended("completed", {"status": "completed", "result": "done"}, None)
        finally:
            await journal.aclose()

    # On a memory file system where there is one: the rehearsal's flushes cost nothing there.
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as state:
        JournalFile(db_path(state)).close()  # created and checked, as the root does before any child
        for n in range(times):
            trio.run(one, state, n)


#: ``madvise`` advice (Linux >= 6.1): collapse a range into transparent huge pages now, whatever the sysfs mode.
_MADV_COLLAPSE = 25
_HUGE = 1 << 21


def _huge_pages() -> int:
    """Back the server's anonymous memory with 2 MiB pages where it covers whole aligned 2 MiB ranges; how
    many ranges it collapsed.

    Why: ``fork()`` copies one page-table entry per resident 4 KiB page (~7000 for the server's ~28 MiB
    heap, most of its CPU per spawn); a huge page is copied as one entry. A child's first write into one
    splits that entry back into 4 KiB ones (in the child only) and copies just the 4 KiB page it wrote, as
    before. ``MADV_COLLAPSE`` is a one-time synchronous advice (it marks nothing: later faults, in the server or
    a child, get ordinary pages); where the kernel lacks it, nothing changes.
    """
    import ctypes

    from agentd.child.parent import libc

    try:
        madvise = libc().madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except (OSError, AttributeError):
        return 0
    collapsed = 0
    for line in lines:
        fields = line.split()
        if len(fields) > 6 or (len(fields) == 6 and fields[5] != "[heap]") or not fields[1].startswith("rw"):
            continue  # a file, the stack or a special mapping: only the heap and anonymous memory
        low, high = (int(part, 16) for part in fields[0].split("-"))
        start, end = (low + _HUGE - 1) & ~(_HUGE - 1), high & ~(_HUGE - 1)
        if end > start and madvise(start, end - start, _MADV_COLLAPSE) == 0:
            collapsed += (end - start) // _HUGE
    return collapsed


def serve_forks(sock_fd: int) -> int:
    """The fork server's main loop (blocking; no trio). Returns when the supervisor goes away."""
    die_with_parent()
    _preimport()
    from agentd.supervisor.forkserver import JOURNAL_ENV

    try:
        _rehearse()
        if os.environ.pop(JOURNAL_ENV, None) == "1":
            _rehearse_journal()
    except Exception:  # a warm-up only: each child runs the code cold instead
        pass
    # A forked child is its own session (no terminal's Ctrl-C reaches it) and is stopped by the kill ladder
    # (SIGTERM, then SIGKILL): with SIGINT at its default, trio's run in each child skips installing its
    # KeyboardInterrupt handler (~0.15 ms of each child's start). Inherited at fork; the server itself stops
    # on SIGINT as before.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # Everything imported so far lives as long as the children: the collector in a child never needs to
    # scan it. Frozen objects cost a child no collection time and no copy-on-write faults from the
    # collector writing their headers (the fork server allocates little after this point).
    gc.collect()
    gc.freeze()
    _huge_pages()
    parent_fd = parent_pidfd()
    root = socket.socket(fileno=sock_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    # A bare epoll, not the selectors module: every page the loop writes between two forks is copied, and
    # selectors' Python layers (keys, lookups) were a tenth of those pages.
    poller = select.epoll()
    #: What each watched descriptor is: a connection and who asked on it (None: the supervisor that
    #: started us, else the forked child's pid), or None for the wake-up pipe and the parent's pidfd.
    watched: dict[int, tuple[socket.socket, int | None] | None] = {root.fileno(): (root, None), wake_r: None}
    if parent_fd is not None:
        watched[parent_fd] = None
    for fd in watched:
        poller.register(fd, select.EPOLLIN)
    #: The highest descriptor the server has opened so far: a child closes the server's up to it (a bound, so
    #: that where ``close_range`` is missing ``os.closerange`` does not walk the whole descriptor limit).
    top = max(*watched, wake_w, poller.fileno())
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
            poller.unregister(conn)
            del watched[conn.fileno()]
            conn.close()

    ready = json.dumps({"ready": os.getpid()}).encode()  # the same greeting for every forked child
    envs = _Environments()
    root.send(ready)
    while True:
        events = poller.poll(-1 if parent_fd is not None else 1.0)
        if parent_fd is None and os.getppid() != expected:
            return 0
        for ready_fd, _ in events:
            if ready_fd == parent_fd:
                return 0  # the supervisor is gone: our children follow via PDEATHSIG
            if ready_fd == wake_r:
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
            entry = watched.get(ready_fd)
            if entry is None:
                continue  # dropped earlier in this batch
            conn, asker = entry
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
            forked = _fork_one(data, fds, asker, ready, envs, poller, watched, conns, top)
            if isinstance(forked, str):
                tell(conn, {"error": forked})
                continue
            asked_by[forked] = conn
            top = max(top, conns[forked].fileno())
            try:
                conn.send(b'{"spawned": %d}' % forked)  # what tell() would send, without the encoder
            except OSError:
                pass


def _fork_one(data: bytes, fds: list[int], asker: int | None, ready: bytes, envs: _Environments,
              poller: select.epoll, watched: dict[int, tuple[socket.socket, int | None] | None],
              conns: dict[int, socket.socket], top: int) -> int | str:
    """Fork one child for a request: its pid, or why not (the ``error`` reply's text).

    Every page this writes between two forks is copied (copy-on-write) while the last child shares it: the
    replies are pre-encoded and the child's descriptors are closed by range, not by walking the server's.
    """
    try:
        if len(fds) != 3:
            raise ValueError("a spawn request carries an env object and three descriptors")
        change = envs.change(data)
    except (ValueError, KeyError, TypeError) as exc:
        for fd in fds:
            os.close(fd)
        return str(exc)[:200]
    # The logical parent a nested child watches (and dies with): the forked child that asked. A pidfd of it,
    # taken while it is our unreaped child, cannot name a recycled pid.
    asker_fd: int | None = None
    mine = theirs = None
    try:
        if asker is not None:
            asker_fd = os.pidfd_open(asker)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.send(ready)  # waits in the buffer for the child
        pid = os.fork()
    except OSError as exc:
        for fd in (*fds, *([] if asker_fd is None else [asker_fd])):
            os.close(fd)
        for end in (mine, theirs):
            if end is not None:
                end.close()
        return f"fork failed: {exc.strerror or type(exc).__name__}"
    if pid == 0:
        highest = max(top, *fds, mine.fileno(), theirs.fileno(), asker_fd or 0)
        _become_child(fds, change, theirs.detach(), asker, asker_fd, highest)
    for fd in (*fds, *([] if asker_fd is None else [asker_fd])):
        os.close(fd)
    theirs.close()
    conns[pid] = mine
    watched[mine.fileno()] = (mine, pid)
    poller.register(mine, select.EPOLLIN)
    return pid


def _close_all_but(keep: tuple[int, ...], top: int) -> None:
    """Close every descriptor from 3 to ``top`` except ``keep``: the server's own (its sockets to the
    supervisor and to every other forked child, its poller, its wake-up pipe, the parent's pidfd) and the pipe
    ends just moved to 0-2. A few ``close_range`` calls (Linux >= 5.9) whatever the number of live children,
    and no Python object of the server touched (closing each by name cost each child ~1 µs and a copied page
    per sibling)."""
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, top + 1)


#: What a child changes in the server's environment to get the one asked for: the names to remove, the
#: variables to set.
EnvChange = tuple[tuple[str, ...], dict[str, str]]


class _Environments:
    """The environment change each request asks for, kept for the last request body seen: a supervisor sends
    the same environment with every spawn, so a burst decodes it once, and each child applies the few
    differences from the server's own environment instead of rebuilding ``os.environ`` (~0.3 ms of each
    child's start, most of it ``os.environ``'s Python layers and the pages they touch)."""

    def __init__(self) -> None:
        self._last: tuple[bytes, EnvChange] | None = None

    def change(self, data: bytes) -> EnvChange:
        """The change for a request body; raises ValueError, KeyError or TypeError for a malformed one."""
        if self._last is not None and self._last[0] == data:
            return self._last[1]
        env = json.loads(data)["env"]
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("a spawn request carries an env object of strings and three descriptors")
        ours = dict(os.environ)
        change = (tuple(k for k in ours if k not in env), {k: v for k, v in env.items() if ours.get(k) != v})
        self._last = (data, change)
        return change


def _become_child(fds: list[int], change: EnvChange, forks_fd: int, asker: int | None,
                  asker_fd: int | None, top: int) -> None:
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):  # the server's own 0-2 are /dev/null: every received end is above 2
            os.dup2(fd, target)
        _close_all_but((forks_fd, *(() if asker_fd is None else (asker_fd,))), top)
        os.setsid()
        drop, put = change  # os.environ becomes exactly the environment asked for
        for name in drop:
            del os.environ[name]
        os.environ.update(put)
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
