"""A read-only window on a running daemon for ``agent://status``, published by run id.

The self-MCP server and the daemon mode are siblings in the daemon nursery and share no object, so the
mode publishes a snapshot function under its run id while it runs, and the served status reads it
(:func:`reactive_status_of`). Keyed by run id, two daemons in one process do not see each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

Snapshot = Callable[[], Mapping[str, Any]]

_PUBLISHED: dict[str, Snapshot] = {}


@contextlib.contextmanager
def published(run_id: str, snapshot: Snapshot) -> Iterator[None]:
    _PUBLISHED[run_id] = snapshot
    try:
        yield
    finally:
        if _PUBLISHED.get(run_id) is snapshot:
            del _PUBLISHED[run_id]


def reactive_status_of(run_id: str) -> Mapping[str, Any] | None:
    """The daemon's subscriptions (uri, server, origins, delivery), wakes, runs and lifetime budget, or
    None when no daemon mode runs under ``run_id``."""
    snapshot = _PUBLISHED.get(run_id)
    return snapshot() if snapshot is not None else None
