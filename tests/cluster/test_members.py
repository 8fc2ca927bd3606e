"""Cluster members as real agentd processes on loopback against a real PostgreSQL: start-up faults (exit 6, no
password anywhere), work spread over members, SIGKILL failover within lease TTL + 2 s, a paused stale owner
that commits nothing (fencing), and the database restarting under a running member."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from agentd.cluster.errors import ClusterUnavailable
from agentd.cluster.store import PgJournal, open_pg_journal
from agentd.cluster.work import enqueue, view
from agentd.journal.records import ClaimTaken, RunEnded
from tests.cluster.leases import last_claimed_at, lease_expiry_past, takeover
from tests.durable.peer import CountingPeer, counting_peer
from tests.peers.gateway import Rule, ScriptedGateway, scripted_gateway, text, tool_call
from tests.postgres import PASSWORD
from tests.waiting import until

ROOT = str(Path(__file__).resolve().parents[2])
TTL = 3.0


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT", "PG"))}
    return {**env, "PGPASSWORD": PASSWORD, **extra}


def _member_argv(dsn: str, gw: ScriptedGateway, peer: CountingPeer | None, *extra: str, ttl: float = TTL
                 ) -> list[str]:
    argv = [sys.executable, "-m", "agentd", "--cluster", dsn, "--intelligence", gw.url,
            "--cluster-lease-ttl", f"{ttl:g}s", "--cluster-capacity", "2", "--deadline", "120s", *extra]
    return argv + (["--mcp", f"pay={peer.origin}/mcp"] if peer is not None else [])


@asynccontextmanager
async def _members(argv: Sequence[str], n: int, tmp_path: Path) -> AsyncIterator[list[trio.Process]]:
    procs: list[trio.Process] = []
    logs = []
    try:
        for i in range(n):
            log = open(tmp_path / f"member{i}.stderr", "wb")
            logs.append(log)
            procs.append(await trio.lowlevel.open_process(list(argv), stdout=subprocess.DEVNULL, stderr=log,
                                                          env=_env(), cwd=ROOT))
        for i in range(n):
            await until(lambda i=i: _joined(procs[i], tmp_path / f"member{i}.stderr"), timeout=60,
                        what=f"member{i} joined")
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGKILL)
            with trio.move_on_after(10):
                await proc.wait()
        for log in logs:
            log.close()


def _joined(proc: trio.Process, log: Path) -> bool:
    """The member has joined the cluster; it must not have exited (else fail with its log's tail)."""
    assert proc.poll() is None, log.read_text()[-3000:]
    return b'"cluster.joined"' in log.read_bytes()


async def _wait_for(check: Callable[[], Any], timeout: float = 60) -> Any:
    return await until(check, timeout=timeout)


async def _owners(store: PgJournal, work_id: str) -> list[str]:
    run = await store.read_run(work_id)
    return [e.record.owner for e in run.entries if isinstance(e.record, ClaimTaken)] if run else []


def _pid_of(owner: str) -> int:
    return int(owner.rsplit("-", 2)[1])


async def test_an_unreachable_database_is_exit_6_naming_the_host_and_no_password(pg_server, pg_dsn, free_port):
    cases = [
        (f"postgresql://agentd@127.0.0.1:{free_port}/nowhere", {}, f"127.0.0.1:{free_port}/nowhere"),
        (pg_dsn.replace("agentd@", "agentd:{{secret:PG_PASS}}@"), {"PG_PASS": "Wrong-Pa55word-x"},
         f"127.0.0.1:{pg_server.port}"),
    ]
    for dsn, extra, named in cases:
        env = {**_env(**extra), "PGPASSWORD": ""}
        with trio.fail_after(60):
            done = await trio.run_process([sys.executable, "-m", "agentd", "--cluster", dsn, "--intelligence", "test"],
                                          capture_stdout=True, capture_stderr=True, check=False, env=env, cwd=ROOT)
        out, err = done.stdout.decode(), done.stderr.decode()
        assert done.returncode == 6, err[-2000:]
        assert named in out + err
        assert out.strip() == "" or isinstance(json.loads(out), dict)  # stdout: one JSON document at most
        for secret in ("Wrong-Pa55word-x", PASSWORD):
            assert secret not in out + err


async def test_work_spreads_over_members_and_runs_once(pg_dsn, tmp_path):
    async with scripted_gateway(default=text("done", delay=0.4)) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store:
        async with _members(_member_argv(pg_dsn, gw, None), 3, tmp_path):
            for i in range(12):
                await enqueue(store, f"w{i:02}", "run", {"instruction": f"job {i}"})

            async def all_done() -> bool:
                views = [await view(store, f"w{i:02}") for i in range(12)]
                return all(v is not None and v.status == "done" for v in views)

            await _wait_for(all_done, 90)
        owners = {i: await _owners(store, f"w{i:02}") for i in range(12)}
        assert all(len(o) == 1 for o in owners.values()), owners  # each claimed once
        assert len({o[0] for o in owners.values()}) >= 2, owners
        for i in range(12):
            run = await store.read_run(f"w{i:02}")
            assert run is not None and run.entries[-1].record.KIND == "run.ended"
            assert isinstance(run.entries[-1].record, RunEnded) and run.entries[-1].record.status == "completed"
        assert len(gw.requests) == 12


async def test_a_sigkilled_members_work_finishes_elsewhere_within_ttl_plus_2s(pg_dsn, tmp_path):
    """The dead member's lease expires at most TTL after its last heartbeat, so at most TTL after the kill; the
    other member takes the item over within ``takeover(TTL)`` (2 s) of that expiry, never before it, and
    finishes it. Measured on the database's clock from the lease's own expiry (the lease row, the item's
    ``claimed_at``, tests/cluster/leases.py): the test's own pace on a loaded machine is not part of it, and the
    run after the takeover is not bounded."""
    hang = trio.Event()  # never set: the first model call hangs (the member is killed while it waits)
    async with scripted_gateway(rules=[Rule({}, {"content": "never", "wait": hang}, 1)],
                                default=text("finished elsewhere")) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store:
        async with _members(_member_argv(pg_dsn, gw, None), 2, tmp_path) as procs:
            await enqueue(store, "job-1", "run", {"instruction": "do the job"})
            [first] = await _wait_for(lambda: _owners(store, "job-1"))
            await _wait_for(lambda: _has_request(gw))
            victim = next(p for p in procs if p.pid == _pid_of(first))

            async def kill() -> None:
                victim.send_signal(signal.SIGKILL)
                await victim.wait()

            earliest, latest = await lease_expiry_past(store, "job-1", kill, TTL)
            await _wait_for(lambda: _is_done(store, "job-1"), 60)
            moved_at = await last_claimed_at(store, "job-1")
        owners = await _owners(store, "job-1")
        assert len(owners) == 2 and owners[0] == first and owners[1] != first
        run = await store.read_run("job-1")
        assert run is not None and isinstance(run.entries[-1].record, RunEnded)
        assert run.entries[-1].record.result["result"] == "finished elsewhere"
        assert earliest <= moved_at <= latest + takeover(TTL), (moved_at - earliest, latest - earliest)


async def _has_request(gw: ScriptedGateway) -> bool:
    return bool(gw.requests)


async def _is_done(store: PgJournal, work_id: str) -> bool:
    try:
        seen = await view(store, work_id)
    except ClusterUnavailable:  # the test's own connection, after the database restarted: reopened next time
        return False
    return seen is not None and seen.status == "done"


async def test_a_paused_stale_owner_commits_nothing(pg_dsn, tmp_path):
    """Member A is SIGSTOPped while its model call is out; past its lease B takes the item and finishes it;
    then A's model answers with a non-idempotent tool call and A is SIGCONTed: A commits nothing, and the
    tool call is never sent (the step is committed before any call is sent, and that commit is fenced)."""
    release = trio.Event()
    async with counting_peer() as peer, scripted_gateway(
        rules=[Rule({}, {**tool_call("pay__charge", {"key": "k1"}), "wait": release}, 1)],
        default=text("done by the new owner"),
    ) as gw, open_pg_journal(pg_dsn, PASSWORD) as store:
        async with _members(_member_argv(pg_dsn, gw, peer), 2, tmp_path) as procs:
            await enqueue(store, "job-1", "run", {"instruction": "charge it"})
            [first] = await _wait_for(lambda: _owners(store, "job-1"))
            await _wait_for(lambda: _has_request(gw))
            stale = next(p for p in procs if p.pid == _pid_of(first))
            stale.send_signal(signal.SIGSTOP)
            await _wait_for(lambda: _is_done(store, "job-1"), 60)
            before = await store.read_run("job-1")
            release.set()  # A's model call answers: charge the card
            stale.send_signal(signal.SIGCONT)
            index = procs.index(stale)
            log = tmp_path / f"member{index}.stderr"
            await _wait_for(lambda: _logged(log, ('"cluster.fenced"', '"cluster.lease_lost"')), 30)
            await trio.sleep(0.5)  # real time: give a (wrong) commit or tool call of the real daemon the chance to land
            after = await store.read_run("job-1")
        assert before is not None and after is not None and after.entries == before.entries
        assert peer.count("charge") == 0 and peer.received == []
        assert isinstance(after.entries[-1].record, RunEnded)
        assert after.entries[-1].record.result["result"] == "done by the new owner"


async def _logged(path: Path, events: Sequence[str]) -> bool:
    text_ = path.read_text()
    return any(e in text_ for e in events)


async def test_the_database_restarting_mid_run_pauses_claims_and_resumes(pg_server, pg_dsn, tmp_path):
    async with scripted_gateway(default=text("done", delay=2.0)) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store:
        async with _members(_member_argv(pg_dsn, gw, None), 1, tmp_path):
            await enqueue(store, "before", "run", {"instruction": "one"})
            await _wait_for(lambda: _has_request(gw))
            pg_server.stop()
            try:
                await _wait_for(lambda: _logged(tmp_path / "member0.stderr", ('"cluster.unavailable"',)), 30)
            finally:
                await trio.to_thread.run_sync(pg_server.start)
            await _wait_for(lambda: _is_done(store, "before"), 60)
            await enqueue(store, "after", "run", {"instruction": "two"})
            await _wait_for(lambda: _is_done(store, "after"), 60)
        assert '"cluster.available"' in (tmp_path / "member0.stderr").read_text()
        for work_id in ("before", "after"):
            run = await store.read_run(work_id)
            assert run is not None and isinstance(run.entries[-1].record, RunEnded)
            assert run.entries[-1].record.status == "completed"
            assert len(await _owners(store, work_id)) == 1  # kept its lease through the outage


def _served_url(log: Path) -> str:
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "serve.start":
            return str(event["urls"][0])
    raise AssertionError("no serve.start")


async def test_a_served_async_spawn_is_cluster_work_and_its_handle_answers_and_notifies_on_every_member(pg_dsn, tmp_path):
    import httpx

    from agentd.mcp.sse import SseDecoder
    from tests.selfmcp.harness import LegacyPeer, read_events

    listening = trio.Event()  # the run's model answers once B listens: its end cannot come before, however slow
    async with scripted_gateway(default={**text("served answer"), "wait": listening}) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store:
        argv = _member_argv(pg_dsn, gw, None, "--serve-mcp", "http://127.0.0.1:0/mcp")
        async with _members(argv, 2, tmp_path):
            urls = [_served_url(tmp_path / f"member{i}.stderr") for i in range(2)]
            async with httpx.AsyncClient(timeout=30) as client:
                a, b = LegacyPeer(client, urls[0]), LegacyPeer(client, urls[1])
                await a.initialize()
                await b.initialize()
                spawned = await a.call("tools/call", {"name": "subagent.spawn",
                                                      "arguments": {"instruction": "answer it", "async": True}})
                handle = spawned["result"]["structuredContent"]["handle"]
                assert handle.startswith("cluster.")
                # B subscribes to a handle it did not spawn: its terminal update reaches B's subscriber
                uri = f"agent://subagent/{handle}"
                assert (await b.call("resources/subscribe", {"uri": uri}))["result"] == {}
                with trio.fail_after(60):
                    async with client.stream("GET", urls[1], headers={**b.headers(), "accept": "text/event-stream"}
                                             ) as r:
                        assert r.status_code == 200
                        listening.set()
                        events = await read_events(r.aiter_bytes(), SseDecoder(), 1)
                heard_at = time.time()
                updated = next(e for e in events if e.data)
                assert json.loads(updated.data)["params"] == {"uri": uri}
                # B heard the end through NOTIFY: well within its fallback re-read (5 s), not at the next poll
                [(finished_at,)] = await store.db.call(lambda c: c.execute(
                    "SELECT finished_at FROM agentd_work WHERE work_id = %s", (handle,)).fetchall())
                assert heard_at - finished_at < 2.0, heard_at - finished_at

                async def done_on_b() -> dict[str, Any] | None:
                    got = await b.call("tools/call", {"name": "subagent.status", "arguments": {"handle": handle}})
                    body = got["result"].get("structuredContent") or {}
                    return body if body.get("done") else None

                body = await _wait_for(done_on_b, 60)
                assert body["status"] == "completed" and body["result"] == "served answer"
                read = await b.call("resources/read", {"uri": f"agent://subagent/{handle}"})
                contents = json.loads(read["result"]["contents"][0]["text"])
                assert contents["status"] == "completed" and contents["result"] == "served answer"
                unknown = await b.call("tools/call", {"name": "subagent.status",
                                                      "arguments": {"handle": "cluster.nope"}})
                assert unknown["result"]["isError"] is True
        assert await _is_done(store, handle)


async def test_a_drained_member_hands_its_work_back_at_once(pg_dsn, tmp_path):
    """SIGTERM: the member stops, its unfinished item's lease is released (not left to expire: the TTL here
    is 60 s), and the other member resumes it."""
    hang = trio.Event()
    async with scripted_gateway(rules=[Rule({}, {"content": "never", "wait": hang}, 1)],
                                default=text("resumed after the drain")) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store:
        async with _members(_member_argv(pg_dsn, gw, None, "--drain-timeout", "2s", ttl=60), 2, tmp_path) as procs:
            await enqueue(store, "job-1", "run", {"instruction": "do the job"})
            [first] = await _wait_for(lambda: _owners(store, "job-1"))
            await _wait_for(lambda: _has_request(gw))
            drained = next(p for p in procs if p.pid == _pid_of(first))
            drained.send_signal(signal.SIGTERM)
            await _wait_for(lambda: _is_done(store, "job-1"), 30)
            with trio.fail_after(30):
                await drained.wait()
        owners = await _owners(store, "job-1")
        assert len(owners) == 2 and owners[1] != first
        run = await store.read_run("job-1")
        assert run is not None and isinstance(run.entries[-1].record, RunEnded)
        assert run.entries[-1].record.result["result"] == "resumed after the drain"


async def test_a_cluster_handle_is_cancelled_from_another_member(pg_dsn, tmp_path):
    import httpx

    from tests.selfmcp.harness import LegacyPeer

    hang = trio.Event()  # the run's model call never answers: only the cancel ends it
    async with scripted_gateway(default={"content": "never", "wait": hang}) as gw, \
            open_pg_journal(pg_dsn, PASSWORD) as store:
        argv = _member_argv(pg_dsn, gw, None, "--serve-mcp", "http://127.0.0.1:0/mcp")
        async with _members(argv, 2, tmp_path):
            urls = [_served_url(tmp_path / f"member{i}.stderr") for i in range(2)]
            async with httpx.AsyncClient(timeout=60) as client:
                a, b = LegacyPeer(client, urls[0]), LegacyPeer(client, urls[1])
                await a.initialize()
                await b.initialize()
                spawned = await a.call("tools/call", {"name": "subagent.spawn",
                                                      "arguments": {"instruction": "wait", "async": True}})
                handle = spawned["result"]["structuredContent"]["handle"]
                await _wait_for(lambda: _has_request(gw))  # its run is on a member, waiting for the model
                cancelled = await b.call("tools/call", {"name": "subagent.cancel", "arguments": {"handle": handle}})
                body = cancelled["result"]["structuredContent"]
                assert body["status"] == "cancelled" and body["done"] is True, body
        assert await _is_done(store, handle)
        run = await store.read_run(handle)
        assert run is not None and run.summary.status == "cancelled"
        assert len(await _owners(store, handle)) == 1  # cancelled, not handed to another member
