"""agentd.config and agentd.secrets are leaves-only: no trio, httpx, hypercorn or jsonschema behind them."""

import subprocess
import sys


def test_config_imports_no_runtime() -> None:
    code = ("import sys, agentd.config.load, agentd.config.file, agentd.config.cron, agentd.secrets\n"
            "bad = [m for m in ('trio', 'httpx', 'hypercorn', 'jsonschema') if m in sys.modules]\n"
            "print(','.join(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""
