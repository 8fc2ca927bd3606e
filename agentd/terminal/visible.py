"""Text from servers, peers, models and children, made safe to draw on a terminal: :func:`visible`.

A tool's name, a server's error message, a model's reply or a child's stderr line may hold terminal control
sequences (an OSC title or hyperlink, a cursor move, a screen clear, a CSI introduced by the one-character
C1 ``U+009B``). Written raw they act on the reader's terminal instead of being read. Every human view (the
live view, ``agentd trace``, ``agentd check``'s table, ``--output human`` and error lines) passes such text
through :func:`visible` before it is styled: the C0 controls but newline and tab, DEL and the C1 controls
become ``\\xNN`` escapes, so the text stays readable and nothing in it reaches the terminal as a control.
The Unicode bidirectional controls (the embeddings, overrides and isolates, and the marks) become ``\\uNNNN``:
drawn raw they reorder what follows them on the line, so a tool name or an argument could read as something
it is not (the "Trojan Source" trick).
agentd's own colours are added afterwards (by rich), so they are kept. Standard library only.
"""

from __future__ import annotations

import re
from typing import Final

#: C0 controls except tab (0x09) and newline (0x0a), DEL, the C1 controls, and the bidirectional controls
#: (ALM, LRM/RLM, LRE/RLE/PDF/LRO/RLO, LRI/RLI/FSI/PDI).
_CONTROLS: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with every control character but newline and tab shown as ``\\xNN`` (the same object when
    there is none)."""
    return _CONTROLS.sub(_escape, text) if _CONTROLS.search(text) else text


def visible_line(text: str) -> str:
    """:func:`visible` for text that must stay on one line: a newline and a tab are shown as ``\\n`` and ``\\t``."""
    return visible(text).replace("\n", "\\n").replace("\t", "\\t")
