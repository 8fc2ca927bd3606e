"""The browser view: how long after a state change the ``/ui/`` page shows it.

    .venv/bin/python scripts/bench/ui.py [--changes 30] [--write]

A real serving agentd (a subprocess, scripted gateway in this process) and the page in Debian's headless
Chromium (playwright through ``executable_path``, as the suite's browser tests). The bench makes ``--changes``
served runs one after another (each a sync ``subagent.spawn`` answered at once); a run's end is the state change.
The page's own clock records when the number of rows marked ``completed`` grows (a MutationObserver on the table);
this process records when each spawn's answer came back (the run had ended, so its ``tree.node`` was published).
Latency = page time − answer time, both wall clocks of this machine. Target: the page reflects a change within a
second. Also: the page's CPU when nothing changes is not measured here (the page draws only on a message, and a
once-a-second tick while a row is running).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_doc import replace_section  # noqa: E402

from agentd.client import open_mcp_pool  # noqa: E402
from agentd.config.model import McpServerConfig  # noqa: E402
from agentd.security.secrets import SecretResolver  # noqa: E402
from agentd.telemetry.events import EventLog  # noqa: E402
from tests.integration.agents import agentd_worker  # noqa: E402
from tests.peers.gateway import scripted_gateway, text  # noqa: E402
from tests.ui.browser import DEBIAN_BINARY  # noqa: E402

OBSERVER = """() => {
  window.__completed = [];
  const count = () => document.querySelectorAll('tr[data-status="completed"]').length;
  let seen = count();
  new MutationObserver(() => {
    const now = count();
    for (; seen < now; seen++) window.__completed.push(Date.now() / 1000);
  }).observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
}"""


def _page(base: str, ready: threading.Event, finished: threading.Event, out: dict[str, Any]) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=os.environ.get("AGENTD_TEST_CHROMIUM", str(DEBIAN_BINARY)),
                                     headless=True, timeout=30_000)
        try:
            page = browser.new_page()
            page.goto(base + "/ui/")
            expect(page.locator("#status")).to_have_attribute("data-state", "connected", timeout=30_000)
            page.evaluate(OBSERVER)
            ready.set()
            finished.wait(600)
            out["completed"] = page.evaluate("() => window.__completed")
        finally:
            browser.close()


async def measure(changes: int) -> dict[str, Any]:
    ready, finished = threading.Event(), threading.Event()
    out: dict[str, Any] = {}
    answered: list[float] = []
    async with scripted_gateway(default=text("done", usage={"prompt_tokens": 3, "completion_tokens": 2})) as gw:
        # The spawn-rate limit (burst 8, 2/s) would refuse some of the changes: lifted, it is not measured here.
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url, "--spawn-rate", "1000",
                "--spawn-burst", "1000"]
        async with agentd_worker(argv) as worker:
            base = worker.url.split("/mcp")[0]
            server = McpServerConfig(name="worker", url=worker.url)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, _page, base, ready, finished, out)
                with trio.fail_after(60):
                    while not ready.is_set():
                        await trio.sleep(0.05)
                async with open_mcp_pool([server], log=EventLog(sink=lambda line: None),
                                         secrets=SecretResolver(env={}), run_id="bench") as pool:
                    for n in range(changes):
                        answer = await pool.call_tool("worker", "subagent.spawn", {"instruction": f"change {n}"})
                        assert not answer.is_error, answer
                        answered.append(time.time())
                        await trio.sleep(0.3)  # one change at a time
                    await trio.sleep(1.5)
                finished.set()
    completed = out.get("completed") or []
    latencies = [(page - done) * 1000 for page, done in zip(completed, answered, strict=False)]
    return {"changes": changes, "seen": len(completed), "latencies_ms": latencies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=30)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    result = trio.run(measure, args.changes)
    ms = sorted(result["latencies_ms"])
    median, worst = statistics.median(ms), ms[-1]
    load = os.getloadavg()[0]
    print(f"{result['seen']}/{result['changes']} changes seen; latency median {median:.1f} ms, max {worst:.1f} ms")
    if args.write:
        replace_section("## The browser view", "\n".join([
            "## The browser view",
            "",
            f"Command: `.venv/bin/python scripts/bench/ui.py --changes {args.changes} --write` (2-core VM, "
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, 1-minute load average {load:.2f} at the end). "
            "A real serving agentd and the `/ui/` page in Debian's headless Chromium; each change is a served run "
            "ending (a sync `subagent.spawn`), one at a time; latency is the page's clock when its count of "
            "completed rows grows minus this process's clock when the spawn's answer came back.",
            "",
            "| changes | seen by the page | latency median | latency max | target |",
            "|---|---|---|---|---|",
            f"| {result['changes']} | {result['seen']} | {median:.1f} ms | {worst:.1f} ms | within 1 s |",
            "",
            "The latency can come out below zero: the run's `tree.node` is published as it ends, a little before "
            "the spawn's answer reaches the client. With nothing connected the daemon draws nothing (no `/events` "
            "subscriber, no work); the page draws only when a message comes, and once a second while a row runs.",
        ]))


if __name__ == "__main__":
    main()
