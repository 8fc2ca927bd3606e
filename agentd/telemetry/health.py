"""Liveness and readiness of one daemon, for ``--health-file``, ``GET /healthz`` and ``GET /readyz``.

*Alive* means the event loop turns: the daemon's heartbeat task stamps :attr:`Health.tick` several times a
second, and whatever reports health runs on the same loop, so a stale ``ts`` or a large
``supervisor_tick_age_ms`` says the loop is stuck. *Ready* means the daemon accepts work: it has started,
is not draining or in the operator's lame duck (``agentd ctl lame-duck``), and every readiness check registered by a running
part (the MCP pool: every required server connected) passes.

The daemon opens one :class:`Health` and makes it current for its tasks (a contextvar, as the drain
latch), so two daemons in one trio process do not share one. It hands health the questions "draining?"
and "lame duck?" as callables: the drain latch and the operator sit above telemetry (they log through
the event log, which traces through telemetry), so health asks them nothing by name.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

import trio

from agentd.telemetry.private_files import open_private

#: How often the heartbeat stamps the tick, and how often the health file is rewritten (seconds).
TICK_INTERVAL: Final = 0.25
FILE_INTERVAL: Final = 1.0


def _never() -> bool:
    return False


class Health:
    """The daemon's liveness and readiness. (A plain class: a once run builds it at start-up, where an attrs class costs about a millisecond of CPU.)"""

    __slots__ = ("_checks", "_draining", "_lame_duck", "_next", "mode", "started", "tick")

    def __init__(self, mode: str = "once", started: bool = False, tick: float | None = None, *,
                 draining: Callable[[], bool] = _never, lame_duck: Callable[[], bool] = _never) -> None:
        self.mode = mode
        self._draining = draining
        self._lame_duck = lame_duck
        self.started = started
        self.tick = tick
        self._checks: dict[int, Callable[[], bool]] = {}
        self._next = 0

    def add_check(self, check: Callable[[], bool]) -> int:
        """Register a readiness check; the returned key removes it (:meth:`remove_check`)."""
        self._next += 1
        self._checks[self._next] = check
        return self._next

    def remove_check(self, key: int) -> None:
        self._checks.pop(key, None)

    @property
    def draining(self) -> bool:
        return self._draining()

    @property
    def lame_duck(self) -> bool:
        return self._lame_duck()

    def ready(self) -> bool:
        if not self.started or self.draining or self.lame_duck:
            return False
        try:
            return all(check() for check in list(self._checks.values()))
        except Exception:
            return False

    def tick_age_ms(self) -> float | None:
        if self.tick is None:
            return None
        return round((trio.current_time() - self.tick) * 1000, 1)

    def snapshot(self) -> dict[str, Any]:
        return {"alive": True, "mode": self.mode, "draining": self.draining, "lame_duck": self.lame_duck,
                "ready": self.ready(),
                "supervisor_tick_age_ms": self.tick_age_ms(), "ts": round(time.time(), 3)}

    async def heartbeat(self) -> None:
        """Stamp the tick until cancelled (runs in the daemon nursery)."""
        while True:
            self.tick = trio.current_time()
            await trio.sleep(TICK_INTERVAL)

    async def write_file(self, path: str) -> None:
        """Rewrite ``path`` atomically about every second until cancelled; a last ``alive: false`` at the end."""
        try:
            while True:
                _write(path, self.snapshot())
                await trio.sleep(FILE_INTERVAL)
        finally:
            final = {**self.snapshot(), "alive": False, "ready": False}
            try:
                _write(path, final)
            except OSError:
                pass


def _write(path: str, doc: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open_private(tmp) as file:
        file.write(json.dumps(doc) + "\n")
    os.replace(tmp, path)


_CURRENT: ContextVar[Health | None] = ContextVar("agentd_health", default=None)


def current_health() -> Health | None:
    return _CURRENT.get()


@contextmanager
def use_health(health: Health) -> Iterator[Health]:
    token = _CURRENT.set(health)
    try:
        yield health
    finally:
        _CURRENT.reset(token)


@contextmanager
def readiness_check(check: Callable[[], bool]) -> Iterator[None]:
    """Count ``check`` towards readiness of the current daemon while the block runs (no daemon: nothing)."""
    health = _CURRENT.get()
    if health is None:
        yield
        return
    key = health.add_check(check)
    try:
        yield
    finally:
        health.remove_check(key)


#: The probe paths served without authentication, and what they say: ok or not, nothing more.
PROBES: Final = frozenset({"/healthz", "/readyz"})


def probe(path: str) -> tuple[int, bytes]:
    """The answer to ``GET /healthz`` (200 while the loop turns: answering proves it) or ``GET /readyz``
    (200 when ready, else 503; outside a daemon, which alone knows what ready means, 200)."""
    if path == "/healthz":
        return 200, b"ok\n"
    health = _CURRENT.get()
    ready = health.ready() if health is not None else True
    return (200, b"ok\n") if ready else (503, b"not ready\n")
