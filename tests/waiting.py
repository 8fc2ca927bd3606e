"""Waiting for a real peer to reach a state: the one place a test polls in real time.

A test never sleeps for "long enough". Time-based behaviour of trio code under test runs on trio's autojump clock
(pytest-trio's ``autojump_clock`` fixture), where a sleep costs nothing and proves the timing exactly. What is left
is state the test cannot be told about: a child process's log file, a peer's side door, a database row, a process
table. That is polled here, in small steps, under a deadline, so every such wait reads the same and none can hang
or pass by luck.

tests/test_real_sleeps.py keeps it that way: a real sleep anywhere else in tests/ names its reason.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

STEP = 0.05  # seconds between two looks: small next to any deadline, large enough not to load a busy machine


async def until(check: Callable[[], Any | Awaitable[Any]], *, timeout: float, what: str = "the condition") -> Any:
    """Poll ``check()`` (plain or async) until it returns something true, and return that.

    Raises ``trio.TooSlowError`` naming ``what`` after ``timeout`` seconds. An exception from ``check`` (an
    assertion that the peer is still alive, say) ends the wait at once.
    """
    with trio.move_on_after(timeout):
        while True:
            got = check()
            if inspect.isawaitable(got):
                got = await got
            if got:
                return got
            await trio.sleep(STEP)  # real time: the step of a bounded wait for a real peer's state
    raise trio.TooSlowError(f"not within {timeout} s: {what}")


def until_sync(check: Callable[[], Any], *, timeout: float, what: str = "the condition") -> Any:
    """``until`` for code outside trio (a fixture, a thread): the same contract, on the monotonic clock."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout} s: {what}")
        time.sleep(STEP)  # real time: the step of a bounded wait for a real peer's state
