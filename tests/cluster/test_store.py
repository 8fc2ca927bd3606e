"""The PostgreSQL journal's own rules on a real server: schema versions, fencing, a lost connection, and a DSN
whose password never shows."""

from __future__ import annotations

import psycopg
import pytest
import trio
from psycopg.conninfo import conninfo_to_dict

from agentd.cluster import migrations
from agentd.cluster.errors import ClusterSchemaError, ClusterUnavailable, LeaseLost
from agentd.cluster.store import FencedJournal, open_database, open_pg_journal
from agentd.config.dsn import connect_args, parse
from agentd.errors import ConfigError
from agentd.journal.records import RunEnded, RunStarted
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import Redactor
from tests.journal.helpers import WallClock, step
from tests.postgres import PASSWORD
from tests.waiting import until


def _sql(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, password=PASSWORD, autocommit=True) as conn:
        conn.execute(statement.encode())


async def test_two_members_create_the_schema_once(pg_dsn):
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(lambda: _open_and_close(pg_dsn))
    with psycopg.connect(pg_dsn, password=PASSWORD) as conn:
        assert migrations.current_version(conn) == migrations.SCHEMA_VERSION


async def _open_and_close(dsn: str) -> None:
    async with open_pg_journal(dsn, PASSWORD) as journal:
        await journal.append("r", [RunStarted("d", "go")])


async def test_a_newer_schema_is_refused_and_an_older_one_needs_migrate(pg_dsn):
    await _open_and_close(pg_dsn)
    _sql(pg_dsn, f"UPDATE agentd_meta SET value = '{migrations.SCHEMA_VERSION + 1}' WHERE key = 'schema_version'")
    with pytest.raises(ClusterSchemaError, match=f"schema version {migrations.SCHEMA_VERSION + 1} was written by a "
                                                 "newer agentd"):
        await _open_and_close(pg_dsn)
    _sql(pg_dsn, "UPDATE agentd_meta SET value = '0' WHERE key = 'schema_version'")
    with pytest.raises(ClusterSchemaError, match="agentd cluster migrate"):
        await _open_and_close(pg_dsn)


async def test_migrate_creates_on_an_empty_database(pg_dsn):
    db = await open_database(pg_dsn, PASSWORD, "x", migrate=True)
    await db.aclose()
    with psycopg.connect(pg_dsn, password=PASSWORD) as conn:
        assert migrations.current_version(conn) == migrations.SCHEMA_VERSION


async def test_a_fenced_append_after_losing_the_lease_commits_nothing(pg_dsn):
    clock = WallClock()
    async with open_pg_journal(pg_dsn, PASSWORD, clock=clock, lease_clock=clock) as store:
        a = await store.claim("r1", "member-a", ttl=10)
        assert a is not None
        as_a = FencedJournal(store, a)
        await as_a.append("r1", [RunStarted("d", "go")])
        await as_a.append("r1", step(0))
        clock.now += 11  # a's lease expired (a was paused); b takes the run
        b = await store.claim("r1", "member-b", ttl=10)
        assert b is not None and b.token > a.token
        with pytest.raises(LeaseLost, match="now held by 'member-b'"):
            await as_a.append("r1", step(1))
        with pytest.raises(LeaseLost):
            await as_a.append("r1", [RunEnded("completed", "stale")])
        await FencedJournal(store, b).append("r1", [RunEnded("completed", "fresh")])
        run = await store.read_run("r1")
    assert run is not None and run.summary.records == 6 and run.summary.status == "completed"
    assert run.entries[-1].record == RunEnded("completed", "fresh")


async def test_an_expired_but_unclaimed_lease_still_commits(pg_dsn):
    """Fencing is by token: a paused owner whose lease ran out but was not re-claimed loses nothing."""
    clock = WallClock()
    async with open_pg_journal(pg_dsn, PASSWORD, clock=clock, lease_clock=clock) as store:
        a = await store.claim("r1", "member-a", ttl=10)
        assert a is not None
        clock.now += 100
        assert await FencedJournal(store, a).append("r1", [RunStarted("d", "go")]) == 0


async def test_a_restarted_server_is_reconnected(pg_server, pg_dsn):
    async with open_pg_journal(pg_dsn, PASSWORD) as store:
        await store.append("r1", [RunStarted("d", "go")])
        pg_server.stop()
        try:
            with pytest.raises(ClusterUnavailable, match=r"127\.0\.0\.1") as caught:
                await store.append("r1", step(0))
            assert PASSWORD not in str(caught.value)
        finally:
            pg_server.start()
        assert await store.append("r1", step(0)) == 4


