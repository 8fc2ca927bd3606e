"""Serve the self-MCP over the test backend in its own process: ``python -m tests.selfmcp.standalone``.

Prints the URL on stdout once listening and serves until killed (used by the conformance and inspector
tests, which drive it from Node).
"""

from __future__ import annotations

import sys

import trio

from tests.selfmcp.harness import serving


async def main() -> None:
    async with serving() as served:
        print(served.url, flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    try:
        trio.run(main)
    except KeyboardInterrupt:
        sys.exit(0)
