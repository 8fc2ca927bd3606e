"""Write a benchmark's section into docs/benchmarks.md: the one place every ``--write`` goes through.

A section starts at its ``## Heading`` line and runs to the next ``## `` heading (or the end). Replacing
keeps it where it stands, so the document's order (the summary table first) survives reruns; a section
not there yet is appended.
"""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


def replace_section(heading: str, text: str, doc: Path = DOC) -> None:
    """Put ``text`` (which starts with ``heading``) in place of the section under ``heading``."""
    if not text.startswith(heading):
        raise ValueError(f"the section text must start with its heading {heading!r}")
    body = text.rstrip("\n") + "\n"
    current = doc.read_text() if doc.exists() else "# Benchmarks\n"
    lines = current.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == heading), None)
    if start is None:
        doc.write_text(current.rstrip("\n") + "\n\n" + body)
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    doc.write_text("".join(lines[:start]) + body + ("\n" + tail if tail else ""))
