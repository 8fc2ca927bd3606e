"""The capacity signal and the served limits of a cluster member, through real agentd processes on loopback and a
real PostgreSQL: the numbers an autoscaler reads (the metrics endpoint, ``agentd ctl status``, ``agentd cluster
status``), a burst of served async spawns queued (``--serve-max-queued``, not ``--serve-max-spawns``), and a
cluster handle's end heard through ``NOTIFY`` instead of a poll."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from agentd.cluster.member import Member
from agentd.cluster.store import FencedJournal, PgJournal, open_database, open_pg_journal
from agentd.cluster.watch import FALLBACK_POLL, WAITER_FALLBACK, DoneWatch
from agentd.cluster.work import Queue, WorkItem, enqueue
from agentd.journal.records import RunEnded
from agentd.selfmcp.clustered import ClusterBackend
from agentd.telemetry.events import EventLog
from tests.cluster.test_members import ROOT, _env, _joined, _served_url, _wait_for
from tests.ctl.daemon import ctl
from tests.peers.gateway import scripted_gateway
from tests.postgres import PASSWORD
from tests.waiting import until

TTL = 3.0  # the heartbeat (and so the capacity read) every second


@asynccontextmanager
async def _member(tmp_path: Path, name: str, argv: Sequence[str]) -> AsyncIterator[trio.Process]:
    log_path = tmp_path / f"{name}.stderr"
    with open(log_path, "wb") as log:
        proc = await trio.lowlevel.open_process([sys.executable, "-m", "agentd", *argv], stdout=subprocess.DEVNULL,
                                                stderr=log, env=_env(), cwd=ROOT)
        try:
            await until(lambda: _joined(proc, log_path), timeout=60, what=f"{name} joined")
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            with trio.move_on_after(10):
                await proc.wait()


def _base(dsn: str, gw_url: str, capacity: int) -> list[str]:
    return ["--cluster", dsn, "--intelligence", gw_url, "--cluster-lease-ttl", f"{TTL:g}s",
            "--cluster-capacity", str(capacity), "--deadline", "120s"]


def _metrics_url(log: Path) -> str | None:
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "serve.start" and event.get("comp") == "metrics":
            return str(event["urls"][0])
    return None


def _gauges(body: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples
            if s.name.startswith("agentd_cluster_")}


async def test_queue_depth_free_slots_and_oldest_age_reach_metrics_ctl_status_and_cluster_status(pg_dsn, tmp_path):
    """Member B runs one item (its model call never answers) and is then full; member A runs nothing
    (``--cluster-capacity 0``). Five items queued: one runs, four wait, no slot is free."""
    hang = trio.Event()
    sock = str(tmp_path / "a.sock")
    async with scripted_gateway(default={"content": "never", "wait": hang}) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store:
        async with _member(tmp_path, "b", _base(pg_dsn, gw.url, 1)), \
                _member(tmp_path, "a", [*_base(pg_dsn, gw.url, 0), "--metrics-addr", "127.0.0.1:0",
                                        "--ctl-socket", sock]):
            for i in range(5):
                assert await enqueue(store, f"job-{i}", "run", {"instruction": f"job {i}"})
            url = await until(lambda: _metrics_url(tmp_path / "a.stderr"), timeout=30, what="the metrics port")
            async with httpx.AsyncClient(timeout=10) as client:

                async def settled() -> dict[str, float] | None:
                    got = _gauges((await client.get(url)).text)
                    return got if got.get("agentd_cluster_queue_depth") == 4 and got.get(
                        "agentd_cluster_members") == 2 else None

                gauges = await _wait_for(settled, 30)
            assert gauges["agentd_cluster_free_slots"] == 0
            assert gauges["agentd_cluster_member_free_slots"] == 0  # A's own: capacity 0
            assert 0 < gauges["agentd_cluster_oldest_queued_age_seconds"] < 60

            code, status = await ctl("status", "--socket", sock)
            assert code == 0, status
            cluster = status["cluster"]
            assert cluster["member"]["capacity"] == 0 and cluster["member"]["free_slots"] == 0
            assert (cluster["queued"], cluster["running"], cluster["free_slots"]) == (4, 1, 0)
            assert sorted((m["capacity"], m["running"], m["free"]) for m in cluster["members"]) == [(0, 0, 0),
                                                                                                    (1, 1, 0)]
            assert cluster["oldest_queued_age"] > 0 and 0 <= cluster["read_age"] < TTL

            with trio.fail_after(30):
                done = await trio.run_process([sys.executable, "-m", "agentd", "cluster", "status", "--cluster",
                                               pg_dsn], capture_stdout=True, capture_stderr=True, check=False,
                                              env=_env(), cwd=ROOT)
            assert done.returncode == 0, done.stderr.decode()[-2000:]
            doc = json.loads(done.stdout)
            assert (doc["queued"], doc["running"], doc["free_slots"], len(doc["members"])) == (4, 1, 0, 2)
            assert PASSWORD not in done.stdout.decode()


async def _burst(url: str, n: int) -> list[dict[str, Any]]:
    """``n`` async ``subagent.spawn`` calls at once (over a few sessions), each answer's tool result."""
    from tests.selfmcp.harness import LegacyPeer

    answers: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=32)) as client:
        peers = [LegacyPeer(client, url) for _ in range(8)]
        for peer in peers:
            await peer.initialize()

        async def spawn(i: int) -> None:
            got = await peers[i % len(peers)].call("tools/call", {"name": "subagent.spawn", "arguments": {
                "instruction": f"item {i}", "async": True}})
            answers.append(got["result"])

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(spawn, i)
    return answers


