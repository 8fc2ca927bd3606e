"""``agentd init [DIR]``: a starter DIR/agentd.yaml that is valid as written, from anywhere, with an empty
environment, and that is never replaced without ``--force``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from agentd.config.argv import FLAGS_BY_FILE_KEY
from agentd.config.starter import starter_text
from tests.cli.helpers import run_agentd


def _bare(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """agentd with nothing at all in its environment (no HOME, no PATH, no AGENTD_*)."""
    return subprocess.run([sys.executable, "-m", "agentd", *args], env={}, cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)


def test_init_creates_the_directory_and_a_file_that_validates_and_runs_from_elsewhere(tmp_path: Path) -> None:
    target = tmp_path / "new" / "agent"
    out = run_agentd(["init", str(target)], cwd=str(tmp_path))
    assert out.code == 0, out.stderr
    written = target / "agentd.yaml"
    assert out.document == {"written": str(written)}
    assert written.read_text() == starter_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    checked = _bare(["--config", str(written), "--validate-config"], elsewhere)
    assert checked.returncode == 0, checked.stderr
    document = json.loads(checked.stdout)
    assert document["valid"] is True and document["config"]["intelligence"] == ["test"]
    ran = _bare(["--config", str(written)], elsewhere)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["status"] == "completed"


def test_init_without_a_directory_writes_here(tmp_path: Path) -> None:
    out = run_agentd(["init"], cwd=str(tmp_path))
    assert out.code == 0 and out.document == {"written": str(tmp_path / "agentd.yaml")}


def test_an_existing_file_is_kept_unless_forced(tmp_path: Path) -> None:
    assert run_agentd(["init", str(tmp_path)]).code == 0
    mine = tmp_path / "agentd.yaml"
    mine.write_text("max_steps: 7\n")
    refused = run_agentd(["init", str(tmp_path)])
    assert refused.code == 2 and refused.stdout == ""
    [event] = refused.events
    assert event["event"] == "config.invalid" and "--force" in event["error"]
    assert mine.read_text() == "max_steps: 7\n"
    forced = run_agentd(["init", str(tmp_path), "--force"])
    assert forced.code == 0 and mine.read_text() == starter_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agentd.yaml"]  # no temporary file left behind


def test_a_directory_that_cannot_be_made_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    out = run_agentd(["init", str(tmp_path / "file")])
    assert out.code == 2 and out.stdout == ""
    assert out.events[0]["event"] == "config.invalid"


def test_every_commented_setting_is_a_real_key() -> None:
    """The commented lines a person uncomments name keys the config file accepts."""
    keys = re.findall(r"^# ([a-z_]+): ", starter_text(), re.M)
    assert {"intelligence", "max_steps", "mode", "state_dir"} <= set(keys)
    assert set(keys) <= set(FLAGS_BY_FILE_KEY)
