"""The tree token budget as a ledger with reservations: a pure decision object, persisted as JSON.

Why a ledger: a run tree shares one token ceiling. A spawn *reserves* a slice for the child out of its
parent's unreserved, unspent tokens; the child spends only inside its slice; when it ends, what it spent is
booked to the parent and the rest is refunded. So the sum of what is spent and what is reserved never
exceeds the ceiling, and a restart that restores the ledger (:meth:`Ledger.snapshot` /
:meth:`Ledger.restore`, kept through the journal's state API by :func:`save_ledger` / :func:`load_ledger`)
resumes the same books.

Every method returns its decision as data (:class:`Granted`, :class:`Refused`, :class:`Charged`,
:class:`Overdrawn`, :class:`Refunded`; :meth:`Ledger.spend`, the charge a tree's books make on every reply,
as one number); the caller acts on it (starts the child, stops a run, emits events) and journals it
(``BudgetReserved`` / ``BudgetCharged`` / ``BudgetRefunded``). The invariant, for every
open slice ``s``: ``s.spent + sum(reserved of s's open children) <= s.reserved``, and the root's
``reserved`` is the ceiling.

A model reply's tokens are known only after the reply, so a run can overshoot its slice by one reply: the
ledger books the slice as exhausted, records the excess as the slice's ``over`` (what was really spent past
it: nothing is left unrecorded), reports it in :class:`Overdrawn`, and the caller stops the run. When that
slice ends, its ``over`` is charged to its parent like any spend (past the parent's own free tokens it stays
``over`` there), so the books of a tree always add up to every token its runs were told they used.

The ledger counts whole units and knows nothing of tokens: a tree with a money budget (``--budget-usd``) keeps
a second ledger in picodollars (agentd.prices) with the same rules, saved in the same state entry as the
token books (under ``usd``), so both are written in one durable write and restored together; since its slices
are the token books' own, it is saved as a flat list of numbers beside them (:meth:`Ledger.snapshot_beside`),
made in the same pass over the slices as the token books' own snapshot (``tokens.snapshot(money)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs

from agentd.journal.errors import JournalFormatError

if TYPE_CHECKING:  # the store and its records stay off the once run's path (the ledger itself is on it)
    from agentd.journal.store import JournalStore

#: The handle of the run tree's root (the top-level run).
ROOT: Final = "root"
#: The journal state namespace the ledgers live in, by run id.
NAMESPACE: Final = "budget"
#: Served run trees' ledgers (``served.N``, agentd.supervisor.caps), by tree: apart from the run ids, whose
#: finished runs' books are dropped at start-up (agentd.run.open_state).
SERVED_NAMESPACE: Final = "budget.served"
#: The key of a tree's money books inside its saved token books.
MONEY_KEY: Final = "usd"


@attrs.frozen
class Granted:
    handle: str
    amount: int


@attrs.frozen
class Refused:
    handle: str
    requested: int
    available: int
    reason: str  # "insufficient" | "unknown parent" | "duplicate handle" | "invalid amount"


@attrs.frozen
class Charged:
    handle: str
    tokens: int
    remaining: int

    #: Whether the charge overdrew the slice (:class:`Overdrawn`): a caller told on every reply tells the two
    #: apart without importing them (the ledger loads with the first reply).
    overdrawn: ClassVar[bool] = False


@attrs.frozen
class Overdrawn:
    """The charge did not fit: ``booked`` tokens were booked in the slice (now exhausted), ``excess`` past it
    (recorded as the slice's ``over``)."""

    handle: str
    booked: int
    excess: int

    overdrawn: ClassVar[bool] = True
    #: Nothing is left in an overdrawn slice.
    remaining: ClassVar[int] = 0


@attrs.frozen
class Refunded:
    handle: str
    spent: int
    refunded: int
    ended: tuple[str, ...]  # the handle and any open descendants ended with it, deepest first


@attrs.define
class _Slice:
    parent: str | None
    reserved: int
    spent: int = 0
    #: Tokens spent past the slice (the reply that overdrew it).
    over: int = 0


@attrs.define
class Ledger:
    """One run tree's books. Mutated only through its methods; each returns a decision."""

    ceiling: int
    _slices: dict[str, _Slice] = attrs.field(factory=dict)
    #: Each open slice's open children, in reservation order, and the sum of what they reserved: kept up
    #: to date by reserve/end, so a decision costs the same with 5 or 500 open slices.
    _kids: dict[str, dict[str, None]] = attrs.field(init=False, factory=dict)
    _held: dict[str, int] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.ceiling < 0:
            raise ValueError(f"budget ceiling must be >= 0, not {self.ceiling}")
        self._slices.setdefault(ROOT, _Slice(None, self.ceiling))
        for handle, s in self._slices.items():
            if s.parent is not None:
                self._adopt(s.parent, handle, s.reserved)

    def _adopt(self, parent: str, handle: str, reserved: int) -> None:
        self._kids.setdefault(parent, {})[handle] = None
        self._held[parent] = self._held.get(parent, 0) + reserved

    # --- queries ---

    def _children(self, handle: str) -> list[str]:
        return list(self._kids.get(handle, ()))

    def __contains__(self, handle: object) -> bool:
        return handle in self._slices

    def available(self, handle: str) -> int:
        """Tokens ``handle`` may still spend or hand out (0 for an unknown handle)."""
        s = self._slices.get(handle)
        if s is None:
            return 0
        return s.reserved - s.spent - self._held.get(handle, 0)

    def spent(self, handle: str) -> int:
        s = self._slices.get(handle)
        return 0 if s is None else s.spent

    def over(self, handle: str) -> int:
        """Tokens ``handle`` spent past its slice (0 for an unknown handle)."""
        s = self._slices.get(handle)
        return 0 if s is None else s.over

    def overdrawn(self) -> int:
        """Tokens the open slices spent past their slices: what the tree used beyond :meth:`committed`."""
        return sum(s.over for s in self._slices.values())

    def committed(self) -> int:
        """What the tree holds against the ceiling: the root's spend plus its children's reservations."""
        return self.ceiling - self.available(ROOT)

    def open_handles(self) -> list[str]:
        return list(self._slices)

    # --- decisions ---

    def reserve(self, handle: str, amount: int, *, parent: str = ROOT, minimum: int | None = None) -> Granted | Refused:
        """Reserve up to ``amount`` for ``handle`` out of ``parent``'s slice; at least ``minimum`` (default
        ``amount``) or nothing."""
        want = amount if minimum is None else minimum
        if amount <= 0 or want <= 0 or want > amount:
            return Refused(handle, amount, 0, "invalid amount")
        if handle in self._slices:
            return Refused(handle, amount, 0, "duplicate handle")
        if parent not in self._slices:
            return Refused(handle, amount, 0, "unknown parent")
        free = self.available(parent)
        if free < want:
            return Refused(handle, amount, free, "insufficient")
        granted = min(amount, free)
        self._slices[handle] = _Slice(parent, granted)
        self._adopt(parent, handle, granted)
        return Granted(handle, granted)

    def charge(self, handle: str, tokens: int) -> Charged | Overdrawn:
        """Book ``tokens`` spent by ``handle``; past its free tokens the slice is exhausted instead."""
        left = self.spend(handle, tokens)
        if left is None:
            return Overdrawn(handle, 0, tokens)
        if left < 0:
            return Overdrawn(handle, tokens + left, -left)
        return Charged(handle, tokens, left)

    def spend(self, handle: str, tokens: int) -> int | None:
        """:meth:`charge`'s decision as one number: what ``handle`` has left after ``tokens`` (:class:`Charged`)
        or, when negative, how far past its slice they went (:class:`Overdrawn`: the slice is exhausted, the
        excess booked as its ``over``); None when ``handle`` has no open slice (nothing is booked).

        For the tree's books on every reply (agentd.supervisor.caps charges a reply's tokens and its cost in
        one pass): an int, not a decision instance, since building an attrs value costs more than the booking."""
        if tokens < 0:
            raise ValueError(f"cannot charge negative tokens ({tokens})")
        s = self._slices.get(handle)
        if s is None:
            return None
        free = s.reserved - s.spent - self._held.get(handle, 0)
        if free < 0:
            free = 0
        left = free - tokens
        if left < 0:
            s.spent += free
            s.over -= left
        else:
            s.spent += tokens
        return left

    def end(self, handle: str) -> Refunded:
        """The run ``handle`` ended: book its (and its open descendants') spend to the parent, free the rest."""
        if handle == ROOT or handle not in self._slices:
            return Refunded(handle, 0, 0, ())
        ended: list[str] = []
        for child in self._children(handle):
            ended.extend(self.end(child).ended)
        s = self._slices.pop(handle)
        self._kids.pop(handle, None)
        self._held.pop(handle, None)
        if s.parent is not None:
            self._kids.get(s.parent, {}).pop(handle, None)
            self._held[s.parent] -= s.reserved
        parent = s.parent if s.parent is not None else ROOT
        self._slices[parent].spent += s.spent
        if s.over:  # what it spent past its slice is the parent's spend too
            self.charge(parent, s.over)
        ended.append(handle)
        return Refunded(handle, s.spent, s.reserved - s.spent, tuple(ended))

    # --- persistence ---

    def snapshot(self, money: Ledger | None = None) -> dict[str, Any]:
        """These books as JSON; with ``money`` (the tree's money books), those too, under :data:`MONEY_KEY`, as
        :meth:`snapshot_beside` writes them, made in the same pass over the slices (the tree's books are saved
        after every reply)."""
        if money is None:
            return {"v": 1, "ceiling": self.ceiling,
                    "slices": {h: [s.parent, s.reserved, s.spent, s.over] if s.over else [s.parent, s.reserved, s.spent]
                               for h, s in self._slices.items()}}
        slices = {}
        numbers: list[int | None] = [money.ceiling]
        theirs = money._slices
        # The usual case: both books opened the same slices in the same order (a priced tree reserves money
        # beside every token slice), so they are walked side by side, no lookup per slice.
        try:
            for (h, s), (beside, usd) in zip(self._slices.items(), theirs.items(), strict=True):
                slices[h] = [s.parent, s.reserved, s.spent, s.over] if s.over else [s.parent, s.reserved, s.spent]
                if beside != h or usd.parent != s.parent:
                    break
                numbers += (usd.reserved, usd.spent, usd.over)
            else:
                return {"v": 1, "ceiling": self.ceiling, "slices": slices, MONEY_KEY: numbers}
        except ValueError:  # zip(strict=True): not as many slices
            pass
        slices = {}
        numbers = [money.ceiling]
        matched = 0
        same = True
        for h, s in self._slices.items():
            slices[h] = [s.parent, s.reserved, s.spent, s.over] if s.over else [s.parent, s.reserved, s.spent]
            m = theirs.get(h)
            if m is None:
                numbers.append(None)
            else:
                numbers += (m.reserved, m.spent, m.over)
                matched += 1
                same = same and m.parent == s.parent
        return {"v": 1, "ceiling": self.ceiling, "slices": slices,
                MONEY_KEY: numbers if same and matched == len(theirs) else money.snapshot()}

    @classmethod
    def restore(cls, data: Any) -> Ledger:
        try:
            if data["v"] != 1:
                raise JournalFormatError(f"budget ledger version {data['v']!r} is not 1")
            slices = {str(h): _Slice(p, int(r), int(s), *(int(o) for o in over))
                      for h, (p, r, s, *over) in data["slices"].items()}
            ledger = cls(int(data["ceiling"]), slices)
        except (KeyError, TypeError, ValueError) as exc:
            raise JournalFormatError(f"malformed budget ledger ({type(exc).__name__}: {exc})") from None
        for handle, s in slices.items():
            if s.parent is not None and s.parent not in slices:
                raise JournalFormatError(f"malformed budget ledger (slice {handle!r} has no parent)")
            if ledger.available(handle) < 0 or s.spent < 0 or s.over < 0:
                raise JournalFormatError(f"malformed budget ledger (slice {handle!r} over its reservation)")
        return ledger

    def snapshot_beside(self, tokens: Ledger) -> list[int | None] | dict[str, Any]:
        """These books (a tree's money books) saved beside ``tokens`` (its token books), compactly: they have the
        same slices under the same parents, so one flat list of numbers says it all, ``[ceiling, *per slice of
        tokens in order: reserved, spent, over | null when this ledger has no such slice]``. Written on every
        priced step (the tree's books are saved after each reply, by ``tokens.snapshot(money)``, which makes
        both in one pass): no nested containers to build or encode. Books whose slices do not match (not seen
        in practice) are saved as :meth:`snapshot`."""
        saved: list[int | None] | dict[str, Any] = tokens.snapshot(self)[MONEY_KEY]
        return saved

    @classmethod
    def restore_beside(cls, data: Any, tokens: Ledger) -> Ledger:
        """What :meth:`snapshot_beside` (or :meth:`snapshot`) saved beside ``tokens``."""
        if not isinstance(data, list):
            return cls.restore(data)
        try:
            numbers = iter(data[1:])
            slices: dict[str, _Slice] = {}
            for handle, theirs in tokens._slices.items():
                reserved = next(numbers)
                if reserved is not None:
                    slices[handle] = _Slice(theirs.parent, int(reserved), int(next(numbers)), int(next(numbers)))
            if next(numbers, numbers) is not numbers:
                raise ValueError("more slices than the token books")
            return cls.restore({"v": 1, "ceiling": data[0],
                                "slices": {h: [s.parent, s.reserved, s.spent, s.over] for h, s in slices.items()}})
        except (IndexError, StopIteration, TypeError, ValueError) as exc:
            raise JournalFormatError(f"malformed money ledger ({type(exc).__name__}: {exc})") from None



async def save_ledger(store: JournalStore, tree: str, ledger: Ledger, *, namespace: str = NAMESPACE,
                      money: Ledger | None = None) -> None:
    """Persist ``ledger`` (and ``money``, its money books) as the run tree ``tree``'s books (one durable state
    write)."""
    await store.put_state(namespace, {tree: ledger.snapshot(money)})


async def load_ledger(store: JournalStore, tree: str, *, namespace: str = NAMESPACE) -> Ledger | None:
    books = await load_books(store, tree, namespace=namespace)
    return None if books is None else books[0]


async def load_books(store: JournalStore, tree: str, *,
                     namespace: str = NAMESPACE) -> tuple[Ledger, Ledger | None] | None:
    """The run tree ``tree``'s saved token books and money books (None when it saved none)."""
    data = (await store.get_state(namespace)).get(tree)
    if data is None:
        return None
    money = data.get(MONEY_KEY) if isinstance(data, dict) else None
    tokens = Ledger.restore(data)
    return tokens, None if money is None else Ledger.restore_beside(money, tokens)


async def drop_ledger(store: JournalStore, tree: str, *, namespace: str = NAMESPACE) -> None:
    await store.put_state(namespace, {tree: None})


async def drop_ledgers_except(store: JournalStore, keep: set[str], *, namespace: str) -> None:
    """Forget every saved ledger in ``namespace`` but those of the trees in ``keep`` (one state write)."""
    stale = {tree: None for tree in await store.get_state(namespace) if tree not in keep}
    if stale:
        await store.put_state(namespace, stale)