async def test_a_burst_of_200_served_async_spawns_is_queued_by_default(pg_dsn, tmp_path):
    """A served async spawn in cluster mode is a queued row: 200 at once are all accepted with the defaults
    (``--serve-max-spawns`` 4 bounds what this member's supervisor runs, not what it queues)."""
    async with scripted_gateway() as gw, open_pg_journal(pg_dsn, PASSWORD) as store:
        argv = [*_base(pg_dsn, gw.url, 0), "--serve-mcp", "http://127.0.0.1:0/mcp"]
        async with _member(tmp_path, "a", argv):
            answers = await _burst(_served_url(tmp_path / "a.stderr"), 200)
        refused = [a for a in answers if a.get("isError")]
        assert not refused, refused[:3]
        handles = {a["structuredContent"]["handle"] for a in answers}
        assert len(handles) == 200 and all(h.startswith("cluster.") for h in handles)
        rows = await store.db.call(lambda c: c.execute(
            "SELECT count(*) FROM agentd_work WHERE status = 'open' AND work_id LIKE 'cluster.%'").fetchone())
        assert rows == (200,)


async def test_serve_max_queued_refuses_past_the_limit_naming_it(pg_dsn, tmp_path):
    async with scripted_gateway() as gw, open_pg_journal(pg_dsn, PASSWORD) as store:
        argv = [*_base(pg_dsn, gw.url, 0), "--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-max-queued", "20"]
        async with _member(tmp_path, "a", argv):
            answers = await _burst(_served_url(tmp_path / "a.stderr"), 30)
        refused = [a for a in answers if a.get("isError")]
        assert len(refused) == 10 and len(answers) == 30
        for answer in refused:
            assert "--serve-max-queued" in answer["content"][0]["text"]
            assert answer["structuredContent"]["refused"] == "serve_max_queued"
            assert answer["structuredContent"]["retryable"] is True
        rows = await store.db.call(lambda c: c.execute("SELECT count(*) FROM agentd_work").fetchone())
        assert rows == (20,)


class _CountingJournal(PgJournal):
    """The shared journal, counting the run reads a watcher makes (what polling costs the connection)."""

    reads = 0

    async def read_run(self, run_id: str) -> Any:
        type(self).reads += 1
        return await super().read_run(run_id)


