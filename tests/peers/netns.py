"""Several hosts on this one machine: Linux network namespaces on a private bridge, for multi-host tests.

``async with network(n) as net`` (or ``hosts(n)`` for just the hosts) creates ``n`` hosts, each a network namespace with its own loopback and one
``eth0`` (a veth pair) plugged into a bridge that lives in a namespace of its own (the "switch"), so nothing
is bridged through the root namespace and its firewall. Hosts get ``10.A.B.2``, ``10.A.B.3``, ... on one /24.
With ``root_link=True`` the root namespace (this test process) is a host on that network too, at
``net.root_addr`` (``10.A.B.1``): a service the test runs there (a database, a model gateway) bound to that
address is reached over the veths, so cutting a host's link cuts it off from that service as well.

Per host (:class:`Host`): ``name`` (the namespace), ``addr``, ``exec_prefix`` (``ip netns exec NAME``),
``run(argv, env)`` (a process inside the namespace in its own process group, SIGKILLed as a group when the
block ends), ``listen_socket(port)`` (a socket bound inside the namespace, made by this process through
``setns(2)`` on the calling thread and switched straight back), ``forward(port)`` (a port on the host's
loopback that this process relays to ``127.0.0.1:port`` of the root namespace: for a service every host
needs even while its link is cut, such as a scripted model gateway), and ``link_down()``/``link_up()``
(the switch side of its cable: packets are silently dropped both ways, like a pulled cable or a partition,
so peers see silence and time-outs, not resets).

Names carry this process's pid and a counter (``agentd-nt-<pid>-<k>-h0``), so parallel xdist workers and
concurrent runs never share one. The block's end removes everything, also when the test fails: processes in
the namespaces are SIGKILLed, then the namespaces are deleted (which deletes their veths and the bridge).
:func:`cleanup_stale` removes leftovers of runs that were killed outright (names whose pid is dead) and runs
before each new network.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and ``ip`` (iproute2). :func:`unavailable` says why not;
:func:`require` skips a test with that reason, or fails it under ``scripts/test``
(``AGENTD_TEST_REQUIRE_NETNS=1``), where the namespace tests must run.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import zlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import attrs
import pytest
import trio

PREFIX = "agentd-nt-"
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")
_NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000
_IP_TIMEOUT = 10.0
#: Test networks live in this private range (:func:`_subnet`).
RANGE = "10.64.0.0/10"
#: The config-file section an agentd that connects to a host on a test network needs: private addresses are
#: refused to operator endpoints unless ``egress.allow`` names them (docs/security.md).
EGRESS_ALLOW = f"egress:\n  allow: [{RANGE}]"
_counter = itertools.count()


@functools.cache
def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can (probed once per process)."""
    if shutil.which("ip") is None:
        return "network namespaces unavailable: no `ip` (iproute2) on PATH"
    if os.geteuid() != 0:
        return "network namespaces unavailable: needs root (CAP_NET_ADMIN) for `ip netns`"
    probe = f"{PREFIX}{os.getpid()}-probe"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=_IP_TIMEOUT,
                          check=False)
    if done.returncode != 0:
        return f"network namespaces unavailable: `ip netns add` failed: {done.stderr.strip()[:200]}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, timeout=_IP_TIMEOUT, check=False)
    return None


def require() -> None:
    """Skip (with the reason) where namespaces are unavailable; fail instead under scripts/test."""
    reason = unavailable()
    if reason is None:
        return
    if os.environ.get("AGENTD_TEST_REQUIRE_NETNS") == "1":
        pytest.fail(reason + " (AGENTD_TEST_REQUIRE_NETNS=1: scripts/test needs them)")
    pytest.skip(reason)


# --- ip(8) and setns(2) -------------------------------------------------------------------------------------------


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def namespaces() -> list[str]:
    """Every named network namespace (``ip netns list``)."""
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]


