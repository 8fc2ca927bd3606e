"""What waits for a person on the ``/ui/`` page, in a real headless Chromium watching a real serving agentd (a
subprocess) whose run calls a tool marked ``--approve``: a call that was waiting before the page opened is listed
(held for new subscribers: its id, tool, run, the argument summary with the secret as ``***``, how long it has
waited, moving on its own), one that starts waiting while the page is open appears live, and each leaves the list
once ``agentd ctl approve`` / ``deny`` decided it. The page shows; it has no control that decides.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.ctl.daemon import ctl
from tests.durable.peer import counting_peer
from tests.integration.agents import agentd_worker
from tests.peers.gateway import Rule, scripted_gateway, text, tool_call
from tests.ui.browser import WAIT_MS, chromium_path, connected_page, require_playwright

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]



def _watch(base: str, decide: Any) -> dict[str, Any]:
    """In a worker thread: the page before and after each decision (``decide(verb, id)`` runs ``agentd ctl``)."""
    from playwright.sync_api import expect

    seen: dict[str, Any] = {"console": [], "errors": []}
    with connected_page(base, seen) as page:
        people = page.locator("#people")
        expect(people).to_be_visible(timeout=WAIT_MS)
        first = page.locator('#pending tr[data-id="1"]')
        expect(first.locator("td.what")).to_have_text("pay__charge", timeout=WAIT_MS)
        expect(first.locator("td.run")).to_have_text("ui-appr")
        expect(first.locator("td.details")).to_have_text("key=k8, password=***")
        waited = first.locator("td.waited").text_content() or ""
        assert waited.endswith(" s"), waited
        page.wait_for_function(  # the waited time moves on its own (the page's tick)
            "(before) => document.querySelector('#pending tr[data-id=\"1\"] td.waited').textContent !== before",
            arg=waited, timeout=WAIT_MS)
        seen["buttons"] = people.locator("button, form, input").count()
        decide("approve", "1")
        expect(first).to_have_count(0, timeout=WAIT_MS)
        second = page.locator('#pending tr[data-id="2"]')  # the next call waits: it appears live
        expect(second.locator("td.details")).to_have_text("key=k9", timeout=WAIT_MS)
        expect(people).to_be_visible()
        decide("deny", "2")
        expect(second).to_have_count(0, timeout=WAIT_MS)
        expect(people).to_be_hidden(timeout=WAIT_MS)
        expect(page.locator('tr[data-handle="0"] td.status')).to_have_text("completed", timeout=WAIT_MS)
    return seen


async def test_the_page_lists_what_waits_for_a_person_and_follows_the_decisions(tmp_path):
    require_playwright()
    chromium_path()
    sock = str(tmp_path / "agentd.sock")
    rules = [Rule({"last_contains": "execution #1"}, tool_call("pay__charge", {"key": "k9"})),
             Rule({"last_contains": "denied"}, text("k8 charged, k9 refused"))]
    async with (
        scripted_gateway(rules=rules, default=tool_call("pay__charge", {"key": "k8", "password": "hunter2hunter2"}))
        as gw,
        counting_peer() as peer,
    ):
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp",
                "--approve", "pay__charge", "--instruction", "Charge k8 and k9.", "--run-id", "ui-appr",
                "--ctl-socket", sock, "--deadline", "300s"]
        async with agentd_worker(argv) as worker:
            decisions: list[tuple[int, dict[str, Any]]] = []

            async def decide(verb: str, item: str) -> None:
                decisions.append(await ctl(verb, item, "--socket", sock))

            with trio.fail_after(120):
                await worker.wait_event(lambda e: e.get("event") == "approval.pending")  # before the page opens
                seen = await trio.to_thread.run_sync(
                    _watch, worker.url.split("/mcp")[0], lambda verb, item: trio.from_thread.run(decide, verb, item))
    assert [code for code, _ in decisions] == [0, 0], decisions
    assert [c["key"] for c in peer.received] == ["k8"]  # k9 denied: never sent
    assert seen["buttons"] == 0  # display only: deciding is agentd ctl's
    assert seen["errors"] == [] and [c for c in seen["console"] if c[0] in ("error", "warning")] == [], seen
