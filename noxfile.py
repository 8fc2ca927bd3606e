"""Optional nox sessions mirroring scripts/test (nox is not installed by scripts/test).

    nox -s lint typecheck     # ruff, mypy --strict on agentd/
    nox -s tests -- -k echo   # installs the peers (via scripts/test's install steps), then pytest -n 2

The ``tests`` session reuses scripts/test so the peer installs (.peers/mcp1-venv, npm packages, Node 22) stay in
one place (it installs into the repo's .venv, not nox's); it runs that script with ``PYTHON=python3.11`` and skips
its lint/type steps.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
PYTHON = ["3.11", "3.12", "3.13"]


@nox.session(python=PYTHON[0])
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", "agentd", "tests", "scripts")


@nox.session(python=PYTHON[0])
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("mypy")


@nox.session(python=PYTHON[0])
def tests(session: nox.Session) -> None:
    python = f"python{session.python}" if isinstance(session.python, str) else "python3"
    session.run("bash", "scripts/test", *session.posargs, external=True,
                env={"AGENTD_TEST_SKIP_LINT": "1", "PYTHON": python})
