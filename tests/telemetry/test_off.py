"""Tracing and metrics are off by default and then cost no import: a whole run loads nothing from
OpenTelemetry or prometheus_client, and an event line carries no trace ids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("opentelemetry", "prometheus_client", "google.protobuf")


def test_a_run_with_telemetry_off_imports_no_sdk() -> None:
    code = (
        "import sys\n"
        "from agentd.cli import main\n"
        "code = main(['--instruction', 'x', '--intelligence', 'test'], env={})\n"
        f"bad = sorted({{m.split('.')[0] for m in sys.modules if m.startswith({HEAVY!r})}})\n"
        "print(json.dumps({'code': code, 'bad': bad}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    report = json.loads(lines[-1])
    assert report == {"code": 0, "bad": []}
    assert json.loads(lines[0])["status"] == "completed"
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    assert events and not any("trace_id" in e or "span_id" in e for e in events)
