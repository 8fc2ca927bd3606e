"""Start-up costs of the command line: what a user (and a subagent re-exec) pays before any work.

    .venv/bin/python scripts/bench/startup.py [--runs 15] [--before OTHER_TREE] [--write]

Measures, over ``--runs`` fresh processes per command, the median wall time and the median CPU time (user +
system, the figure other load on the machine disturbs least) of ``python -c pass`` (the floor) and of every
command in :data:`COMMANDS`; for the once run also the CPU time up to its first model request. Each row
names the heavy modules the command imports. With ``--write`` the results replace the "CLI start-up" section
of docs/benchmarks.md. ``--before`` names another checkout (with its own ``.venv``): the floor, ``--help`` and
the once run are then also measured there, interleaved run by run with this tree, and reported as ratios.

:data:`COMMANDS` is also what ``tests/cli/test_startup_imports.py`` checks (untimed): each command imports
exactly the heavy modules listed for it, so a heavy import that creeps onto a light path fails a test.
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final, NamedTuple

from agentd.config.load import load_config

ROOT = Path(__file__).resolve().parents[2]

#: What counts as heavy: third-party packages that cost milliseconds to import, and agentd's own big parts.
HEAVY = (
    "trio", "httpx", "httpcore", "h2", "hypercorn", "jsonschema", "cattrs", "yaml", "jwt", "rich", "click",
    "pygments", "cryptography", "sqlite3", "opentelemetry", "attr",
    "agentd.config.load", "agentd.daemon", "agentd.client", "agentd.journal", "agentd.journal.store",
    "agentd.mcp.streamable_http", "agentd.a2a", "agentd.selfmcp", "agentd.modes", "agentd.terminal.live",
)

_ONCE = ("--instruction", "hi", "--intelligence", "test")


class Command(NamedTuple):
    """One command line: its arguments (``{tmp}`` is a scratch directory), extra environment, and exactly
    which of :data:`HEAVY` it imports."""

    name: str
    args: tuple[str, ...]
    heavy: frozenset[str]
    env: Mapping[str, str] = {}


_RUNTIME = frozenset({"agentd.config.load", "trio", "attr", "agentd.client"})

COMMANDS: tuple[Command, ...] = (
    # attr: not for the help paths (the flag table and the CLI's own values are plain; docs/design/wiring.md).
    Command("agentd --version", ("--version",), frozenset()),
    Command("agentd --help", ("--help",), frozenset()),
    Command("agentd check --help", ("check", "--help"), frozenset()),
    Command("agentd completion bash", ("completion", "bash"), frozenset()),
    Command("agentd init --help", ("init", "--help"), frozenset()),
    # A mistyped command or flag: the flag table finds the closest name; attr only for the JSON error line.
    Command("agentd chek (mistyped command)", ("chek",), frozenset({"attr"})),
    Command("agentd --max-step 3 (mistyped flag)", ("--max-step", "3"), frozenset({"attr"})),
    Command("agentd run MANIFEST --modle m (mistyped flag)", ("run", "{tmp}/agent.yaml", "--modle", "m"),
            frozenset({"attr"})),
    Command("agentd --validate-config", (*_ONCE, "--validate-config"), frozenset({"agentd.config.load", "attr"})),
    Command("agentd --validate-config --config FILE", (*_ONCE, "--validate-config", "--config", "{tmp}/agentd.yaml"),
            frozenset({"agentd.config.load", "attr", "cattrs", "yaml"})),
    # agentd.journal: the token ledger (agentd/journal/ledger.py), without the store and its records; cattrs
    # only on the first spawn (agentd/supervisor/wiring.py).
    Command("agentd --instruction hi --intelligence test (once run)", _ONCE,
            _RUNTIME | {"agentd.daemon", "agentd.journal"}),
    Command("agentd check (one refused server)", ("check", "--mcp", "s=http://127.0.0.1:9/mcp"),
            _RUNTIME | {"cattrs", "httpx", "httpcore", "h2", "agentd.mcp.streamable_http"}),
    Command("agentd report FILE (missing)", ("report", "{tmp}/missing.json"), frozenset({"attr"})),
    Command("agentd trace FILE (missing)", ("trace", "{tmp}/missing.jsonl"), frozenset({"attr"})),
    Command("agentd ctl status (no daemon listening)", ("ctl", "status", "--socket", "{tmp}/ctl.sock"),
            frozenset({"trio", "attr"})),
    Command("agentd journal list --state-dir DIR", ("journal", "list", "--state-dir", "{tmp}/state"),
            frozenset({"trio", "attr", "sqlite3", "agentd.journal", "agentd.journal.store"})),
    Command("subagent dispatch (AGENT_SUBAGENT=1, EOF)", (), frozenset({"trio", "attr", "agentd.journal"}),
            {"AGENT_SUBAGENT": "1"}),
)


#: The commands a person types to be helped, which must answer without the run machinery: their CPU is held
#: to :data:`LIGHT_BOUND` times that of ``python -c "import trio"`` (reported, never asserted: the table above
#: pins what they import).
LIGHT: Final = ("agentd --help", "agentd completion bash", "agentd chek (mistyped command)",
                "agentd --max-step 3 (mistyped flag)")
LIGHT_BOUND: Final = 1.2
TRIO_ROW: Final = "python -c 'import trio'"


#: What a once run (no servers, no subagent) has not imported when it sends its first model request: the
#: supervisor's node, fork server, idle-ping timer, channel, wire messages and statistics load with the first
#: spawn, the token ledger's books with the first admission or usage report (after the first reply), the
#: operator's controls with a SIGHUP or a control socket, the report recorder with a served event stream or
#: ``--report-file``. ``tests/cli/test_startup_imports.py`` checks it.
NOT_BEFORE_FIRST_REQUEST = (
    "agentd.supervisor.node", "agentd.supervisor.forkserver", "agentd.supervisor.idlepings",
    "agentd.supervisor.channel", "agentd.supervisor.messages", "agentd.supervisor.statistics",
    "agentd.journal.ledger", "agentd.ctl.commands", "agentd.ctl.reload", "agentd.telemetry.report",
)


#: On PYTHONPATH: click unimportable, as where agentd is installed alone (plain_site/sitecustomize.py says why).
PLAIN_SITE = Path(__file__).resolve().parent / "plain_site"
#: What plain_site blocks: ``-X importtime`` lists an import that was refused too, so these are not counted.
BLOCKED = frozenset({"click"})


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "AGENTD_", "OTEL_"))}
    env["PYTHONPATH"] = str(PLAIN_SITE)
    env.update(extra or {})
    return env


def argv_of(command: Command, tmp: str) -> list[str]:
    return [sys.executable, "-m", "agentd", *(a.replace("{tmp}", tmp) for a in command.args)]


def scratch(tmp: str) -> None:
    """The files the commands refer to: a config file; a state directory is created by the journal itself."""
    Path(tmp, "agentd.yaml").write_text(
        "mcp_servers:\n  - {name: fs, url: 'https://mcp-fs.internal/mcp'}\nmax_steps: 9\n")


def heavy_imports(argv: list[str], env: Mapping[str, str]) -> set[str]:
    """Which of :data:`HEAVY` the command imports (``python -X importtime``: every module, nothing run twice)."""
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=dict(env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, check=False, cwd=ROOT, timeout=120)
    names = {m.group(1).strip() for m in re.finditer(r"^import time:\s*\d+ \|\s*\d+ \|(.*)$", proc.stderr, re.M)}
    return {h for h in HEAVY if h in names and h not in BLOCKED}


def _timed(argv: list[str], runs: int, env: Mapping[str, str], cwd: Path = ROOT) -> tuple[float, float]:
    """Median wall and median CPU (user + system of the child), in ms."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, env=dict(env), stdin=subprocess.DEVNULL, capture_output=True, check=False, cwd=cwd)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


