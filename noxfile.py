"""Optional nox sessions mirroring scripts/test (nox is not installed by scripts/test).

    nox -s lint typecheck     # ruff, mypy --strict on agentd/
    nox -s tests -- -k echo   # installs the peers (via scripts/test's install steps), then pytest -n 2
    nox -s newest             # the same suite on the newest releases of the HTTP libraries under agentd

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


#: The libraries agentd's HTTP edges are built on: a breaking release of one is seen the day it ships.
EDGE_LIBRARIES = ("httpx", "httpcore", "h11", "h2", "hypercorn", "wsproto", "trio-websocket")


@nox.session(python=PYTHON[0])
def newest(session: nox.Session) -> None:
    """Upgrade the edge libraries in the repo's .venv to their newest releases, then run the suite (not part of
    .ci/run: it would double CI's time)."""
    python = f"python{session.python}" if isinstance(session.python, str) else "python3"
    session.run("bash", "scripts/test", "--collect-only", "-q", external=True,
                env={"AGENTD_TEST_SKIP_LINT": "1", "PYTHON": python})  # creates .venv and the peers if missing
    session.run(".venv/bin/python", "-m", "pip", "install", "-q", "--upgrade", *EDGE_LIBRARIES, external=True)
    session.run(".venv/bin/python", "-m", "pip", "list", external=True)
    session.run("bash", "scripts/test", *session.posargs, external=True,
                env={"AGENTD_TEST_SKIP_LINT": "1", "PYTHON": python})
