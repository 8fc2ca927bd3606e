"""agentd.journal sits below the run composition: it imports only leaves of agentd, checked on the AST
(the metrics facade is one: its commit lag and queue are recorded where the commits happen; so is the 0600
file helper that creates the journal's files)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "agentd" / "journal"
ALLOWED_AGENTD = {"agentd.defaults", "agentd.errors", "agentd.telemetry.events", "agentd.formats.ids", "agentd.telemetry.metrics",
                  "agentd.telemetry.private_files", "agentd.formats.jsontext"}


def test_journal_imports_only_leaves():
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) >= 6
    found = []
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("agentd") and not name.startswith("agentd.journal") and name not in ALLOWED_AGENTD:
                    found.append(f"{path.name}:{node.lineno} imports {name}")
    assert found == []