#: The once run (as ``python -m agentd`` runs it) with the offline model's ``complete`` wrapped to print the
#: process CPU time of its first call.
_FIRST_REQUEST = """
import sys, time
from agentd.intelligence.offline import OfflineIntelligence
from agentd.cli import console_main
complete, first = OfflineIntelligence.complete, []
async def timed(self, *args, **kwargs):
    if not first:
        first.append(time.process_time())
        print(f"FIRST {first[0]:.6f}", file=sys.__stderr__, flush=True)
    return await complete(self, *args, **kwargs)
OfflineIntelligence.complete = timed
console_main()
"""


#: The once run, stopped at its first model request: prints which modules are loaded by then, one a line.
_MODULES_AT_FIRST_REQUEST = """
import os, sys
from agentd.intelligence.offline import OfflineIntelligence
from agentd.cli import console_main
async def stop(self, *args, **kwargs):
    sys.__stdout__.write("\\n".join(sorted(sys.modules)) + "\\n")
    sys.__stdout__.flush()
    os._exit(0)
OfflineIntelligence.complete = stop
console_main()
"""


def modules_at_first_request(env: Mapping[str, str]) -> set[str]:
    """The modules a once run has imported when it sends its first model request."""
    proc = subprocess.run([sys.executable, "-c", _MODULES_AT_FIRST_REQUEST, *_ONCE], env=dict(env), text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, check=True, cwd=ROOT, timeout=120)
    return set(proc.stdout.split())


