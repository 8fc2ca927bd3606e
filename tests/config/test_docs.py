"""docs/cli.md's flag table is generated from the flag table; it must be current."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_doc_is_current() -> None:
    proc = subprocess.run([sys.executable, "scripts/gen_cli_docs.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_every_flag_is_documented() -> None:
    from agentd.config.argv import FLAGS

    doc = (ROOT / "docs" / "cli.md").read_text()
    for flag in FLAGS:
        assert f"`{flag.name}" in doc
