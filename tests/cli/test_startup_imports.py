"""Each command imports exactly the heavy modules scripts/bench/startup.py lists for it (untimed).

The table lives with the start-up benchmark (:data:`COMMANDS`), so the numbers in docs/benchmarks.md and
this check describe the same command lines. A heavy import creeping onto a light path (``--help`` loading
the run machinery, a once run without servers loading jsonschema, hypercorn or the journal) fails here; so
does a command that stopped needing one, until the table says so.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "startup.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agentd_bench_startup", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # NamedTuple classes look their module up while being built
    spec.loader.exec_module(module)
    return module


startup = _bench()


@pytest.mark.parametrize("command", startup.COMMANDS, ids=lambda c: c.name)
def test_command_imports_exactly_its_heavy_modules(command: object, tmp_path: Path) -> None:
    startup.scratch(str(tmp_path))
    argv = startup.argv_of(command, str(tmp_path))
    found = startup.heavy_imports(argv, startup._env(command.env))  # type: ignore[attr-defined]
    assert sorted(found) == sorted(command.heavy)  # type: ignore[attr-defined]


def test_once_run_loads_no_spawn_or_control_machinery_before_its_first_request() -> None:
    loaded = startup.modules_at_first_request(startup._env())
    assert "agentd.intelligence.offline" in loaded  # the probe really stopped at the offline model's request
    assert sorted(loaded & set(startup.NOT_BEFORE_FIRST_REQUEST)) == []


def test_the_checker_sees_a_heavy_import(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sqlite3, agentd.config.argv"]
    assert startup.heavy_imports(argv, startup._env()) == {"sqlite3"}
