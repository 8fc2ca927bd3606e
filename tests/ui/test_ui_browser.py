"""The ``/ui/`` page in a real headless Chromium, watching a real serving agentd (a subprocess) whose served
run delegates to a subagent: the page draws the tree (status, tokens, the tool in flight, elapsed time),
follows a state change the test makes (the held model request answered) without a reload, shows a run's
recent event lines, inserts hostile model text as text, and logs no console error. A bearer listener's page
is reached by logging in (a session cookie), an mTLS listener's with a client certificate.

The scripted gateway runs in this process (it holds the subagent's model request until the test says so);
the browser runs in a worker thread (playwright's sync API), which calls back into trio to release it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from agentd.client import open_mcp_pool
from agentd.config.model import McpServerConfig
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from tests.integration.agents import agentd_worker
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.ui.browser import WAIT_MS, chromium_path, connected_page, require_playwright

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_children")]

#: A tool name the model makes up: markup, which the page must show as text.
HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'


def _script(gate: trio.Event) -> Any:
    def reply(request: RecordedRequest) -> dict[str, Any]:
        texts = json.dumps(request.messages)
        tool_results = sum(1 for m in request.messages if m.get("role") == "tool")
        if "CHILD TASK" in texts and tool_results == 0 and "SERVED TASK" not in texts:
            return text("child done", wait=gate, usage={"prompt_tokens": 3, "completion_tokens": 2})
        if tool_results == 0:  # the served run's first step: delegate
            return tool_call("subagent_spawn", {"instruction": "CHILD TASK"},
                             usage={"prompt_tokens": 11, "completion_tokens": 7})
        if tool_results == 1:  # the child answered: a made-up tool whose name is markup
            return tool_call(HOSTILE, {}, usage={"prompt_tokens": 1, "completion_tokens": 1})
        return text("served done", usage={"prompt_tokens": 1, "completion_tokens": 1})

    return reply


def _watch(base: str, release: Any) -> dict[str, Any]:
    """In a worker thread: open the page, check it against the daemon's state before and after ``release``."""
    from playwright.sync_api import expect

    seen: dict[str, Any] = {"console": [], "errors": []}
    with connected_page(base, seen) as page:
        served = page.locator('tr[data-handle="served.1"]')
        child = page.locator('tr[data-handle="served.1.1"]')
        # before: the served run waits in its subagent_spawn, the child in its model request
        expect(child.locator("td.status")).to_have_text("running", timeout=WAIT_MS)
        expect(served.locator("td.status")).to_have_text("running", timeout=WAIT_MS)
        expect(served.locator("td.tool")).to_have_text("subagent.spawn", timeout=WAIT_MS)
        expect(served.locator("td.tokens")).to_have_text("18", timeout=WAIT_MS)
        expect(child.locator("td.tokens")).to_have_text("0", timeout=WAIT_MS)
        expect(child.locator("td.handle")).to_contain_text("served.1.1")
        # the child's row is drawn under its parent's, indented
        handles = page.locator("#nodes td.handle").all_text_contents()
        assert [h.strip() for h in handles].index("served.1") < [h.strip() for h in handles].index("served.1.1")
        first = child.locator("td.elapsed").text_content() or ""
        assert first.endswith(" s"), first
        # the elapsed time of a running node moves on its own (the page's tick; no message needed)
        page.wait_for_function(
            "(before) => document.querySelector('tr[data-handle=\"served.1.1\"] td.elapsed').textContent"
            " !== before", arg=first, timeout=WAIT_MS)
        release()  # the child's model request is answered: everything after this is a live change
        expect(child.locator("td.status")).to_have_text("completed", timeout=WAIT_MS)
        expect(served.locator("td.status")).to_have_text("completed", timeout=WAIT_MS)
        expect(child.locator("td.tokens")).to_have_text("5", timeout=WAIT_MS)
        expect(served.locator("td.tokens")).to_have_text("22", timeout=WAIT_MS)
        expect(served.locator("td.tool")).to_have_text("", timeout=WAIT_MS)
        done = served.locator("td.elapsed").text_content()
        # a run's recent lines: select the served run; its tool calls are listed, markup as text
        served.click()
        expect(served).to_have_attribute("aria-selected", "true", timeout=WAIT_MS)
        lines = page.locator("#lines li")
        expect(lines.filter(has_text="tool.call").first).to_be_visible(timeout=WAIT_MS)
        expect(lines.filter(has_text=HOSTILE).first).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#lines-of")).to_have_text("of served.1")
        seen["images"] = page.locator("main img").count()
        seen["title"] = page.title()
        seen["done_elapsed"] = (done, served.locator("td.elapsed").text_content())
    return seen


async def test_the_page_draws_the_live_tree_of_a_served_run_and_follows_it():
    gate = trio.Event()
    require_playwright()
    chromium_path()
    async with scripted_gateway(default=_script(gate)) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url]
        async with agentd_worker(argv) as worker:
            base = worker.url.split("/mcp")[0]
            server = McpServerConfig(name="worker", url=worker.url)
            answers: list[Any] = []
            async with open_mcp_pool([server], log=EventLog(sink=lambda line: None),
                                     secrets=SecretResolver(env={}), run_id="t") as pool, \
                    trio.open_nursery() as nursery:

                async def spawn() -> None:
                    answers.append(await pool.call_tool("worker", "subagent.spawn", {"instruction": "SERVED TASK"}))

                nursery.start_soon(spawn)
                try:
                    with trio.fail_after(120):
                        seen = await trio.to_thread.run_sync(
                            _watch, base, lambda: trio.from_thread.run_sync(gate.set))
                finally:
                    gate.set()
        assert worker.returncode == 0
    assert answers and answers[0].structured["status"] == "completed", answers
    assert seen["errors"] == [] and [c for c in seen["console"] if c[0] in ("error", "warning")] == [], seen
    assert seen["images"] == 0 and seen["title"] == "agentd"
    done, later = seen["done_elapsed"]
    assert done == later and done.endswith(" s")  # an ended run's elapsed time stands still


