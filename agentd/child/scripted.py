"""A scripted turn runner for tests of the process boundary (crashes, garbage, hangs, ignored signals).

Reached only when the run payload carries ``test``, which only a Python-level ``Supervisor(test_script=)``
hook sets: no MCP peer, model, flag or environment variable can ask for it. Real agent turns go through
:mod:`agentd.child.turn`.

``test = {"steps": [[op, *args], ...], "ignore_cancel": bool, "ignore_sigterm": bool, "no_pong": bool,
"ignore_eof": bool}``; the steps run on every turn. Ops: ``sleep s``, ``usage prompt completion``,
``progress``, ``echo`` (result = this turn's message, the payload context, the views spawned so far, and the names, never the
values, of the secrets the child received), ``result value``,
``spawn request`` (a nested sync spawn; its view is appended to the result), ``spawn_async request``,
``fail reason``, ``crash code``, ``exit``, ``garbage``, ``oversize``, ``hang``, ``partial value``,
``ancestry`` (result = this process's pid, its Unix parent's pid, the tree parent it watches, and the views
spawned so far).
"""

from __future__ import annotations

import os
import struct
from typing import Any

import trio

from agentd.child.context import ChildContext
from agentd.supervisor.messages import Result


async def scripted_turn(ctx: ChildContext, message: str) -> Result:
    from agentd.supervisor.supervisor import Caller, Origin, SpawnRequest

    test = ctx.payload.test or {}
    value: Any = None
    spawned: list[Any] = []
    for step in test.get("steps", [["echo"]]):
        op, *args = step
        if op == "sleep":
            await trio.sleep(float(args[0]))
        elif op == "usage":
            await ctx.usage(int(args[0]), int(args[1]))
        elif op == "progress":
            await ctx.progress("scripted")
        elif op == "echo":
            value = {"message": message, "context": ctx.payload.context, "handle": ctx.payload.handle,
                     "depth": ctx.payload.depth, "tool_scope": ctx.payload.tool_scope,
                     "secret_names": sorted(ctx.payload.secrets), **({"spawned": spawned} if spawned else {})}
        elif op == "result":
            value = args[0]
        elif op == "ancestry":
            value = {"pid": os.getpid(), "ppid": os.getppid(), "parent": os.environ.get("AGENTD_PARENT_PID"),
                     "spawned": spawned}
        elif op in ("spawn", "spawn_async"):
            request = dict(args[0])
            scope = request.pop("tool_scope", None)
            req = SpawnRequest(tool_scope=None if scope is None else tuple(scope),
                               async_=op == "spawn_async", **request)
            view = await ctx.supervisor.spawn(Caller(Origin.STDIO, ctx.payload.handle), req)
            spawned.append(view.structured() if hasattr(view, "structured") else {"refused": view.message})
            value = {"spawned": spawned}
        elif op == "fail":
            raise RuntimeError(str(args[0]))
        elif op == "crash":
            os._exit(int(args[0]) if args else 3)
        elif op == "exit":
            os._exit(0)
        elif op == "garbage":
            await ctx.channel.send_stream.send_all(struct.pack(">I", 5) + b"\xff{not")
            await trio.sleep_forever()
        elif op == "oversize":
            await ctx.channel.send_stream.send_all(struct.pack(">I", 64 * 1024 * 1024) + b"{}")
            await trio.sleep_forever()
        elif op == "hang":
            await trio.sleep_forever()
        elif op == "partial":
            return Result(status="completed", partial=True, result=args[0])
    return Result(status="completed", partial=False, result=value)
