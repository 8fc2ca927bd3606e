"""Shared fixtures: real peer servers and process-leak checks.

Peers are real programs in their own process groups (see tests/peers/launch.py). Session-scoped peers are shared
by every test in a worker that does not mutate them; tests that mutate a peer (bump, add_tool, slow calls whose
cancellations are recorded) should start their own through ``sdk_server_factory``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.peers import launch, proctree

# Orphans of killed daemons reparent to this worker, not to pid 1, so the leak check below still sees them.
proctree.become_subreaper()

# Pids of session-scoped peers: they may start during any test and are not leaks.
_LONG_LIVED: set[int] = set()


def _skip_or_fail(reason: str) -> None:
    """Missing peers fail under scripts/test (AGENTD_TEST_REQUIRE_PEERS=1) and skip in ad-hoc runs."""
    if os.environ.get("AGENTD_TEST_REQUIRE_PEERS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _fresh_era_cache() -> Iterator[None]:
    """Each test starts with an empty per-process era cache (ports are reused; verdicts must not leak)."""
    from agentd.client.era_cache import process_era_cache

    process_era_cache().clear()
    yield
    process_era_cache().clear()


@pytest.fixture
def free_port() -> int:
    return launch.free_port()


@pytest.fixture(scope="session")
def sdk_server() -> Iterator[launch.PeerProcess]:
    """Official SDK 2.x peer, stateful, 40 filler tools, page size 10 (so tools/list has 5 pages)."""
    with launch.start_peer(launch.sdk_server_argv(tools=40, page_size=10, instructions="Test peer instructions.")
                           ) as peer:
        _LONG_LIVED.add(peer.pid)
        yield peer


@pytest.fixture
def sdk_server_factory() -> Iterator[Callable[..., launch.PeerProcess]]:
    """``start(mode=..., tools=..., page_size=..., instructions=...)`` -> a fresh SDK peer, stopped at teardown."""
    started: list[launch.PeerProcess] = []

    def start(**options: Any) -> launch.PeerProcess:
        peer = launch.start_peer(launch.sdk_server_argv(**options))
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.stop()


@pytest.fixture(scope="session")
def legacy_sdk_server() -> Iterator[launch.PeerProcess]:
    """The 1.x-era FastMCP peer (``mcp<2`` in .peers/mcp1-venv), stateful, page size 10."""
    try:
        argv = launch.legacy_sdk_server_argv(tools=15, page_size=10)
    except Exception as exc:  # venv creation failed (offline?)
        _skip_or_fail(f"mcp<2 venv unavailable: {exc}")
        raise
    with launch.start_peer(argv) as peer:
        _LONG_LIVED.add(peer.pid)
        yield peer


@pytest.fixture(scope="session")
def modern_server() -> Iterator[launch.PeerProcess]:
    """The 2026-07-28-only peer."""
    with launch.start_peer(launch.modern_server_argv(tools=12, page_size=5)) as peer:
        _LONG_LIVED.add(peer.pid)
        yield peer


@pytest.fixture(scope="session")
def everything_server() -> Iterator[launch.PeerProcess]:
    """npm @modelcontextprotocol/server-everything over Streamable HTTP (only ``echo`` is assumed)."""
    if not (launch.everything_server_dir() / "dist" / "index.js").exists():
        _skip_or_fail("npm server-everything not installed (run scripts/test)")
    with launch.start_everything_server() as peer:
        _LONG_LIVED.add(peer.pid)
        yield peer


@pytest.fixture
def no_leftover_children() -> Iterator[None]:
    """Fail the test if it leaves a child process behind: live, zombie, or orphaned by a parent it killed."""
    before = proctree.descendants()
    yield
    left = proctree.leftovers(before, ignore=frozenset(_LONG_LIVED), reap_adopted=True)
    if left:
        pytest.fail("leftover child processes: " + "; ".join(
            f"pid {p.pid} state {p.state} {p.cmdline[:120]}" for p in left))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A throwaway PostgreSQL server for this worker (tests/postgres.py); fails under scripts/test if absent."""
    from tests import postgres

    try:
        server = postgres.start_server()
    except (RuntimeError, OSError, KeyError) as exc:
        _skip_or_fail(f"PostgreSQL unavailable: {exc}")
        raise
    _LONG_LIVED.update(_postgres_pids(server))
    try:
        yield server
    finally:
        server.close()


def _postgres_pids(server: Any) -> set[int]:
    """The server's processes (its postmaster and backends are not the tests' leaks)."""
    pids: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if server.root.encode() in f.read():
                        pids.add(int(entry))
            except OSError:
                pass
    return pids


@pytest.fixture
def pg_dsn(pg_server: Any) -> str:
    """A DSN (no password in it) of a fresh, empty database; the password is in ``pg_server.env()``."""
    return str(pg_server.dsn(pg_server.new_database()))
