"""The budget ledger: reservations, charges, refunds as data; the ceiling invariant under any sequence of
operations (hypothesis); the books surviving a restart through the journal's state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentd.journal.errors import JournalFormatError
from agentd.journal.ledger import (
    MONEY_KEY,
    ROOT,
    Charged,
    Granted,
    Ledger,
    Overdrawn,
    Refunded,
    Refused,
    drop_ledger,
    load_books,
    load_ledger,
    save_ledger,
)
from agentd.journal.sqlite import open_journal


def test_reserve_charge_refund():
    ledger = Ledger(1000)
    assert ledger.charge(ROOT, 100) == Charged(ROOT, 100, 900)
    assert ledger.reserve("a", 500) == Granted("a", 500)
    assert ledger.available(ROOT) == 400
    assert ledger.reserve("b", 500) == Refused("b", 500, 400, "insufficient")
    assert ledger.reserve("b", 500, minimum=100) == Granted("b", 400)
    assert ledger.reserve("a", 1) == Refused("a", 1, 0, "duplicate handle")
    assert ledger.reserve("x", 1, parent="nope") == Refused("x", 1, 0, "unknown parent")
    assert ledger.reserve("x", 0) == Refused("x", 0, 0, "invalid amount")
    assert ledger.reserve("a1", 200, parent="a") == Granted("a1", 200)
    assert ledger.charge("a", 250) == Charged("a", 250, 50)
    # the child cannot exceed its slice: the slice is booked exhausted and the excess reported
    assert ledger.charge("a1", 260) == Overdrawn("a1", 200, 60)
    assert ledger.available("a1") == 0 and ledger.over("a1") == 60  # the excess is recorded, past the slice
    assert Ledger.restore(ledger.snapshot()).over("a1") == 60
    # ending a cascades to its open child; a1's 60 past its slice come out of a's unused 50 and 10 past a's
    # slice (a1's reservation was a's); nothing comes back to the root
    assert ledger.end("a") == Refunded("a", 500, 0, ("a1", "a"))
    assert ledger.spent(ROOT) == 600 and ledger.over(ROOT) == 10 and ledger.available(ROOT) == 0
    assert ledger.end("b") == Refunded("b", 0, 400, ("b",))
    assert ledger.available(ROOT) == 400 and ledger.committed() == 600 and ledger.overdrawn() == 10
    assert ledger.end("b") == Refunded("b", 0, 0, ())
    assert ledger.charge("gone", 5) == Overdrawn("gone", 0, 5)


def _check_invariant(ledger: Ledger) -> None:
    assert ledger.committed() <= ledger.ceiling
    for handle in ledger.open_handles():
        assert ledger.available(handle) >= 0
        assert ledger.spent(handle) >= 0


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(0, 12), st.integers(0, 12), st.integers(-5, 400),
                  st.booleans()),
        st.tuples(st.just("charge"), st.integers(0, 12), st.integers(0, 400)),
        st.tuples(st.just("end"), st.integers(0, 12)),
        st.tuples(st.just("restart"),),
    ),
    max_size=80,
)


def _name(i: int) -> str:
    return ROOT if i == 0 else f"h{i}"


@settings(max_examples=300, deadline=None)
@given(ceiling=st.integers(0, 1000), ops=OPS)
def test_the_ceiling_is_never_exceeded(ceiling, ops):
    ledger = Ledger(ceiling)
    spent_total = 0  # every token charged anywhere, which ends up at the root as runs end (spent or over)
    for op in ops:
        if op[0] == "reserve":
            _, h, p, amount, partial = op
            decision = ledger.reserve(_name(h), amount, parent=_name(p), minimum=1 if partial else None)
            if isinstance(decision, Granted):
                assert 0 < decision.amount <= amount
        elif op[0] == "charge":
            _, h, tokens = op
            before = ledger.available(_name(h))
            decision = ledger.charge(_name(h), tokens)
            booked = decision.tokens if isinstance(decision, Charged) else decision.booked
            assert booked <= max(before, 0) and booked + (0 if isinstance(decision, Charged) else decision.excess) == tokens
            if _name(h) in ledger.open_handles():  # an unknown handle's charge is refused, not recorded
                spent_total += tokens
        elif op[0] == "end":
            refund = ledger.end(_name(op[1]))
            assert refund.refunded >= 0
            assert _name(op[1]) not in ledger.open_handles() or op[1] == 0
        else:
            ledger = Ledger.restore(ledger.snapshot())
        _check_invariant(ledger)
    for handle in [h for h in ledger.open_handles() if h != ROOT]:
        ledger.end(handle)
    assert ledger.open_handles() == [ROOT]
    assert ledger.spent(ROOT) <= ceiling
    assert ledger.spent(ROOT) + ledger.over(ROOT) == spent_total  # nothing charged goes unrecorded


def test_malformed_snapshots_are_refused():
    good = Ledger(100)
    good.reserve("a", 60)
    snap = good.snapshot()
    for bad in ({}, {"v": 2, **{k: v for k, v in snap.items() if k != "v"}}, {**snap, "slices": {"a": [ROOT]}},
                {**snap, "slices": {**snap["slices"], "b": [ROOT, 60, 0]}},
                {**snap, "slices": {**snap["slices"], "c": ["ghost", 1, 0]}}):
        with pytest.raises(JournalFormatError):
            Ledger.restore(bad)


async def test_the_books_survive_a_restart(tmp_path):
    async with open_journal(str(tmp_path)) as journal:
        ledger = Ledger(10_000)
        ledger.reserve("child", 4000)
        ledger.charge("child", 1500)
        ledger.charge(ROOT, 700)
        await save_ledger(journal, "tree-1", ledger)
    async with open_journal(str(tmp_path)) as journal:
        restored = await load_ledger(journal, "tree-1")
        assert restored is not None and restored.snapshot() == ledger.snapshot()
        assert restored.end("child") == Refunded("child", 1500, 2500, ("child",))
        assert restored.available(ROOT) == 10_000 - 700 - 1500
        await drop_ledger(journal, "tree-1")
        assert await load_ledger(journal, "tree-1") is None


async def test_the_money_books_are_saved_beside_the_token_books(tmp_path):
    tokens, money = Ledger(10_000), Ledger(5 * 10**12)
    for handle, parent in (("0.1", ROOT), ("0.1.1", "0.1"), ("0.2", ROOT)):
        tokens.reserve(handle, 1000, parent=parent)
    money.reserve("0.1", 10**12)
    money.reserve("0.1.1", 10**11, parent="0.1")
    money.charge("0.1.1", 2 * 10**11)  # overdrawn: its excess is kept
    money.charge(ROOT, 7)
    compact = money.snapshot_beside(tokens)
    assert isinstance(compact, list)  # 0.2 has no money slice: one null stands for it
    assert Ledger.restore_beside(compact, tokens).snapshot() == money.snapshot()
    assert Ledger.restore_beside(money.snapshot(), tokens).snapshot() == money.snapshot()  # the earlier form
    stray = Ledger(10**12)
    stray.reserve("0.9", 1)  # a slice the token books lack: saved whole
    assert stray.snapshot_beside(tokens) == stray.snapshot()
    moved = Ledger(10**12)
    moved.reserve("0.1", 10)
    moved.reserve("0.2", 5, parent="0.1")  # the same slice under another parent: saved whole
    assert moved.snapshot_beside(tokens) == moved.snapshot()
    assert tokens.snapshot(money) == {**tokens.snapshot(), MONEY_KEY: compact}  # both books in one pass
    # A money slice beside every token slice: opened in the same order (walked side by side) or not, the list
    # follows the token books' order and restores the same books.
    for order in ((("0.1", ROOT), ("0.1.1", "0.1"), ("0.2", ROOT)), (("0.2", ROOT), ("0.1", ROOT), ("0.1.1", "0.1"))):
        every = Ledger(10**12)
        for handle, parent in order:
            every.reserve(handle, 10**11, parent=parent)
        every.charge("0.2", 3)
        every.charge("0.1.1", 2 * 10**11)  # overdrawn
        saved = every.snapshot_beside(tokens)
        assert saved == [10**12, 10**12, 0, 0, 10**11, 0, 0, 10**11, 10**11, 10**11, 10**11, 3, 0]
        assert Ledger.restore_beside(saved, tokens).snapshot() == every.snapshot()
    for bad in ([], [1, 5], [1, 5, 0, 0, 9], ["x"], [10, 100, 0, 0, None, None, None, None]):
        with pytest.raises(JournalFormatError):
            Ledger.restore_beside(bad, tokens)
    async with open_journal(str(tmp_path)) as journal:
        await save_ledger(journal, "tree-1", tokens, money=money)
        books = await load_books(journal, "tree-1")
        assert books is not None and books[1] is not None and books[1].snapshot() == money.snapshot()
