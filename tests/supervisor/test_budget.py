"""The tree token budget's decisions as data: the default slice rule (a fan-out within ``max_children`` and a
deep tree under a wide ``--max-children`` both get usable slices) and served run trees (``served.N``) as
books with reservations, saved through the state store and adopted after a restart."""

from __future__ import annotations

import itertools
from pathlib import Path

from agentd import defaults
from agentd.journal.ledger import NAMESPACE, ROOT, SERVED_NAMESPACE, Ledger
from agentd.journal.sqlite import open_journal
from agentd.supervisor.authority import LocalAuthority
from agentd.supervisor.caps import Admission, Caps, Refusal, TreeLedger, default_slice
from agentd.supervisor.messages import Usage

CEILING = defaults.TOKEN_CEILING


def ledger(**caps: object) -> TreeLedger:
    return TreeLedger(Caps(**{"spawn_burst": 100_000, **caps}), root_scope=frozenset())  # type: ignore[arg-type]


def admitted(decision: Admission | Refusal) -> Admission:
    assert isinstance(decision, Admission), decision
    return decision


# --- the default slice --------------------------------------------------------------------------------------


def test_a_fan_out_of_max_children_siblings_all_get_even_usable_slices() -> None:
    for max_children in (defaults.MAX_CHILDREN, 64):
        led = ledger(max_children=max_children, max_subagents=1000)
        budgets = [admitted(led.admit("0", None, 0.0)).budget for _ in range(max_children)]
        share = CEILING // (max_children + 1)
        assert all(b is not None and share <= b <= share + 1 for b in budgets), (max_children, budgets)
        assert min(b or 0 for b in budgets) >= defaults.SLICE_MIN
        # the root kept a share for its own turns, and the next sibling waits for a free slot
        assert led.existing_book("").available(ROOT) >= share
        assert led.admit("0", None, 0.0).cap == "max_children"  # type: ignore[union-attr]


