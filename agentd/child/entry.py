"""The child program's entry: ``python -m agentd`` under ``AGENT_SUBAGENT=1`` is either the fork server
(``AGENTD_FORKSERVER=<fd>``) or one child session. Dispatched before any argv parsing.

Both keep their imports to what a child runs (tests/supervisor/test_child_imports.py pins the heavy
modules they must not load): every module here is memory in each child (its RSS, and its private pages
once touched) and, for a re-exec, start-up CPU.
"""

from __future__ import annotations

import os
import sys


def child_main() -> int:
    """Run the fork server or one child session; returns the exit status."""
    without_httpx_cli()
    server_fd = os.environ.pop("AGENTD_FORKSERVER", None)
    if server_fd is not None and server_fd.isdigit():
        from agentd.child.forkserver import serve_forks

        return serve_forks(int(server_fd))
    from agentd.child.session import session_main

    return session_main()


def without_httpx_cli() -> None:
    """Keep httpx's command-line client out of this process.

    ``import httpx`` imports its CLI (``httpx._main``, which pulls in rich, click and pygments: ~6 MiB and
    ~0.1 s of CPU) whenever those happen to be installed, and falls back to a stub when the import fails.
    A child never runs that CLI, so the import is made to fail: a ``None`` entry in ``sys.modules`` is
    Python's documented way to make an import raise ImportError. Call before httpx is imported.
    """
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
