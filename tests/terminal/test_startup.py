"""rich stays off the start-up path: a run whose stderr is not a terminal never imports it, and a subagent
child never does, even when its parent draws for a person and the environment asks for the human view.

A ``sitecustomize`` on PYTHONPATH (children keep PYTHONPATH) records the pid of every process that imports rich.
It also keeps httpx from loading its own optional command-line client (``httpx._main`` imports rich when click
and pygments happen to be installed, as they are in the test environment): that import is httpx's, not agentd's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.helpers import clean_env
from tests.peers import launch
from tests.peers.gateway import gateway_argv

SITECUSTOMIZE = '''
import os, sys
sys.modules.setdefault("httpx._main", None)
_LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rich-imports.txt")


class _Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "rich":
            with open(_LOG, "a") as out:
                out.write(f"{os.getpid()}\\n")
        return None


sys.meta_path.insert(0, _Watch())
'''


@pytest.fixture
def watch(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return site


def _importers(site: Path) -> list[int]:
    log = site / "rich-imports.txt"
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def test_a_run_without_a_terminal_does_not_import_rich(watch: Path) -> None:
    env = clean_env({"PYTHONPATH": str(watch)})
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "agentd", "--instruction", "hi",
                           "--intelligence", "test"], capture_output=True, text=True, env=env, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert {"agentd.cli", "trio", "agentd.agent.runner"} <= imported  # the measurement saw the whole run
    assert not {name for name in imported if name == "rich" or name.startswith(("rich.", "agentd.terminal.live"))}
    assert _importers(watch) == []
    json.loads(done.stdout)


def test_a_child_never_imports_rich(watch: Path, tmp_path: Path, no_leftover_children) -> None:
    script = {"rules": [{"match": {"contains": "CHILD TASK"}, "reply": {"content": "child says hi"}},
                        {"match": {"last_role": "tool"}, "reply": {"content": "root done"}}],
              "default": {"tool_calls": [{"name": "subagent_spawn", "arguments": {"instruction": "CHILD TASK"}}]}}
    (tmp_path / "script.json").write_text(json.dumps(script))
    env = clean_env({"PYTHONPATH": str(watch), "AGENTD_LOG_FORMAT": "human"})
    with launch.start_peer(gateway_argv(tmp_path / "script.json")) as gw:
        proc = subprocess.Popen([sys.executable, "-m", "agentd", "--instruction", "ROOT TASK", "--intelligence",
                                 gw.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                                stdin=subprocess.DEVNULL)
        stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 0, stderr[-2000:]
    assert "└─ subagent 0.1 completed" in stderr  # the parent drew for a person (forced by the environment)
    assert _importers(watch) == [proc.pid]  # ... and it alone imported rich: no child, no fork server
    assert json.loads(stdout)["result"] == "root done"
    assert os.path.exists(watch / "rich-imports.txt")