def _log_in(base: str, token: str) -> dict[str, Any]:
    """In a worker thread: a bearer listener's page in a browser alone: the login form, a wrong token, the
    right one, then the live view (its WebSocket authenticated by the session cookie)."""
    from playwright.sync_api import expect, sync_playwright

    seen: dict[str, Any] = {"console": [], "errors": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), headless=True, timeout=WAIT_MS)
        try:
            page = browser.new_page()
            page.on("console", lambda m: seen["console"].append((m.type, m.text, page.url)))
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            response = page.goto(base + "/ui/")
            assert response is not None
            seen["first"] = (response.status, response.headers.get("www-authenticate"))
            page.fill("#token", "wrong-token-0000")
            page.click("button[type=submit]")
            expect(page.locator("#message")).to_have_text("That is not this daemon's token.", timeout=WAIT_MS)
            seen["cookies_after_wrong"] = page.context.cookies()
            page.fill("#token", token)
            live_from = len(seen["console"])  # the login page's own (its 401, the wrong token's) are before
            page.click("button[type=submit]")
            expect(page.locator("#status")).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
            root = page.locator('tr[data-handle="0"]')
            expect(root.locator("td.status")).to_have_text("completed", timeout=WAIT_MS)
            expect(root.locator("td.tokens")).to_have_text("5", timeout=WAIT_MS)
            expect(page.locator("#empty")).to_be_hidden()
            seen["live_console"] = seen["console"][live_from:]
            seen["login_console"] = seen["console"][:live_from]
            seen["cookies"] = page.context.cookies()
            seen["url"] = page.url
        finally:
            browser.close()
    return seen


async def test_a_bearer_listener_logs_a_browser_in_and_shows_the_live_page():
    require_playwright()
    chromium_path()
    token = "ui-browser-token-5678"
    async with scripted_gateway([text("done", usage={"prompt_tokens": 3, "completion_tokens": 2})]) as gw:
        argv = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--intelligence", gw.url, "--instruction", "go",
                "--serve-bearer", "{{secret:UI_TOKEN}}"]
        async with agentd_worker(argv, env={"UI_TOKEN": token}) as worker:
            with trio.fail_after(90):
                await worker.wait_event(lambda e: e.get("event") == "run.end")
                seen = await trio.to_thread.run_sync(_log_in, worker.url.split("/mcp")[0], token)
    status, challenge = seen["first"]
    assert status == 401 and challenge.startswith("Bearer")
    assert seen["cookies_after_wrong"] == []
    [cookie] = seen["cookies"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and token not in cookie["value"]
    assert seen["url"].endswith("/ui/"), seen["login_console"]
    assert seen["errors"] == [] and [c for c in seen["live_console"] if c[0] in ("error", "warning")] == [], seen


def _with_a_certificate(base: str, pki: Any) -> dict[str, Any]:
    """In a worker thread: an mTLS listener's page, without a client certificate (the handshake fails) and
    with one (the page and its WebSocket ride on it; the test CA is not the browser's, so its errors are
    ignored for the server certificate only)."""
    from playwright.sync_api import Error, expect, sync_playwright

    seen: dict[str, Any] = {"console": [], "errors": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), headless=True, timeout=WAIT_MS)
        try:
            bare = browser.new_context(ignore_https_errors=True).new_page()
            try:
                bare.goto(base + "/ui/")
                seen["bare"] = "loaded"
            except Error as exc:
                seen["bare"] = str(exc).splitlines()[0]
            context = browser.new_context(ignore_https_errors=True, client_certificates=[
                {"origin": base, "certPath": str(pki.client.cert), "keyPath": str(pki.client.key)}])
            page = context.new_page()
            page.on("console", lambda m: seen["console"].append((m.type, m.text)))
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            page.goto(base + "/ui/")
            expect(page.locator("#status")).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
            root = page.locator('tr[data-handle="0"]')
            expect(root.locator("td.status")).to_have_text("completed", timeout=WAIT_MS)
        finally:
            browser.close()
    return seen


async def test_an_mtls_listener_shows_the_page_to_a_browser_with_a_client_certificate(tmp_path):
    from tests.selfmcp.certs import make_pki

    require_playwright()
    chromium_path()
    pki = make_pki(tmp_path / "pki")
    async with scripted_gateway([text("done", usage={"prompt_tokens": 3, "completion_tokens": 2})]) as gw:
        argv = ["--serve-mcp", "https://127.0.0.1:0/mcp", "--serve-cert", str(pki.server.cert), "--serve-key",
                str(pki.server.key), "--serve-client-ca", str(pki.ca), "--intelligence", gw.url,
                "--instruction", "go"]
        async with agentd_worker(argv) as worker:
            with trio.fail_after(90):
                await worker.wait_event(lambda e: e.get("event") == "run.end")
                seen = await trio.to_thread.run_sync(_with_a_certificate, worker.url.split("/mcp")[0], pki)
    assert "net::ERR_" in seen["bare"], seen  # no certificate, no page: the TLS layer refuses the connection
    assert seen["errors"] == [] and [c for c in seen["console"] if c[0] in ("error", "warning")] == [], seen