async def test_a_cluster_handles_end_reaches_a_watcher_on_another_member_through_notify(pg_dsn):
    """A member watching a cluster handle another member runs reads its row once (open: its run is not read),
    then waits for the ``done`` notification: no reads while it runs, and the end arrives well within the
    fallback look."""
    _CountingJournal.reads = 0
    async with open_pg_journal(pg_dsn, PASSWORD) as other:
        watcher_db = await open_database(pg_dsn, PASSWORD, "test", application="watcher")
        listen_db = await open_database(pg_dsn, PASSWORD, "test", application="watcher-listen")
        watcher = _CountingJournal(watcher_db)
        try:
            async with trio.open_nursery() as nursery:
                await _watch_an_end_elsewhere(nursery, other, watcher, listen_db)
                nursery.cancel_scope.cancel()
        finally:  # after the member left (its last statement)
            with trio.CancelScope(shield=True):
                await watcher.aclose()
                await listen_db.aclose()


async def _watch_an_end_elsewhere(nursery: trio.Nursery, other: PgJournal, watcher: PgJournal, listen_db: Any
                                  ) -> None:
    watch = DoneWatch()

    async def never(item: WorkItem, journal: FencedJournal) -> None:
        raise AssertionError("capacity 0 runs nothing")

    member = Member(Queue(watcher, "watcher", None, 0), never, EventLog(sink=lambda e: None), ttl=TTL,
                    listen_db=listen_db, watch=watch)
    await nursery.start(member.serve)
    handle = "cluster.watched"
    assert await enqueue(other, handle, "spawn", {"instruction": "x"})
    [item] = await Queue(other, "runner", None, 1).claim(1, ttl=30)
    backend = ClusterBackend(cast(Any, None), watcher, watch)
    ended: list[float] = []

    async def wait() -> None:
        view = await backend.wait(handle)
        assert view.done and view.status == "completed"
        ended.append(time.monotonic())

    nursery.start_soon(wait)
    # real time: the run goes on in a real database for a while; the watcher does not poll it meanwhile
    await trio.sleep(2.5)
    assert _CountingJournal.reads == 0
    await other.append(handle, [RunEnded("completed", {"status": "completed", "done": True, "result": "ok"})])
    await Queue(other, "runner", None, 1).finish(item.lease)
    finished = time.monotonic()
    await until(lambda: ended, timeout=FALLBACK_POLL, what="the watcher saw the end")
    assert ended[0] - finished < 1.5  # the notification, not the 5 s fallback
    assert len(watch) == 0  # no waiter left behind


async def test_an_end_whose_notification_is_lost_reaches_the_waiter_at_the_members_look(pg_dsn):
    """Without a listener (every notification lost) the member's one look at every watched handle, each
    FALLBACK_POLL, finds the ends: two waiters of two handles learn theirs long before their own fallback."""
    async with open_pg_journal(pg_dsn, PASSWORD) as other, open_pg_journal(pg_dsn, PASSWORD) as watcher:
        watch = DoneWatch()

        async def never(item: WorkItem, journal: FencedJournal) -> None:
            raise AssertionError("capacity 0 runs nothing")

        async with trio.open_nursery() as nursery:
            member = Member(Queue(watcher, "watcher", None, 0), never, EventLog(sink=lambda e: None), ttl=TTL,
                            listen_db=None, watch=watch)
            await nursery.start(member.serve)
            handles = ["cluster.lost-1", "cluster.lost-2"]
            items = []
            for handle in handles:
                assert await enqueue(other, handle, "spawn", {"instruction": "x"})
                items += await Queue(other, "runner", None, 1).claim(1, ttl=30)
            backend = ClusterBackend(cast(Any, None), watcher, watch)
            ended: list[str] = []

            async def wait(handle: str) -> None:
                view = await backend.wait(handle)
                assert view.done and view.status == "completed"
                ended.append(handle)

            for handle in handles:
                nursery.start_soon(wait, handle)
            await until(lambda: len(watch) >= 2, timeout=30, what="both handles watched")
            for item in items:
                await other.append(item.work_id, [RunEnded("completed", {"status": "completed", "done": True,
                                                                          "result": "ok"})])
                await Queue(other, "runner", None, 1).finish(item.lease)
            # the member's look, not each waiter's own re-read
            await until(lambda: len(ended) >= 2, timeout=WAITER_FALLBACK - 10, what="both waiters saw their end")
            assert sorted(ended) == handles and len(watch) == 0
            nursery.cancel_scope.cancel()
