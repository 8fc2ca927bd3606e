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
from typing import Any

from agentd.child.parent import die_with_parent, expected_parent, parent_pidfd
from agentd.supervisor.forkserver import MESSAGE_SIZE

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
    die_with_parent()
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
    expected = expected_parent()

    def tell(obj: Mapping[str, Any]) -> bool:
        try:
            sock.send(json.dumps(obj).encode())
            return True
        except OSError:
            return False

    tell({"ready": os.getpid()})
    while True:
        events = selector.select(timeout=None if parent_fd is not None else 1.0)
        if parent_fd is None and os.getppid() != expected:
            return 0
        for key, _ in events:
            if key.fileobj == parent_fd:
                return 0  # the supervisor is gone: our children follow via PDEATHSIG
            if key.fileobj is sock:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(sock, MESSAGE_SIZE, 3)
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
        from agentd.child.session import session_main

        code = session_main()
    except BaseException:  # a forked child must never return into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
