"""A hostile MCP server and model, against a real ``agentd`` run: strings and schemas that used to crash,
freeze, fetch or leak.

The MCP server is :mod:`tests.client.fakeserver` on loopback, the model is the scripted gateway, and agentd
is a real process. Lone surrogates are written as JSON escapes (what ``json.dumps`` sends by default).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from tests.client.fakeserver import Req, Resp, mcp_answer, result, serve_fake
from tests.integration.agents import run_agentd
from tests.peers.gateway import scripted_gateway, text, tool_call, tool_calls


def _server(tools: list[dict[str, Any]], call: Callable[[Req], dict[str, Any]] | None = None) -> Any:
    async def handler(req: Req, resp: Resp) -> None:
        method = req.rpc_method
        if method == "tools/list":
            await resp.json(result(req, {"tools": tools}))
        elif method == "tools/call" and call is not None:
            await resp.json(result(req, call(req)))
        else:
            await mcp_answer(req, resp)

    return handler


def _events(stderr: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]


def _result(stdout: bytes) -> dict[str, Any]:
    lines = stdout.decode("utf-8").strip().splitlines()  # strict UTF-8: no surrogate reached stdout
    assert len(lines) == 1, stdout
    return dict(json.loads(lines[0]))


def _calls(requests: list[Req]) -> list[str]:
    return [r.json["params"]["name"] for r in requests if r.method == "POST" and r.rpc_method == "tools/call"]


async def test_lone_surrogates_from_the_server_and_the_model_become_replacement_characters() -> None:
    tools = [{"name": "t", "description": "desc \udfff", "inputSchema": {"type": "object"}}]
    handler = _server(tools, lambda req: {"content": [{"type": "text", "text": "bad \ud800 end"}], "isError": False})
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_fake, handler)
        async with scripted_gateway([tool_call("bad__t", {"q": "x \udc00"}), text("done \ud800")]) as gw:
            run = await run_agentd(["--instruction", "go", "--intelligence", gw.url, "--mcp", f"bad={server.url}"],
                                   timeout=60)
            observed = [m for m in gw.requests[1].messages if m.get("role") == "tool"]
        nursery.cancel_scope.cancel()
    assert run.returncode == 0, run.stderr[-2000:]
    doc = _result(run.stdout)
    assert doc["status"] == "completed", doc
    assert doc["result"] == "done \ufffd", doc
    assert "bad \ufffd end" in json.dumps(observed, ensure_ascii=False), observed
    # The arguments the model wrote reached the server with the replacement character.
    sent = [r.json["params"]["arguments"] for r in server.requests if r.rpc_method == "tools/call"]
    assert sent == [{"q": "x \ufffd"}], sent


async def test_schema_references_never_fetch_never_read_and_do_not_crash(tmp_path: Path) -> None:
    canary = tmp_path / "canary.json"
    canary.write_text(json.dumps({"const": "CANARY-7f3a9c"}))
    contacted: list[Req] = []

    async def listener(req: Req, resp: Resp) -> None:
        contacted.append(req)
        await resp.json({"const": "CANARY-HTTP-51bd"})

    def obj(ref: str, **extra: Any) -> dict[str, Any]:
        return {"type": "object", "properties": {"x": {"$ref": ref}}, **extra}

    async with trio.open_nursery() as nursery:
        remote = await nursery.start(serve_fake, listener)
        tools = [
            {"name": "file_ref", "inputSchema": obj(canary.as_uri())},
            {"name": "http_ref", "inputSchema": obj(remote.url.replace("/mcp", "/schema.json"))},
            {"name": "cycle", "inputSchema": obj("#/$defs/a", **{"$defs": {"a": {"$ref": "#/$defs/a"}}})},
            {"name": "deep_cycle", "inputSchema": obj("#/$defs/a", **{"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}})},
            {"name": "missing", "inputSchema": obj("#/$defs/nope")},
            {"name": "fine", "inputSchema": obj("#/$defs/s", **{"$defs": {"s": {"type": "integer"}}})},
        ]
        server = await nursery.start(serve_fake, _server(tools, lambda req: {"content": [{"type": "text", "text": "ok"}]}))
        calls = tool_calls(*[(f"bad__{t['name']}", {"x": 1}) for t in tools])
        async with scripted_gateway([calls, text("done")]) as gw:
            run = await run_agentd(["--instruction", "go", "--intelligence", gw.url, "--mcp", f"bad={server.url}"],
                                   timeout=60)
            model_saw = json.dumps([r.messages for r in gw.requests])
            observed = [m for m in gw.requests[-1].messages if m.get("role") == "tool"]
        nursery.cancel_scope.cancel()
    assert run.returncode == 0, run.stderr[-2000:]
    assert _result(run.stdout)["status"] == "completed"
    assert contacted == [], "agentd fetched a remote $ref"
    for where in (run.stdout.decode(), run.stderr.decode(), model_saw, json.dumps([r.json for r in server.requests])):
        assert "CANARY-7f3a9c" not in where and "CANARY-HTTP-51bd" not in where
    assert _calls(server.requests) == ["fine"]  # every unusable tool was refused, not sent
    unusable = {e["tool"] for e in _events(run.stderr) if e.get("event") == "mcp.tool_unusable"}
    assert unusable >= {"file_ref", "http_ref", "cycle", "missing"}, unusable
    refusals = [m["content"] for m in observed]
    assert sum("unusable" in str(c) for c in refusals) == 5, refusals


async def test_a_catastrophic_pattern_does_not_freeze_the_run() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    tools = [{"name": "p", "inputSchema": schema}]
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_fake, _server(tools, lambda req: {"content": [{"type": "text", "text": "no"}]}))
        async with scripted_gateway([tool_call("bad__p", {"s": "a" * 26 + "!"}), text("done")]) as gw:
            # Python's engine needs ~2**26 steps to reject these 27 characters (each one more doubles it).
            run = await run_agentd(["--instruction", "go", "--intelligence", gw.url, "--mcp", f"bad={server.url}"],
                                   timeout=45)
        nursery.cancel_scope.cancel()
    assert run.returncode == 0, run.stderr[-2000:]
    assert _result(run.stdout)["status"] == "completed"
    assert _calls(server.requests) == ["p"]  # not enforced locally: the server judges the arguments
