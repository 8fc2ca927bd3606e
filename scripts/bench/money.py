"""Cost accounting: what pricing a reply and keeping the money books adds to a journaled step.

    .venv/bin/python scripts/bench/money.py [--steps 1500] [--rounds 5] [--write]

A journaled step of a run with a token ceiling, as agentd commits it: the step's records (a model reply with
one tool call, the call's request and outcome, the usage: scripts/bench/journal.py's step), and the reply's
usage report to the root's authority, which charges the tree's books and saves them (one more state write).
With ``--budget-usd`` and ``--price`` the same step also prices the reply (the loop's meter), carries the cost
in the report, charges the money books and saves them with the token books (the same write, a larger
document). Measured as process CPU per step (``time.process_time``: the trio thread and the journal's worker
thread, JSON encoding and SQLite included), the two kinds interleaved in ``--rounds`` rounds of ``--steps``
steps each; the result is the median of the rounds' ratios. Target: the money adds at most 2 % of a step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import trio
from bench_doc import replace_section
from journal import step

from agentd.intelligence.wire import Usage
from agentd.journal.sqlite import open_journal
from agentd.loop.budgets import BudgetMeter, Limits
from agentd.prices import PICO_PER_USD, Price
from agentd.supervisor.authority import LocalAuthority
from agentd.supervisor.caps import Caps, TreeLedger

SECTION = "## Cost accounting"


def authority(store: object, run_id: str, budget: int | None) -> LocalAuthority:
    ledger = TreeLedger(Caps(budget_usd=budget, spawn_burst=1000), root_scope=frozenset())
    books = LocalAuthority(ledger, store=store, run_id=run_id)  # type: ignore[arg-type]
    for _ in range(3):  # three subagent slices open, as a tree that delegates has
        ledger.admit("0", None, 0.0)
    return books


async def rounds(steps: int, count: int) -> list[tuple[float, float]]:
    batches = [step(n) for n in range(steps)]
    results = []
    with tempfile.TemporaryDirectory() as state:
        async with open_journal(state) as journal:
            for r in range(count):
                plain = authority(journal, f"plain-{r}", None)
                money = authority(journal, f"money-{r}", 10**6 * PICO_PER_USD)
                meter_plain = BudgetMeter(Limits(max_tokens=0))
                meter_money = BudgetMeter(Limits(max_tokens=0), price=Price(3_000_000, 15_000_000))
                plain_cpu = money_cpu = 0.0
                for n, batch in enumerate(batches):
                    reply = Usage(1200 + n, 60)
                    c0 = time.process_time()
                    await journal.append(f"plain-{r}", batch)
                    meter_plain.add_usage(reply.prompt_tokens, reply.completion_tokens)
                    await plain.report_usage("0", reply)
                    plain_cpu += time.process_time() - c0
                    c0 = time.process_time()
                    await journal.append(f"money-{r}", batch)
                    cost = meter_money.add_usage(reply.prompt_tokens, reply.completion_tokens)
                    await money.report_usage("0", Usage(reply.prompt_tokens, reply.completion_tokens, 0, cost))
                    money_cpu += time.process_time() - c0
                results.append((plain_cpu / steps * 1000, money_cpu / steps * 1000))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    measured = trio.run(rounds, args.steps, args.rounds)
    plain = statistics.median(p for p, _ in measured)
    money = statistics.median(m for _, m in measured)
    ratio = statistics.median(m / p for p, m in measured)
    load = open("/proc/loadavg").read().split()[0]
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = (
        f"{SECTION}\n\n"
        f"Command: `.venv/bin/python scripts/bench/money.py --steps {args.steps} --rounds {args.rounds} --write` "
        f"(2-core VM, {stamp}, 1-minute load average {load} at the end; medians of {args.rounds} interleaved "
        "rounds). A journaled step with the token ceiling's books (the step's 4 records, the reply's usage report "
        "charging the tree's books and saving them) against the same step with `--budget-usd` and `--price` (the "
        "reply priced by the loop's meter, the cost in the report, the money books charged and saved with the "
        "token books in the same write). Process CPU per step (trio thread and journal worker thread).\n\n"
        "| step | process CPU per step | ratio |\n|---|---|---|\n"
        f"| tokens only | {plain:.3f} ms | 1 |\n"
        f"| tokens and money | {money:.3f} ms | {ratio:.3f} |\n\n"
        f"Cost accounting adds {100 * (ratio - 1):+.1f} % of a step's CPU (target: at most 2 %"
        f"{'' if ratio <= 1.02 else ': not met'}). The money books are integers (picodollars, agentd/prices.py): "
        "pricing a reply is two multiplications, charging it one ledger decision; most of the excess is the "
        "larger saved document (the money slices encoded beside the token slices in the same state write), the "
        "rest the money ledger's charge. The next step, if it matters: save a compact money snapshot (the slices' "
        "parents are the token books'), or keep the encoded books and patch only the charged slice.\n"
    )
    print(text)
    if args.write:
        replace_section(SECTION, text)


if __name__ == "__main__":
    main()
