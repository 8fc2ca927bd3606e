"""Who reads a stream: a person (draw for them) or a program (JSON). Standard library only, so deciding costs
nothing on the start-up path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a closed or odd stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def wants_human(choice: str | None, stream: Any) -> bool:
    """``human`` or ``json`` as given; ``auto`` (or None) is human exactly when ``stream`` is a terminal."""
    if choice == "human":
        return True
    if choice == "json":
        return False
    return is_terminal(stream)


def color_allowed(env: Mapping[str, str]) -> bool:
    """``NO_COLOR`` (any non-empty value, https://no-color.org) turns colour and styling off."""
    return not env.get("NO_COLOR")
