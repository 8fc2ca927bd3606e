"""``agentd cluster`` at a terminal draws for a person; through a pipe (or with ``--json``) it is the JSON
document as always. Against a real PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cli.helpers import clean_env
from tests.postgres import PASSWORD
from tests.terminal.pty_run import run_in_pty


def test_cluster_commands_draw_at_a_terminal_and_stay_json_through_a_pipe(pg_dsn: str) -> None:
    env = {"PGPASSWORD": PASSWORD}
    code, screen, _ = run_in_pty(["cluster", "migrate", "--cluster", pg_dsn], stdout_tty=True, env=env)
    assert code == 0 and "schema" in screen and "→" in screen, screen
    code, screen, _ = run_in_pty(["cluster", "submit", "--cluster", pg_dsn, "--instruction", "x", "--id",
                                  "job-\x1b[31m1"], stdout_tty=True, env=env)
    assert code == 0 and "queued" in screen
    assert "\x1b[31m1" not in screen and "\\x1b" in screen  # a control character in a handle is shown, not run
    code, screen, _ = run_in_pty(["cluster", "status", "--cluster", pg_dsn], stdout_tty=True, env=env)
    assert code == 0 and "1 queued" in screen and "no live member" in screen, screen
    code, screen, _ = run_in_pty(["cluster", "show", "job-\x1b[31m1", "--cluster", pg_dsn], stdout_tty=True, env=env)
    assert code == 0 and "queued" in screen and "attempts 0" in screen, screen
    code, screen, _ = run_in_pty(["cluster", "show", "nope", "--cluster", pg_dsn], stdout_tty=True, env=env)
    assert code == 1 and "agentd cluster show: no work item 'nope'" in screen
    code, screen, _ = run_in_pty(["cluster", "status", "--cluster", pg_dsn, "--json"], stdout_tty=True, env=env)
    assert code == 0 and json.loads(screen.strip().splitlines()[-1])["queued"] == 1
    piped = subprocess.run([sys.executable, "-m", "agentd", "cluster", "status", "--cluster", pg_dsn],
                           env=clean_env(env), capture_output=True, text=True, timeout=60, check=False)
    assert piped.returncode == 0 and json.loads(piped.stdout)["queued"] == 1
    assert PASSWORD not in piped.stdout + piped.stderr
