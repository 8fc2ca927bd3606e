"""Who waits for which work item's end: the member's listener wakes them on ``NOTIFY agentd_done``.

Why: a served ``cluster.<id>`` handle ends on whichever member ran it; every member that answers for it (its
``subagent.status``, its subscribers' terminal ``notifications/resources/updated``) must learn of the end.
Polling the shared journal for each watched handle costs one read per handle per poll on the member's one
connection; instead the member's listener (agentd.cluster.member, which already LISTENs for new work on its
own connection) also LISTENs on :data:`~agentd.cluster.work.DONE_CHANNEL` and hands each finished item's id to
:meth:`DoneWatch.done`, which wakes its waiters at once. The waiters still look again every
:data:`FALLBACK_POLL` seconds (a notification is lost while the listener reconnects, and the listener then
wakes everyone with :meth:`DoneWatch.recheck`), so a lost notification delays an answer, never loses it.
That look is the member's, one read for every watched item (agentd.cluster.member), not one per waiter: a
thousand handles watched cost one statement every :data:`FALLBACK_POLL`; a waiter's own re-read comes only
every :data:`WAITER_FALLBACK`, should that look itself fail for so long.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import attrs
import trio

#: Longest a watched item's end goes unseen without a notification: the member then reads every watched item's
#: state at once.
FALLBACK_POLL: Final = 5.0
#: Longest a waiter sleeps before reading its item's state itself (the member's look failed meanwhile).
WAITER_FALLBACK: Final = 60.0


@attrs.define(eq=False)
class _Waiters:
    event: trio.Event = attrs.field(factory=trio.Event)
    count: int = 0


@attrs.define(eq=False)
class DoneWatch:
    _waiting: dict[str, _Waiters] = attrs.field(factory=dict)

    @contextmanager
    def watching(self, work_id: str) -> Iterator[trio.Event]:
        """The event set when ``work_id`` is reported done (arm it BEFORE reading the item's state, so an end
        between the read and the wait is not missed); one event per notification, shared by its waiters."""
        entry = self._waiting.get(work_id)
        if entry is None:
            entry = self._waiting[work_id] = _Waiters()
        entry.count += 1
        try:
            yield entry.event
        finally:
            entry.count -= 1
            if entry.count <= 0 and self._waiting.get(work_id) is entry:
                del self._waiting[work_id]

    def done(self, work_id: str) -> None:
        """The listener heard ``NOTIFY agentd_done, work_id``."""
        entry = self._waiting.pop(work_id, None)
        if entry is not None:
            entry.event.set()

    def recheck(self) -> None:
        """Notifications may have been missed (the listener reconnected): every waiter reads again."""
        entries, self._waiting = self._waiting, {}
        for entry in entries.values():
            entry.event.set()

    def watched(self) -> list[str]:
        """The items someone waits on now."""
        return list(self._waiting)

    def __len__(self) -> int:
        return len(self._waiting)