def first_request_cpu_ms(runs: int, env: Mapping[str, str]) -> float:
    """Median process CPU time of the once run up to its first model request, in ms."""
    found = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", _FIRST_REQUEST, *_ONCE], env=dict(env), capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, check=False, cwd=ROOT)
        match = re.search(r"^FIRST ([0-9.]+)$", proc.stderr, re.M)
        if match:
            found.append(float(match.group(1)) * 1000)
    return statistics.median(found) if found else float("nan")


def compare(before: Path, runs: int) -> list[tuple[str, float, float]]:
    """CPU medians (ms) of a few commands in ``before`` and in this tree, interleaved: (name, before, after)."""
    trees = {"before": before.resolve(), "after": ROOT}
    cases = {"python -c pass": ["-c", "pass"], "agentd --help": ["-m", "agentd", "--help"],
             "once run": ["-m", "agentd", *_ONCE]}
    cpu: dict[tuple[str, str], list[float]] = {}
    for _ in range(runs):
        for name, args in cases.items():
            for which, tree in trees.items():
                _, ms = _timed([str(tree / ".venv" / "bin" / "python"), *args], 1, _env(), cwd=tree)
                cpu.setdefault((name, which), []).append(ms)
    return [(name, statistics.median(cpu[name, "before"]), statistics.median(cpu[name, "after"])) for name in cases]


class Row(NamedTuple):
    name: str
    wall_ms: float
    cpu_ms: float
    heavy: set[str]


def measure(runs: int) -> tuple[list[Row], float]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch(tmp)
        wall, cpu = _timed([sys.executable, "-c", "pass"], runs, _env())
        rows.append(Row("python -c pass", wall, cpu, set()))
        # The floor of any run: the interpreter, trio and attrs (which trio imports too), nothing of agentd.
        wall, cpu = _timed([sys.executable, "-c", "import trio, attrs"], runs, _env())
        rows.append(Row("python -c 'import trio, attrs' (a run's floor)", wall, cpu, {"trio", "attr"}))
        # The yardstick of the commands that must answer at once (LIGHT): at most LIGHT_BOUND times this.
        wall, cpu = _timed([sys.executable, "-c", "import trio"], runs, _env())
        rows.append(Row(TRIO_ROW, wall, cpu, {"trio", "attr"}))
        for command in COMMANDS:
            argv, env = argv_of(command, tmp), _env(command.env)
            wall, cpu = _timed(argv, runs, env)
            rows.append(Row(command.name, wall, cpu, heavy_imports(argv, env)))
        first = first_request_cpu_ms(runs, _env())
    return rows, first


def from_argv_ms(iterations: int = 500) -> float:
    sys.path.insert(0, str(ROOT))

    argv = ["--instruction", "x", "--intelligence", "test", "--mcp", "a=https://a/mcp", "--max-steps", "9"]
    load_config(argv, env={})
    start = time.perf_counter()
    for _ in range(iterations):
        load_config(argv, env={})
    return (time.perf_counter() - start) / iterations * 1000


