"""A real headless Chromium for the ``/ui/`` tests: Debian's ``chromium`` package driven by playwright-python
through ``executable_path`` (browser download sites are unreachable: playwright's own build is never used).

``AGENTD_TEST_CHROMIUM`` names another binary. Without a browser or playwright the tests fail under
scripts/test (which installs the package when it is missing) and skip in ad-hoc runs, like the other peers.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

#: The binary the Debian launcher script (/usr/bin/chromium) execs: started directly, it prints nothing else.
DEBIAN_BINARY = Path("/usr/lib/chromium/chromium")
#: Bound on each wait for the page (a bound, not an expectation).
WAIT_MS = 30_000


def chromium_path() -> str:
    named = os.environ.get("AGENTD_TEST_CHROMIUM")
    if named:
        return named
    if DEBIAN_BINARY.is_file() and os.access(DEBIAN_BINARY, os.X_OK):
        return str(DEBIAN_BINARY)
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        reason = "chromium not found: install Debian's chromium package (scripts/test does) or set AGENTD_TEST_CHROMIUM"
        if os.environ.get("AGENTD_TEST_REQUIRE_PEERS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def require_playwright() -> None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        reason = "playwright is not installed (the [test] extra has it)"
        if os.environ.get("AGENTD_TEST_REQUIRE_PEERS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@contextmanager
def connected_page(base: str, seen: dict[str, Any]) -> Iterator[Any]:
    """In a worker thread: a headless Chromium's page on ``base + "/ui/"`` once it says it is connected, its
    console lines (``seen["console"]``) and page errors (``seen["errors"]``) collected; closed however the block
    ends."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), headless=True, timeout=WAIT_MS)
        try:
            page = browser.new_page()
            page.on("console", lambda m: seen["console"].append((m.type, m.text)))
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            page.goto(base + "/ui/")
            expect(page.locator("#status")).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
            yield page
        finally:
            browser.close()
