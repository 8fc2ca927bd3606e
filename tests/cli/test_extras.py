"""``--otel`` without the [otel] extra and ``--cluster`` without [cluster]: exit 2 before anything runs, no
result document, and the ``pip install`` line on stderr.

The test environment has both extras installed, so each case runs agentd as a real process whose import
system cannot find the extra's top-level package: ``python -c`` with :data:`WITHOUT` puts a meta-path finder
in front that answers "no such module" for the named packages, exactly what an interpreter without them says,
then runs the command line as ``python -m agentd`` does. Nothing of agentd is replaced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from agentd.config.extras import MODULES, missing
from tests.cli.helpers import Outcome, assert_untouched, clean_env, tripwire

ROOT = Path(__file__).resolve().parents[2]

#: ``python -c WITHOUT PACKAGES ARGS...``: agentd's command line in an interpreter where the comma-separated
#: top-level PACKAGES cannot be imported.
WITHOUT = """
import sys
blocked = frozenset(sys.argv[1].split(","))
class Without:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Without())
sys.argv = ["agentd", *sys.argv[2:]]
from agentd.cli import console_main
console_main()
"""


def _without(packages: str, args: list[str], env: Mapping[str, str] | None = None) -> Outcome:
    proc = subprocess.run([sys.executable, "-c", WITHOUT, packages, *args], env=clean_env(env), cwd=ROOT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def _refused(out: Outcome, extra: str) -> None:
    assert out.code == 2, out.stderr
    assert out.stdout == ""
    [event] = out.events
    assert event["event"] == "config.invalid" and event["exit_code"] == 2
    assert f"pip install 'agentd-trio[{extra}]'" in event["error"]
    assert "ModuleNotFoundError" not in out.stderr and "unexpected" not in out.stderr


def test_the_device_makes_the_packages_unimportable() -> None:
    """The device itself: the blocked packages are missing, the rest of the standard library is not."""
    code = WITHOUT.replace("from agentd.cli import console_main\nconsole_main()\n",
                           "import importlib\n"
                           "for name in ('opentelemetry.sdk', 'psycopg', 'json'):\n"
                           "    try:\n        importlib.import_module(name); print(name, 'ok')\n"
                           "    except ModuleNotFoundError: print(name, 'missing')\n")
    proc = subprocess.run([sys.executable, "-c", code, "opentelemetry,psycopg"], capture_output=True, text=True,
                          timeout=60, check=True)
    assert proc.stdout.split("\n")[:3] == ["opentelemetry.sdk missing", "psycopg missing", "json ok"]


@pytest.mark.parametrize("how", ["flag", "environment", "file"])
def test_otel_without_its_extra(how: str, tmp_path: Path) -> None:
    args, env = ["--instruction", "hi", "--intelligence", "test"], {}
    if how == "flag":
        args.append("--otel")
    elif how == "environment":
        env["AGENTD_OTEL"] = "1"
    else:
        (tmp_path / "agentd.yaml").write_text("telemetry: {otel: true}\n")
        args += ["--config", str(tmp_path / "agentd.yaml")]
    _refused(_without("opentelemetry", args, env), "otel")
    _refused(_without("opentelemetry", [*args, "--validate-config"], env), "otel")


def test_otel_with_the_sdk_disabled_needs_nothing() -> None:
    out = _without("opentelemetry", ["--instruction", "hi", "--intelligence", "test", "--otel"],
                   {"OTEL_SDK_DISABLED": "true"})
    assert out.code == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "completed"


def test_cluster_without_its_extra_touches_nothing() -> None:
    with tripwire() as sock:
        port = sock.getsockname()[1]
        out = _without("psycopg", ["--intelligence", "test", "--cluster", f"postgresql://agentd@127.0.0.1:{port}/db",
                                   "--serve-mcp", "http://127.0.0.1:0/mcp"])
        _refused(out, "cluster")
        assert_untouched(sock)
        _refused(_without("psycopg", ["cluster", "status", "--cluster", f"postgresql://agentd@127.0.0.1:{port}/db"]),
                 "cluster")
        assert_untouched(sock)


def test_a_person_at_a_terminal_reads_the_install_line() -> None:
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", WITHOUT, "opentelemetry", "--instruction", "hi",
                             "--intelligence", "test", "--otel"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, env=clean_env(), cwd=ROOT)
    os.close(slave)
    screen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the process is gone
            break
        if not chunk:
            break
        screen += chunk
    os.close(master)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and stdout == b""
    assert b"pip install 'agentd-trio[otel]'" in screen and b"{" not in screen


def test_with_the_extras_installed_nothing_is_missing() -> None:
    assert {extra: missing(extra) for extra in MODULES} == {"otel": None, "cluster": None}
