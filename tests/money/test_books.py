"""The money budget's decisions as data: prices read exactly, each spawn's money slice reserved out of its
caller's, a child's cost charged to its slice and the rest refunded at its release, a caller with no money
left refused, and the books saved and adopted with the token books through the state store."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentd.errors import ConfigError
from agentd.journal.ledger import MONEY_KEY, NAMESPACE, ROOT, Charged, Overdrawn, load_books
from agentd.journal.sqlite import open_journal
from agentd.prices import PICO_PER_USD, Price, parse_price_flag, parse_price_table, parse_usd, usd, usd_text
from agentd.supervisor.authority import LocalAuthority
from agentd.supervisor.caps import Admission, Caps, Refusal, TreeLedger
from agentd.supervisor.messages import Usage

DOLLAR = PICO_PER_USD


def ledger(budget: int | None = DOLLAR, **caps: object) -> TreeLedger:
    return TreeLedger(Caps(**{"spawn_burst": 100_000, "budget_usd": budget, **caps}),  # type: ignore[arg-type]
                      root_scope=frozenset())


def admitted(decision: Admission | Refusal) -> Admission:
    assert isinstance(decision, Admission), decision
    return decision


def test_prices_and_amounts_are_read_exactly() -> None:
    model, price = parse_price_flag("gpt-x=0.15/0.6")
    assert model == "gpt-x" and price == Price(150_000, 600_000)  # picodollars per token
    # 10 million tokens at $0.15/M and 1 at $0.60/M: no float drift, to the picodollar
    assert price.cost(10_000_000, 1) == 1_500_000_600_000
    assert usd(price.cost(10_000_000, 1)) == 1.5000006 and usd_text(price.cost(3, 0)) == "0.00000045"
    assert parse_usd("$2.50") == 2_500_000_000_000 and parse_usd(0.1, "x") == DOLLAR // 10
    assert parse_price_table({"m": {"input": 3, "output": "15"}}, "$.prices") == {"m": Price(3_000_000, 15_000_000)}
    for bad, says in (("m=1", "IN/OUT"), ("=1/2", "MODEL=IN/OUT"), ("m=-1/2", "non-negative"),
                      ("m=1/x", "expected a number"), ("m=0.0000001/1", "more than 6 decimal places")):
        with pytest.raises(ConfigError, match=says):
            parse_price_flag(bad)
    with pytest.raises(ConfigError, match=r"\$.prices.m: expected \{input"):
        parse_price_table({"m": {"input": 1}}, "$.prices")


@pytest.mark.parametrize("pico", [0, 1, 7, 10**12 - 1, 10**12, 123_456_789_012_345, 10**25 + 3, 2**63 - 1, -45])
def test_amounts_are_written_as_the_exact_decimal_without_decimal_arithmetic(pico: int) -> None:
    import decimal

    from agentd.agent.result import RunUsage

    exact = decimal.Decimal(pico).scaleb(-12)
    assert usd(pico) == float(exact)  # the nearest float, as Decimal rounds it
    assert RunUsage(cost=pico).to_json()["cost_usd"] == float(exact)  # the loop.step line's, written inline
    text = format(exact, "f")
    assert usd_text(pico) == (text.rstrip("0").rstrip(".") if "." in text else text)


def test_the_root_slice_a_report_charges_is_the_books_root() -> None:
    from agentd.supervisor.caps import ROOT_SLICE

    assert ROOT_SLICE == ROOT


def test_a_childs_cost_is_charged_to_its_slice_and_the_rest_refunded() -> None:
    led = ledger(max_children=3)
    child = admitted(led.admit("0", None, 0.0))
    money = led.existing_money("")
    assert money is not None
    assert money.available(child.handle) == DOLLAR // 4  # an even share among the root and 3 free slots
    assert isinstance(led.add_cost(DOLLAR // 10, child.handle), Charged)
    led.release(child.handle)
    assert money.available(ROOT) == DOLLAR - DOLLAR // 10  # spent booked to the root, the rest back
    assert isinstance(led.add_cost(DOLLAR, None), Overdrawn) and led.money_spent_out()
    refused = led.admit("0", None, 0.0)
    assert isinstance(refused, Refusal) and refused.cap == "budget_usd" and "budget_usd=1 reached" in refused.message


def test_a_child_past_its_money_slice_is_reported_and_no_budget_means_no_books() -> None:
    led = ledger(max_children=1)
    child = admitted(led.admit("0", None, 0.0))
    assert isinstance(led.add_cost(DOLLAR // 2 + 1, child.handle), Overdrawn)
    unpriced = ledger(None)
    admitted(unpriced.admit("0", None, 0.0))
    assert unpriced.add_cost(10**15) is None and unpriced.existing_money("") is None


async def test_the_money_books_are_saved_with_the_token_books_and_adopted(tmp_path: Path) -> None:
    async with open_journal(str(tmp_path)) as store:
        first = LocalAuthority(ledger(), store=store, run_id="run-1")
        child = await first.admit("0", None)
        assert isinstance(child, Admission)
        await first.report_usage(child.handle, Usage(100, 10, cost=DOLLAR // 100))
        verdict = await first.report_usage("0", Usage(100, 10, cost=DOLLAR // 2))
        assert verdict is False
        saved = (await store.get_state(NAMESPACE))["run-1"]
        assert MONEY_KEY in saved  # the money books are in the token books' state entry (one write)
        books = await load_books(store, "run-1")
        assert books is not None and books[1] is not None
        assert books[1].spent(ROOT) == DOLLAR // 2 and books[1].spent(child.handle) == DOLLAR // 100

        again = LocalAuthority(ledger(), store=store, run_id="run-1")  # a restarted process
        # the child's slice ended with the first process: what it spent is the root's, the rest refunded
        left = DOLLAR - DOLLAR // 2 - DOLLAR // 100
        assert await again.report_usage("0", Usage(0, 0, cost=left - 1)) is False
        money = again.ledger.existing_money("")
        assert money is not None and money.available(ROOT) == 1
        assert await again.report_usage("0", Usage(0, 0, cost=1)) == "budget_usd"  # spent to the picodollar


def test_a_reply_is_charged_in_one_pass_as_the_decisions_one_by_one_would() -> None:
    """``charge_reply`` (tokens and money together, on every reply) answers what ``add_tokens``, ``add_cost``
    and ``spent_out`` answer one by one, and leaves the same books, for the root and for a subagent."""

    def one_by_one(led: TreeLedger, tokens: int, cost: int | None, handle: str | None) -> tuple[bool, bool | str]:
        past = led.add_tokens(tokens, handle)
        spent = None if cost is None else led.add_cost(cost, handle)
        broke = spent is not None and spent.overdrawn
        if spent is not None and (broke or spent.remaining <= 0):
            return past or broke, "budget_usd"
        return past or broke, past or led.spent_out(handle)

    replies = [(400, DOLLAR // 10), (300, None), (250, DOLLAR // 3), (0, 0), (90, DOLLAR // 4), (10, DOLLAR),
               (5000, 1)]
    for budget in (DOLLAR, None):
        one, other = (ledger(budget, max_children=2, token_ceiling=4000) for _ in range(2))
        child = admitted(one.admit("0", None, 0.0)).handle
        assert admitted(other.admit("0", None, 0.0)).handle == child
        for handle in (child, None):
            for tokens, cost in replies:
                assert one.charge_reply(tokens, cost, handle) == one_by_one(other, tokens, cost, handle)
        assert one.tokens_used == other.tokens_used and one.tree_tokens() == other.tree_tokens()
        for books in (TreeLedger.existing_book, TreeLedger.existing_money):
            mine, theirs = books(one, ""), books(other, "")
            assert (mine is None) == (theirs is None) == (budget is None and books is TreeLedger.existing_money)
            assert mine is None or theirs is None or mine.snapshot() == theirs.snapshot()
    assert ledger().charge_reply(10, DOLLAR, "0.9") == (False, False)  # a handle the books do not know
