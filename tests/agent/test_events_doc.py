"""docs/events.md documents every event in the closed vocabulary."""

from __future__ import annotations

import re
from pathlib import Path

from agentd.telemetry.events import VOCABULARY

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def test_every_event_has_a_row() -> None:
    rows = set(re.findall(r"^\| `([a-z0-9_]+\.[a-z0-9_.]+)` \|", DOC.read_text(), re.MULTILINE))
    missing = sorted(VOCABULARY - rows)
    assert not missing, f"events without a row in docs/events.md: {missing}"
    unknown = sorted(rows - VOCABULARY)
    assert not unknown, f"rows in docs/events.md for events not in VOCABULARY: {unknown}"
