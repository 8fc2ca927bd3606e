"""Helpers for supervisor tests: a root supervisor whose children run scripted behaviours.

The scripted behaviour travels as the spawn request's instruction (JSON) and is turned into the hidden
``test`` payload by the ``test_script`` hook, which exists only at the Python level.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from agentd.supervisor.caps import Caps
from agentd.supervisor.ladder import Graces
from agentd.supervisor.liveness import LivenessSettings
from agentd.supervisor.supervisor import (
    Caller,
    Origin,
    SpawnRequest,
    Supervisor,
    SupervisorSettings,
    open_supervisor,
)
from agentd.telemetry.events import EventLog

ROOT = Caller(Origin.STDIO, "0")
#: Short enough for tests, long enough that a child on a loaded 2-core machine still reacts in time.
FAST_GRACES = Graces(cancel=2.0, eof=1.0, term=1.0)


def script(*steps: list[Any], **flags: Any) -> str:
    return json.dumps({"steps": [list(s) for s in steps], **flags})


def req(*steps: list[Any], **kw: Any) -> SpawnRequest:
    flags = kw.pop("flags", {})
    return SpawnRequest(instruction=script(*steps, **flags), **kw)


def _from_instruction(request: SpawnRequest, handle: str) -> dict[str, Any]:
    try:
        value = json.loads(request.instruction)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"steps": [["echo"]]}


class Events(list):  # type: ignore[type-arg]
    def named(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self if e["event"] == event and all(e.get(k) == v for k, v in match.items())]


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def root(events: Events, no_leftover_children: None):
    @asynccontextmanager
    async def open_root(
        *, servers: frozenset[str] = frozenset({"fs", "web"}), graces: Graces = FAST_GRACES,
        liveness: LivenessSettings | None = None, fork_server: bool = False, **caps: Any,
    ) -> AsyncIterator[Supervisor]:
        settings = SupervisorSettings(
            caps=Caps(**caps), graces=graces, liveness=liveness or LivenessSettings(), await_timeout=10.0,
        )
        log = EventLog(sink=events.append, level="debug")
        async with open_supervisor(servers=servers, settings=settings, log=log,
                                   test_script=_from_instruction, fork_server=fork_server) as sup:
            yield sup

    return open_root
