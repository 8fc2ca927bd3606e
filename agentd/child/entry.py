"""The child program's entry: ``python -m agentd`` under ``AGENT_SUBAGENT=1`` is either the fork server
(``AGENTD_FORKSERVER=<fd>``) or one child session. Dispatched before any argv parsing.

Both keep their imports to what a child runs (tests/supervisor/test_child_imports.py pins the heavy
modules they must not load): every module here is memory in each child (its RSS, and its private pages
once touched) and, for a re-exec, start-up CPU.
"""

from __future__ import annotations

import os


def child_main() -> int:
    """Run the fork server or one child session; returns the exit status. (httpx's command-line client is
    already kept out: ``agentd/__init__.py`` does it for every process that imports agentd.)"""
    server_fd = os.environ.pop("AGENTD_FORKSERVER", None)
    if server_fd is not None and server_fd.isdigit():
        from agentd.child.forkserver import serve_forks

        return serve_forks(int(server_fd))
    from agentd.child.session import session_main

    return session_main()
