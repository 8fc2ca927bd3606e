"""The official MCP Python SDK 1.x's experimental tasks client (SEP-1686, 2025-11-25) against a served URL.

Run in ``.peers/mcp1-venv`` (the SDK 2.x dropped the experimental tasks API) as
``python sdk1_tasks_client.py <url> <instruction> <held-instruction>``: initialize, list the tools, call
``subagent.spawn`` as a task and poll it to its end, fetch its result, list the tasks, then cancel a second
(held) task. Prints one JSON document of what the SDK parsed, for the test to check.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import anyio
from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client


async def main(url: str, instruction: str, held: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with streamablehttp_client(url) as (read, write, _), ClientSession(read, write) as session:
        init = await session.initialize()
        out["protocol"] = init.protocolVersion
        out["capabilities"] = init.capabilities.model_dump(exclude_none=True)
        tools = await session.list_tools()
        out["support"] = {t.name: t.execution.taskSupport if t.execution else None for t in tools.tools}
        sync = await session.call_tool("subagent.spawn", {"instruction": instruction})
        out["sync"] = sync.model_dump(exclude_none=True, by_alias=True)
        created = await session.experimental.call_tool_as_task("subagent.spawn", {"instruction": instruction})
        out["created"] = created.task.status
        task_id = created.task.taskId
        with anyio.fail_after(30):
            async for status in session.experimental.poll_task(task_id):
                out.setdefault("seen", []).append(status.status)
        result = await session.experimental.get_task_result(task_id, types.CallToolResult)
        out["result"] = result.model_dump(exclude_none=True, by_alias=True)
        listed = await session.experimental.list_tasks()
        out["listed"] = [t.taskId for t in listed.tasks]
        out["task_id"] = task_id
        second = await session.experimental.call_tool_as_task("subagent.spawn", {"instruction": held})
        cancelled = await session.experimental.cancel_task(second.task.taskId)
        out["cancelled"] = cancelled.status
    return out


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    print(json.dumps(anyio.run(main, *sys.argv[1:4])), flush=True)
