"""``open_store``: the journal store contract tests run against both backends (SQLite file, PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Any) -> Callable[..., AbstractAsyncContextManager[Any]]:
    """``open_store(clock=None)`` opens (or reopens) the same journal: one file, or one fresh database."""
    if request.param == "sqlite":
        from agentd.journal.sqlite import open_journal

        def sqlite(clock: Any = None) -> AbstractAsyncContextManager[Any]:
            return open_journal(str(tmp_path), **({"clock": clock} if clock is not None else {}))

        return sqlite
    from agentd.cluster.store import open_pg_journal
    from tests.postgres import PASSWORD

    dsn = request.getfixturevalue("pg_dsn")

    def postgres(clock: Any = None) -> AbstractAsyncContextManager[Any]:
        extra = {"clock": clock, "lease_clock": clock} if clock is not None else {}
        return open_pg_journal(dsn, PASSWORD, **extra)

    return postgres