def test_a_deep_tree_under_a_wide_max_children_gets_a_usable_slice_at_depth_3() -> None:
    # An even share among 1024 free slots per level would be 2,000,000/1025/1025/1025: 0 tokens at depth 3.
    led = ledger(max_children=1024, max_subagents=1000)
    handle, budgets = "0", []
    for _ in range(3):
        child = admitted(led.admit(handle, None, 0.0))
        led.add_tokens(500, child.handle)  # each level runs a turn before it spawns
        handle, budgets = child.handle, [*budgets, child.budget]
    assert handle == "0.1.1.1"
    assert budgets[0] == defaults.SLICE_MIN * 4  # enough for a turn at its level and each level below
    assert all(b is not None and b >= defaults.SLICE_MIN // 2 for b in budgets), budgets
    assert budgets[2] is not None and budgets[2] >= defaults.SLICE_MIN - 500
    assert led.add_tokens(3000, handle) is False  # the depth-3 child runs a turn within its slice


def test_a_fan_out_wider_than_the_budget_funds_gets_smaller_slices_never_a_refusal() -> None:
    # --max-children 600: an even share among the free slots (2,000,000 / 601) is below a turn, so each child
    # gets at most an even share among the parent, its live children and itself; the parent keeps as much.
    led = ledger(max_children=600, max_subagents=1000)
    budgets = [admitted(led.admit("0", None, 0.0)).budget or 0 for _ in range(500)]
    assert budgets[0] == defaults.SLICE_MIN * 4
    assert all(later <= earlier for earlier, later in itertools.pairwise(budgets))
    assert budgets[-1] > 0
    assert led.existing_book("").available(ROOT) >= budgets[-1]  # the parent keeps at least the last share
    assert sum(budgets) + led.existing_book("").available(ROOT) == CEILING


def test_the_default_slice_rule() -> None:
    # an even share among the caller and its free slots while that runs a turn
    assert default_slice(900, 8, 1, 4, 900) == 100
    assert default_slice(2_000_000, 8, 1, 4, 2_000_000) == 2_000_000 // 9
    # too thin: a turn per level still below the child, at most half of what is left
    assert default_slice(2_000_000, 1024, 1, 4, 2_000_000) == 4 * defaults.SLICE_MIN
    assert default_slice(2_000_000, 1024, 3, 4, 2_000_000) == defaults.SLICE_MIN
    assert default_slice(20_000, 1024, 1, 4, 2_000_000) == 10_000
    # a small ceiling's least usable slice is 1/SLICE_MIN_PARTS of it
    assert default_slice(6400, 7, 1, 4, 6400) == 800
    assert default_slice(1, 8, 1, 4, 1000) == 0  # nothing to share: the spawn is refused
    # too thin with live siblings: at most an even share among the parent, its live children and the new one
    assert default_slice(2_000_000, 1000, 1, 4, 2_000_000, live_children=98) == 2_000_000 // 100
    assert default_slice(2_000_000, 1000, 1, 4, 2_000_000, live_children=10) == 4 * defaults.SLICE_MIN


def test_a_default_slice_that_is_nothing_is_refused() -> None:
    led = ledger(token_ceiling=1000)
    led.add_tokens(999)
    refused = led.admit("0", None, 0.0)
    assert isinstance(refused, Refusal) and refused.cap == "token_budget"
    assert "handle 0 has 1 tokens left of token_ceiling=1000" in refused.message


def test_the_root_obeys_its_slice_like_every_child() -> None:
    led = ledger(token_ceiling=1000)
    admitted(led.admit("0", None, 0.0, budget=600))  # a live child holds 600
    assert led.add_tokens(300) is False and not led.spent_out()
    assert led.add_tokens(100) is False and led.spent_out()  # nothing left for the root's own turns
    assert led.add_tokens(50) is True  # past its slice: the root's run ends at this reply
    book = led.existing_book("")
    assert book is not None and book.spent(ROOT) == 400 and book.over(ROOT) == 50  # every token recorded
    assert led.tree_tokens("") == 450


# --- served run trees -------------------------------------------------------------------------------------


def test_a_served_spawn_is_the_root_of_books_whose_ceiling_is_the_token_ceiling() -> None:
    led = ledger(token_ceiling=10_000)
    served = admitted(led.admit("0", None, 0.0, served=True))
    assert (served.handle, served.budget) == ("served.1", 10_000)
    book = led.existing_book("served.1")
    assert book is not None and book.ceiling == 10_000
    child = admitted(led.admit("served.1", None, 0.0, budget=4000))
    assert (child.handle, child.budget) == ("served.1.1", 4000)
    assert led.add_tokens(1000, "served.1") is False  # the served run's own turns: its tree's root
    assert book.available(ROOT) == 10_000 - 1000 - 4000
    refused = led.admit("served.1", None, 0.0, budget=5001)
    assert isinstance(refused, Refusal) and refused.cap == "token_budget"
    assert "handle served.1 has 5000 tokens left of token_ceiling=10000" in refused.message
    assert led.add_tokens(4500, "served.1.1") is True  # past its slice: its subtree is cancelled
    led.release("served.1.1")
    # never more than its slice in the child's books; the 500 past it are recorded, and are its parent's spend
    assert book.spent(ROOT) == 1000 + 4000 + 500 and book.committed() == 5500 and book.overdrawn() == 0
    assert led.tree_tokens("served.1") == 5500 and led.tree_tokens("") == 0  # other trees are untouched


def test_a_served_spawn_with_a_token_budget_gets_that_ceiling_at_most_the_token_ceiling() -> None:
    led = ledger(token_ceiling=10_000)
    served = admitted(led.admit("0", None, 0.0, served=True, budget=3000))
    assert served.budget == 3000 and led.ceiling_of("served.1") == 3000
    assert led.add_tokens(3001, served.handle) is True  # past its ceiling: cancelled
    refused = led.admit(served.handle, None, 0.0)
    assert isinstance(refused, Refusal) and refused.cap == "token_ceiling"
    too_big = led.admit("0", None, 0.0, served=True, budget=10_001)
    assert isinstance(too_big, Refusal) and too_big.cap == "token_budget"
    assert "token_budget=10001 does not fit: a served run has at most token_ceiling=10000" in too_big.message
    assert admitted(led.admit("0", None, 0.0, served=True)).handle == "served.2"  # the refusal minted nothing


def test_each_served_tree_has_its_own_books() -> None:
    led = ledger(token_ceiling=1000)
    first = admitted(led.admit("0", None, 0.0, served=True))
    assert led.add_tokens(1000, first.handle) is False
    second = admitted(led.admit("0", None, 0.0, served=True))
    assert second.budget == 1000  # a served request is a run: the daemon does not run dry
    assert led.add_tokens(1, first.handle) is True and led.add_tokens(1, second.handle) is False


def test_a_served_tree_adopted_after_a_restart_continues_with_what_is_left() -> None:
    before = ledger(token_ceiling=10_000)
    served = admitted(before.admit("0", None, 0.0, served=True))
    child = admitted(before.admit(served.handle, None, 0.0, budget=5000))
    before.add_tokens(2000, served.handle)
    before.add_tokens(1500, child.handle)  # SIGKILL now: served.1.1 holds 5000, spent 1500
    book = before.existing_book("served.1")
    assert book is not None
    saved = Ledger.restore(book.snapshot())

    after = ledger(token_ceiling=10_000)
    after.mint_after("served", 1)  # the journaled handles
    assert after.adopt("served.1", saved) == ["served.1.1"]  # its slice ends: 1500 booked, 3500 refunded
    assert after.tree_tokens("served.1") == 3500
    # the warm session re-opened: a new handle, the root of its earlier tree, with what that has left
    reopened = admitted(after.admit("0", None, 0.0, served=True, tree="served.1"))
    assert (reopened.handle, reopened.budget) == ("served.2", 6500)
    assert after.tree_of(reopened.handle) == "served.1"
    grandchild = admitted(after.admit(reopened.handle, None, 0.0, budget=6000))
    assert grandchild.handle == "served.2.1"
    assert after.admit(reopened.handle, None, 0.0, budget=501).cap == "token_budget"  # type: ignore[union-attr]
    assert after.add_tokens(501, reopened.handle) is True  # 3500 + 6000 held + 501 > 10,000
    adopted = after.existing_book("served.1")
    assert adopted is not None and adopted.committed() == adopted.ceiling == 10_000
    exhausted = after.admit("0", None, 0.0, served=True, tree="served.1")  # another re-open: nothing left
    assert isinstance(exhausted, Refusal) and exhausted.cap == "token_ceiling"
    assert after.release(reopened.handle) == "served.1"  # the session ended: its tree is over
    assert after.existing_book("served.1") is None and after.tree_tokens("served.1") == 3500 + 501


def test_a_served_tree_is_over_when_its_root_ends_but_not_in_a_drain() -> None:
    led = ledger()
    served = admitted(led.admit("0", None, 0.0, served=True))
    child = admitted(led.admit(served.handle, None, 0.0))
    assert led.release(child.handle) is None  # a subagent of the tree: its slice closed, the tree goes on
    assert led.existing_book("served.1") is not None
    assert led.release(served.handle) == "served.1" and led.existing_book("served.1") is None
    drained = admitted(led.admit("0", None, 0.0, served=True))
    led.draining = True
    assert led.release(drained.handle) is None and led.existing_book(drained.handle) is not None


# --- the saved books (LocalAuthority with a store) -----------------------------------------------------------


async def test_served_books_are_saved_restored_and_forgotten_through_the_store(tmp_path: Path) -> None:
    async with open_journal(str(tmp_path)) as store:
        authority = LocalAuthority(ledger(token_ceiling=10_000), store=store, run_id="run-1")
        served = admitted(await authority.admit("0", None, served=True))
        await authority.report_usage(served.handle, Usage(prompt_tokens=1200))
        child = admitted(await authority.admit(served.handle, None, budget=3000))
        await authority.report_usage(child.handle, Usage(prompt_tokens=700))
        saved = (await store.get_state(SERVED_NAMESPACE))["served.1"]
        assert saved["slices"] == {"root": [None, 10_000, 1200], "served.1.1": ["root", 3000, 700]}
        assert "served.1" not in await store.get_state(NAMESPACE)  # apart from the runs' books

        restarted = LocalAuthority(ledger(token_ceiling=10_000), store=store, run_id="run-1")
        restarted.ledger.mint_after("served", 1)
        again = admitted(await restarted.admit("0", None, served=True, tree="served.1"))
        assert (again.handle, again.budget) == ("served.2", 10_000 - 1200 - 700)
        await restarted.report_usage(again.handle, Usage(prompt_tokens=100))
        assert (await store.get_state(SERVED_NAMESPACE))["served.1"]["slices"] == {"root": [None, 10_000, 2000]}

        await restarted.release(again.handle)  # the session ended: nothing continues its tree
        assert "served.1" not in await store.get_state(SERVED_NAMESPACE)

        other = admitted(await restarted.admit("0", None, served=True))
        restarted.ledger.draining = True
        await restarted.release(other.handle)  # a drain: a warm session may come back after the restart
        assert other.handle in await store.get_state(SERVED_NAMESPACE)
