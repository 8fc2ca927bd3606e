"""Run ids: one formula for every run agentd starts (a once run, a wake, ``agentd run``, a served spawn).

A leaf, so that any layer can mint an id without importing the part that runs it.
"""

from __future__ import annotations

import os
import secrets
import time


def new_run_id() -> str:
    """Time, pid and a random tag: sortable, readable, and distinct for concurrent runs in one process."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}-{secrets.token_hex(3)}"