def _pids_in(namespace: str) -> list[int]:
    done = ip("netns", "pids", namespace, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def remove_namespace(namespace: str) -> None:
    """SIGKILL whatever runs inside ``namespace``, then delete it (its veths and bridge go with it)."""
    for _ in range(50):  # bounded: a process forking as fast as it is killed is not a case we serve
        pids = _pids_in(namespace)
        if not pids:
            break
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    ip("netns", "delete", namespace, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Delete namespaces of this harness whose creating process is gone (a killed test run); their names."""
    removed = []
    for namespace in namespaces():
        match = _NAME.match(namespace)
        if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
            remove_namespace(namespace)
            removed.append(namespace)
    return removed


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")


@contextmanager
def _inside(namespace: str) -> Iterator[None]:
    """The calling thread in ``namespace`` for the block (sockets made meanwhile stay in it), then back."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(os.path.join(_NETNS_DIR, namespace), os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


# --- hosts -------------------------------------------------------------------------------------------------------


async def _pipe(source: trio.abc.Stream, sink: trio.SocketStream) -> None:
    with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while data := await source.receive_some(65536):
            await sink.send_all(data)
        await sink.send_eof()


@attrs.define(eq=False)
class Host:
    name: str
    addr: str
    _switch: str
    _port: str

    @property
    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def link_down(self) -> None:
        """Pull this host's cable (the switch side of its veth): traffic to and from it is dropped."""
        ip("-n", self._switch, "link", "set", self._port, "down")

    def link_up(self) -> None:
        ip("-n", self._switch, "link", "set", self._port, "up")

    def listen_socket(self, port: int = 0, addr: str = "127.0.0.1") -> socket.socket:
        """A listening TCP socket bound to ``addr:port`` inside this host's namespace."""
        with _inside(self.name):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((addr, port))
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
        return sock

    @asynccontextmanager
    async def forward(self, port: int, target: str = "127.0.0.1") -> AsyncIterator[int]:
        """A port on this host's loopback relayed to ``target:port`` in the root namespace (not over the
        host's link, so ``link_down`` does not cut it); yields the port inside the host."""
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self.listen_socket()))
        inner = listener.socket.getsockname()[1]

        async def relay(stream: trio.SocketStream) -> None:
            async with stream:
                try:
                    with trio.fail_after(_IP_TIMEOUT):
                        upstream = await trio.open_tcp_stream(target, port)
                except (OSError, trio.TooSlowError):
                    return
                async with upstream, trio.open_nursery() as nursery:
                    nursery.start_soon(_pipe, stream, upstream)
                    nursery.start_soon(_pipe, upstream, stream)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, relay, [listener])
            yield inner
            nursery.cancel_scope.cancel()

    @asynccontextmanager
    async def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  **options: Any) -> AsyncIterator[trio.Process]:
        """``argv`` inside this host (``ip netns exec``), in a new process group that is SIGKILLed as a whole
        when the block ends; ``env`` is added to this process's environment; ``options`` go to
        ``trio.lowlevel.open_process`` (stdout=..., cwd=...)."""
        proc = await trio.lowlevel.open_process([*self.exec_prefix, *argv], env={**os.environ, **(env or {})},
                                                start_new_session=True, **options)
        try:
            yield proc
        finally:
            kill_group(proc.pid)
            with trio.CancelScope(shield=True), trio.move_on_after(_IP_TIMEOUT):
                await proc.wait()