def section(rows: list[Row], first_ms: float, parse_ms: float, command: str, runs: int,
            compared: list[tuple[str, float, float]] | None = None) -> str:
    lines = [
        "## CLI start-up",
        "",
        f"Command: `{command}` (median of {runs} fresh processes each; PYTHONDONTWRITEBYTECODE="
        f"{os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')}; load average at start "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores). CPU is user + system time of the process, the "
        "figure other load disturbs least; wall times on a shared machine move with the load.",
        *([f"The machine was loaded when this was measured (load average {os.getloadavg()[0]:.1f} on "
           f"{os.cpu_count()} cores, other work running): wall times are far above an idle machine's; the "
           "CPU column and the ratios are the figures to compare. To be re-measured quiet."]
          if os.getloadavg()[0] > (os.cpu_count() or 1) else []),
        "",
        "| command | median wall (ms) | median CPU (ms) | CPU minus `python -c pass` (ms) | heavy modules imported |",
        "|---|---|---|---|---|",
    ]
    floor = rows[0].cpu_ms
    for row in rows:
        lines.append(f"| `{row.name}` | {row.wall_ms:.0f} | {row.cpu_ms:.0f} | {row.cpu_ms - floor:.0f} | "
                     f"{', '.join(sorted(row.heavy)) or '—'} |")
    once = next(row for row in rows if "(once run)" in row.name)
    trio_cpu = next(row.cpu_ms for row in rows if row.name == TRIO_ROW)
    light = [row for row in rows if row.name in LIGHT]
    worst = max(light, key=lambda row: row.cpu_ms)
    lines += [
        "",
        f"Help, completion and did-you-mean (`{'`, `'.join(row.name for row in light)}`) against "
        f"`{TRIO_ROW}` ({trio_cpu:.0f} ms): at most **{worst.cpu_ms / trio_cpu:.2f}×** (`{worst.name}`; "
        f"target: at most {LIGHT_BOUND}×).",
    ]
    lines += [
        "",
        f"The once run (`--instruction hi --intelligence test`, no servers): **{first_ms:.0f} ms** of CPU up to its "
        f"first model request, **{once.cpu_ms:.0f} ms** to exit (targets: under 300 and 350 ms).",
        "",
    ]
    if compared:
        floor_before, floor_after = compared[0][1], compared[0][2]
        lines += [
            f"Against the `--before` tree, interleaved run by run ({runs} each; CPU medians, ms):",
            "",
            "| command | before | after | after ÷ before | over the floor, before → after |",
            "|---|---|---|---|---|",
            *(f"| `{name}` | {b:.0f} | {a:.0f} | {a / b:.2f}× | {b - floor_before:.0f} → {a - floor_after:.0f} |"
              for name, b, a in compared),
            "",
        ]
    lines += [
        f"`load_config` in-process (4 flags, one `--mcp`): {parse_ms:.2f} ms per call. "
        "`tests/cli/test_startup_imports.py` pins the heavy-modules column (untimed). The subagent dispatch "
        "row includes `agentd.child`'s own imports (trio); the CLI adds only `agentd.cli` before handing over. "
        "Every tree's bytecode is compiled first: with PYTHONDONTWRITEBYTECODE=1 an edited module's stale cache "
        "would be recompiled in every measured process.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--before", type=Path, help="another checkout (with .venv) to compare against")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    for tree in (ROOT, *((args.before,) if args.before else ())):
        compileall.compile_dir(str(Path(tree) / "agentd"), quiet=1)
    rows, first = measure(args.runs)
    compared = compare(args.before, args.runs) if args.before else None
    parse_ms = from_argv_ms()
    command = ".venv/bin/python scripts/bench/startup.py" + (f" --runs {args.runs}" if args.runs != 15 else "") + \
        (" --before OTHER_TREE" if args.before else "") + " --write"
    text = section(rows, first, parse_ms, command, args.runs, compared)
    print(text)
    if args.write:
        from bench_doc import replace_section

        replace_section("## CLI start-up", text)


if __name__ == "__main__":
    main()
