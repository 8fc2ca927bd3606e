"""``--cluster`` as configuration (flag, environment, ``cluster:`` section, refusals) and ``agentd cluster`` as
real processes against a real PostgreSQL; psycopg stays off the start-up path without ``--cluster``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from agentd.config.load import load_config
from agentd.errors import ConfigError
from tests.postgres import PASSWORD

ROOT = str(Path(__file__).resolve().parents[2])
BASE = ["--intelligence", "test"]


def test_the_flag_the_environment_and_the_file_section(tmp_path):
    cfg = load_config([*BASE, "--cluster", "postgresql://agentd@db:5432/agentd", "--cluster-capacity", "7",
                            "--cluster-lease-ttl", "30s"], env={})
    assert (cfg.cluster.dsn, cfg.cluster.capacity, cfg.cluster.lease_ttl) == ("postgresql://agentd@db:5432/agentd", 7, 30.0)
    assert cfg.instruction is None  # a pure worker needs no instruction
    cfg = load_config(BASE, env={"AGENTD_CLUSTER": "host=db dbname=agentd"})
    assert cfg.cluster.dsn == "host=db dbname=agentd" and cfg.cluster.capacity == 4
    config = tmp_path / "agentd.yaml"
    config.write_text("cluster:\n  dsn: postgresql://agentd@db/agentd\n  capacity: 2\n  lease_ttl: 5s\n")
    cfg = load_config([*BASE, "--config", str(config)], env={})
    assert (cfg.cluster.dsn, cfg.cluster.capacity, cfg.cluster.lease_ttl) == ("postgresql://agentd@db/agentd", 2, 5.0)
    config.write_text("cluster:\n  dns: postgresql://agentd@db/agentd\n")
    with pytest.raises(ConfigError, match=r"unknown key 'dns' @ \$\.cluster\.dns"):
        load_config([*BASE, "--config", str(config)], env={})


@pytest.mark.parametrize(("extra", "message"), [
    (["--cluster", "postgresql://agentd:Secret-123@db/agentd"], "literal password"),
    (["--cluster", "postgresql://agentd@db/agentd", "--state-dir", "/tmp/x"], "mutually exclusive"),
    (["--cluster", "postgresql://agentd@db/agentd", "--cluster-capacity", "-1"], "--cluster-capacity"),
    (["--cluster", "mysql://db/agentd"], "not a PostgreSQL DSN"),
])
def test_refusals_are_exit_2_and_never_echo_a_password(extra, message):
    with pytest.raises(ConfigError, match=message) as caught:
        load_config([*BASE, *extra], env={})
    assert "Secret-123" not in str(caught.value)


def test_psycopg_is_not_imported_without_cluster():
    code = ("import sys; from agentd.config import load_config; import agentd.daemon, agentd.cli; "
            "load_config(['--intelligence', 'test', '--instruction', 'x'], env={}); "
            "print('psycopg' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


async def _cli(*args: str, env_extra: dict[str, str] | None = None) -> tuple[int, dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT", "PG"))}
    env.update({"PGPASSWORD": PASSWORD, **(env_extra or {})})
    with trio.fail_after(60):
        done = await trio.run_process([sys.executable, "-m", "agentd", "cluster", *args], capture_stdout=True,
                                      capture_stderr=True, check=False, env=env, cwd=ROOT)
    out = done.stdout.decode()
    return done.returncode, json.loads(out) if out.strip() else {}, done.stderr.decode()


async def test_migrate_submit_show_status(pg_dsn):
    code, doc, err = await _cli("migrate", "--cluster", pg_dsn)
    assert code == 0, err
    assert doc["from"] == 0 and doc["to"] >= 1 and PASSWORD not in json.dumps(doc)
    code, doc, _ = await _cli("migrate", env_extra={"AGENTD_CLUSTER": pg_dsn})
    assert code == 0 and doc["from"] == doc["to"]
    code, doc, _ = await _cli("submit", "--cluster", pg_dsn, "--instruction", "do it", "--id", "job-1")
    assert code == 0 and doc == {"handle": "job-1", "created": True}
    code, doc, _ = await _cli("submit", "--cluster", pg_dsn, "--instruction", "do it", "--id", "job-1")
    assert code == 0 and doc == {"handle": "job-1", "created": False}
    code, doc, _ = await _cli("show", "job-1", "--cluster", pg_dsn)
    assert code == 0 and doc["status"] == "queued" and doc["done"] is False and doc["attempts"] == 0
    code, doc, _ = await _cli("status", "--cluster", pg_dsn)
    assert code == 0 and doc["queued"] == 1 and doc["members"] == [] and doc["oldest_queued_age"] >= 0
    code, doc, _ = await _cli("show", "nope", "--cluster", pg_dsn)
    assert code == 1 and "no work item" in doc["error"]


async def test_cli_faults(pg_server, free_port):
    code, _, err = await _cli("status", "--cluster", f"postgresql://agentd@127.0.0.1:{free_port}/x")
    assert code == 6 and f"127.0.0.1:{free_port}/x" in err
    code, _, err = await _cli("status", "--cluster", pg_server.dsn("postgres").replace("agentd@", "agentd:pw@"))
    assert code == 2 and "literal password" in err
    code, _, err = await _cli("status")
    assert code == 2 and "no database" in err
