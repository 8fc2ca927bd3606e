"""Run ids: one formula for every run agentd starts (a once run, a wake, ``agentd run``, a served spawn); and
the idempotency key of every tool call a run makes (``_meta["io.modelcontextprotocol/idempotency-key"]``).

A leaf, so that any layer can mint an id without importing the part that runs it.
"""

from __future__ import annotations

import os
import secrets
import time


def new_run_id() -> str:
    """Time, pid and a random tag: sortable, readable, and distinct for concurrent runs in one process."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}-{secrets.token_hex(3)}"


def new_key_nonce() -> str:
    """The random part of one run's tool-call idempotency keys (:func:`call_key`): minted once per run, and
    journaled with it (``RunStarted.key_nonce``) so a resumed run names its calls as the first process did."""
    return secrets.token_hex(8)


def call_key(run_id: str, nonce: str, step: int, index: int) -> str:
    """The idempotency key of the ``index``-th tool call (0-based, the model's order) of ``step`` of one run.

    The same for every send of that call: a re-send after a reconnect reuses it, a run resumed from its journal
    derives it again from the journaled nonce, step and order; a cluster member taking over a work item reads the
    same journal. Distinct for every other call: the run id and the per-run nonce set runs apart (two turns of
    one warm child session share a run id, not a nonce), the step and index set calls within a run apart. A run
    journaled before the nonce existed resumes with ``nonce == ""``.
    """
    return f"{run_id}/{nonce}/{step}.{index}" if nonce else f"{run_id}/{step}.{index}"


def new_call_key() -> str:
    """The key of a tool call made outside any run's loop (a library caller of the pool): unique, used once."""
    return "call/" + secrets.token_hex(16)
