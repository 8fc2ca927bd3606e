"""Start-up costs of the command line: what a user (and a subagent re-exec) pays before any work.

    .venv/bin/python scripts/bench/startup.py [--runs 15] [--write]

Measures, as the median over ``--runs`` fresh processes: ``python -c pass`` (the floor), ``agentd
--version``, ``agentd --help``, ``--validate-config`` with and without a YAML ``--config`` file, and the
subagent dispatch with an empty control channel; plus ``Config.from_argv`` in-process and which heavy
modules each command imports. With ``--write`` the results replace the "CLI start-up" section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_doc import replace_section

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("trio", "httpx", "hypercorn", "jsonschema", "cattrs", "yaml", "jwt")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "AGENTD_"))}
    env.update(extra or {})
    return env


def _wall(argv: list[str], runs: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False, cwd=ROOT)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _heavy_imports(argv: list[str], env: dict[str, str]) -> list[str]:
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, check=False, cwd=ROOT)
    found = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name in HEAVY:
                found.add(name)
    return sorted(found)


def measure(runs: int) -> dict[str, tuple[float, list[str]]]:
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "agentd.yaml"
        config.write_text("mcp_servers:\n  - {name: fs, url: 'https://mcp-fs.internal/mcp'}\nmax_steps: 9\n")
        base = [py, "-m", "agentd", "--instruction", "x", "--intelligence", "test", "--validate-config"]
        cases = {
            "python -c pass": ([py, "-c", "pass"], _env()),
            "agentd --version": ([py, "-m", "agentd", "--version"], _env()),
            "agentd --help": ([py, "-m", "agentd", "--help"], _env()),
            "agentd --validate-config": (base, _env()),
            "agentd --validate-config --config FILE": ([*base, "--config", str(config)], _env()),
            "subagent dispatch (AGENT_SUBAGENT=1, EOF)": ([py, "-m", "agentd"], _env({"AGENT_SUBAGENT": "1"})),
        }
        return {name: (_wall(argv, runs, env), _heavy_imports(argv, env)) for name, (argv, env) in cases.items()}


def from_argv_ms(iterations: int = 500) -> float:
    sys.path.insert(0, str(ROOT))
    from agentd.config import Config

    argv = ["--instruction", "x", "--intelligence", "test", "--mcp", "a=https://a/mcp", "--max-steps", "9"]
    Config.from_argv(argv, env={})
    start = time.perf_counter()
    for _ in range(iterations):
        Config.from_argv(argv, env={})
    return (time.perf_counter() - start) / iterations * 1000


def section(results: dict[str, tuple[float, list[str]]], parse_ms: float, command: str, runs: int) -> str:
    lines = [
        "## CLI start-up",
        "",
        f"Command: `{command}` (median of {runs} fresh processes each; PYTHONDONTWRITEBYTECODE="
        f"{os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')}; load average at start "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores).",
        "",
        "| command | median wall (ms) | minus `python -c pass` (ms) | heavy modules imported |",
        "|---|---|---|---|",
    ]
    floor = results["python -c pass"][0]
    for name, (ms, heavy) in results.items():
        lines.append(f"| `{name}` | {ms:.0f} | {ms - floor:.0f} | {', '.join(heavy) or '—'} |")
    lines += [
        "",
        f"`Config.from_argv` in-process (4 flags, one `--mcp`): {parse_ms:.2f} ms per call. The subagent dispatch "
        "row includes `agentd.child`'s own imports (trio); the CLI adds only `agentd.cli` (+ attrs) "
        "before handing over. Wall times on this shared 2-core machine move with the load average.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    results = measure(args.runs)
    parse_ms = from_argv_ms()
    command = ".venv/bin/python scripts/bench/startup.py" + (f" --runs {args.runs}" if args.runs != 15 else "") + \
        " --write"
    text = section(results, parse_ms, command, args.runs)
    print(text)
    if args.write:
        replace_section("## CLI start-up", text)


if __name__ == "__main__":
    main()