async def test_a_fenced_append_waits_for_the_database_and_then_commits(pg_server, pg_dsn):
    async with open_pg_journal(pg_dsn, PASSWORD) as store:
        lease = await store.claim("r1", "member-a", ttl=60)
        assert lease is not None
        retries: list[int] = []
        fenced = FencedJournal(store, lease, on_unavailable=lambda exc, attempt: retries.append(attempt))
        await fenced.append("r1", [RunStarted("d", "go")])
        pg_server.stop()
        restarted = False
        try:
            async with trio.open_nursery() as nursery:
                done: list[int] = []

                async def commit() -> None:
                    done.append(await fenced.append("r1", step(0)))

                nursery.start_soon(commit)
                await until(lambda: len(retries) >= 2, timeout=30, what="two retries")
                assert done == []
                await trio.to_thread.run_sync(pg_server.start)
                restarted = True
        finally:
            if not restarted:
                pg_server.start()
        assert done == [4]


def test_a_dsn_with_a_literal_password_is_refused_without_echoing_it():
    for text in ("postgresql://agentd:hunter2@db:5432/agentd", "host=db password=hunter2 dbname=x",
                 "postgresql://agentd@db/agentd?password=hunter2"):
        with pytest.raises(ConfigError) as caught:
            parse(text)
        assert "hunter2" not in str(caught.value)
    dsn = parse("postgresql://agentd:{{secret:PG_PASS}}@db.internal:5433/agentd")
    assert str(dsn) == "db.internal:5433/agentd"
    redactor = Redactor()
    conninfo, password = connect_args(dsn, SecretResolver(env={"PG_PASS": "pa:ss@w/rd"}), {}, redactor)
    assert password == "pa:ss@w/rd" and "pa:ss" not in conninfo and "{{" not in conninfo
    assert redactor.scrub("x pa:ss@w/rd y") != "x pa:ss@w/rd y"
    conninfo, password = connect_args(parse("host=db dbname=x user=u"), SecretResolver(env={}), {"PGPASSWORD": "p1"})
    assert conninfo_to_dict(conninfo) == {"host": "db", "dbname": "x", "user": "u"} and password == "p1"


@pytest.mark.parametrize("text", ["host=db password", "postgresql://db/x?password=hunter2&sslmode",
                                  "host='db dbname=x password=hunter2", "password=hunter2 host"])
def test_a_dsn_libpq_cannot_read_is_refused_with_its_reason_and_without_its_tokens(text):
    with pytest.raises(ConfigError, match="not a PostgreSQL DSN") as caught:
        parse(text)
    assert "hunter2" not in str(caught.value)


def test_both_dsn_forms_are_read_by_libpq_and_a_reference_reaches_only_the_password():
    url = parse("postgres://agentd:{{secret-file:%2Frun%2Fpg}}@[::1]:6432/jobs?sslmode=require&application_name=a")
    assert (url.host, url.port, url.database) == ("::1", "6432", "jobs")
    pairs = parse("host=/var/run/postgresql port=5433 dbname='my db' password='{{secret:PG}}'")
    assert str(pairs) == "/var/run/postgresql:5433/my db"
    conninfo, password = connect_args(pairs, SecretResolver(env={"PG": "s3cret 'quoted'"}), {})
    assert password == "s3cret 'quoted'"
    assert conninfo_to_dict(conninfo) == {"host": "/var/run/postgresql", "port": "5433", "dbname": "my db"}
    with pytest.raises(ConfigError, match="percent-encoded"):  # libpq ends the authority at the path's "/"
        parse("postgres://agentd:{{secret-file:/run/pg}}@db/jobs")
    with pytest.raises(ConfigError, match="port is not a number"):
        parse("postgresql://agentd@db:fivefour/jobs")


async def test_a_wrong_password_and_an_unreachable_host_name_the_host_only(pg_dsn):
    with pytest.raises(ClusterUnavailable, match=r"127\.0\.0\.1") as caught:
        async with open_pg_journal(pg_dsn, "wrong-password-xyz", where="127.0.0.1/x"):
            pass
    assert "wrong-password-xyz" not in str(caught.value)


async def test_daemon_state_is_per_member_and_runs_are_shared(pg_dsn):
    from agentd.cluster.store import MemberJournal

    async with open_pg_journal(pg_dsn, PASSWORD) as store:
        a, b = MemberJournal(store, "member-a"), MemberJournal(store, "member-b")
        await a.put_state("self_schedules", {"s1": {"at": 1.0}})
        assert await b.get_state("self_schedules") == {}
        assert await MemberJournal(store, "member-a").get_state("self_schedules") == {"s1": {"at": 1.0}}
        await a.append("r1", [RunStarted("d", "go")])
        assert (await b.read_run("r1")) is not None