def kill_group(pid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@attrs.define(eq=False)
class Network:
    tag: str
    switch: str
    subnet: str
    hosts: list[Host]
    root_addr: str | None = None

    @property
    def namespaces(self) -> list[str]:
        return [self.switch, *(h.name for h in self.hosts)]


def _subnet(tag: str) -> str:
    """A /24 in 10.64.0.0/10 for this network, avoiding subnets the root namespace already routes."""
    routed = ip("-4", "route", "show").stdout
    seed = zlib.crc32(tag.encode())
    for attempt in range(64):
        value = (seed + attempt * 7919) % (64 * 256)
        prefix = f"10.{64 + value // 256}.{value % 256}"
        if f"{prefix}.0/24" not in routed:
            return prefix
    raise RuntimeError("no free 10.64.0.0/10 subnet for the test network")


def _outer_name(tag: str) -> str:
    """The root namespace's end of the root link: unique on this machine, at most 15 characters."""
    pid, counter = tag[len(PREFIX):].split("-")
    return f"adnt{int(pid):x}x{int(counter) % 256:x}"


def _build(n: int, root_link: bool) -> Network:
    tag = f"{PREFIX}{os.getpid()}-{next(_counter)}"
    switch = f"{tag}-sw"
    prefix = _subnet(tag)
    net = Network(tag=tag, switch=switch, subnet=f"{prefix}.0/24", hosts=[])
    ip("netns", "add", switch)
    ip("-n", switch, "link", "set", "lo", "up")
    ip("-n", switch, "link", "add", "br0", "type", "bridge")
    ip("-n", switch, "link", "set", "br0", "up")
    for index in range(n):
        name, port = f"{tag}-h{index}", f"h{index}"
        host = Host(name=name, addr=f"{prefix}.{index + 2}", switch=switch, port=port)
        net.hosts.append(host)
        ip("netns", "add", name)
        ip("-n", name, "link", "set", "lo", "up")
        ip("link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", port, "netns", switch)
        ip("-n", switch, "link", "set", port, "master", "br0", "up")
        ip("-n", name, "addr", "add", f"{host.addr}/24", "dev", "eth0")
        ip("-n", name, "link", "set", "eth0", "up")
    if root_link:
        # The root end's name is unique on this machine (pid and counter in hex, within 15 characters);
        # it lives in the root namespace only while the switch namespace exists (deleting a veth's peer
        # deletes it).
        outer = _outer_name(tag)
        ip("link", "add", outer, "type", "veth", "peer", "name", "root", "netns", switch)
        ip("-n", switch, "link", "set", "root", "master", "br0", "up")
        ip("addr", "add", f"{prefix}.1/24", "dev", outer)
        ip("link", "set", outer, "up")
        net.root_addr = f"{prefix}.1"
    return net


def _teardown(net: Network) -> None:
    if net.root_addr is not None:
        # Deleted explicitly: the kernel removes a veth whose peer's namespace went away only when its
        # deferred namespace clean-up runs, which lags under load.
        ip("link", "delete", _outer_name(net.tag), check=False)
    for namespace in net.namespaces:
        remove_namespace(namespace)


@asynccontextmanager
async def network(n: int, *, root_link: bool = False) -> AsyncIterator[Network]:
    """``n`` hosts on one private bridge for the duration of the block, removed however the block ends."""
    require()
    net: Network | None = None
    try:
        # ip(8) runs in a worker thread, so the event loop (a gateway serving agents, say) is not blocked.
        net = await trio.to_thread.run_sync(_build_checked, n, root_link)
        yield net
    finally:
        with trio.CancelScope(shield=True):
            if net is not None:
                await trio.to_thread.run_sync(_teardown, net)


@asynccontextmanager
async def hosts(n: int, *, root_link: bool = False) -> AsyncIterator[list[Host]]:
    """:func:`network`, yielding just its hosts: ``async with netns.hosts(2) as (a, b): ...``."""
    async with network(n, root_link=root_link) as net:
        yield net.hosts


def _build_checked(n: int, root_link: bool) -> Network:
    """:func:`cleanup_stale`, then :func:`_build`, deleting what it made if a step fails half way."""
    cleanup_stale()
    before = set(namespaces())
    try:
        return _build(n, root_link)
    except BaseException:
        for namespace in set(namespaces()) - before:
            if namespace.startswith(f"{PREFIX}{os.getpid()}-"):
                remove_namespace(namespace)
        raise


def leftovers(tag: str) -> list[str]:
    """Namespaces and root-namespace links still carrying ``tag`` (for cleanup checks)."""
    found = [ns for ns in namespaces() if ns.startswith(tag + "-")]
    if ip("link", "show", _outer_name(tag), check=False).returncode == 0:
        found.append(_outer_name(tag))
    return found
