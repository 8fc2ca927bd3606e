"""The SDK test peer plus one tool, ``whoami``, that answers with the ``_meta`` of its own ``tools/call``.

Run as ``python -m tests.agent.meta_server --port 0`` from the repository root; it prints ``LISTENING <url>``
like every peer. It reuses tests/peers/servers/sdk_server.py unchanged (whose tool list other tests pin).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import mcp_types as types

from tests.peers.servers import sdk_server as base


class MetaPeer(base.TestPeer):
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.tools.append(types.Tool(name="whoami", description="Return the _meta of this tools/call.",
                                     input_schema=base._schema({}, [])))

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == "whoami":
            raw: Any = params.meta or {}
            meta = raw if isinstance(raw, dict) else raw.model_dump(mode="json", by_alias=True)
            return types.CallToolResult(content=base._text(json.dumps(meta)), structured_content={"meta": meta})
        return await super().call_tool(ctx, params)


def _build_app(args: Any) -> Any:
    peer = MetaPeer(filler_tools=args.tools, page_size=args.page_size, instructions=args.instructions)
    return peer.server.streamable_http_app(json_response=args.mode in ("json", "stateless"),
                                           stateless_http=args.mode == "stateless", host=args.host,
                                           custom_starlette_routes=peer.routes())


def argv(**options: Any) -> list[str]:
    args = [sys.executable, "-m", "tests.agent.meta_server"]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


if __name__ == "__main__":
    base.build_app = _build_app
    try:
        asyncio.run(base.serve(base.parse_args()))
    except KeyboardInterrupt:
        sys.exit(0)
