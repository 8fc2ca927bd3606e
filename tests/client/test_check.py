"""``agentd check``'s logic: the document, the exit code, and no secret in the output."""

from __future__ import annotations

import json

import trio

from agentd.client.check import run_check
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import Redactor
from tests.client.fakeserver import Req, Resp, mcp_answer, serve_fake
from tests.client.helpers import Events, server
from tests.peers import launch


async def test_check_reports_every_server_and_exit_codes(modern_server: launch.PeerProcess) -> None:
    seen: list[Req] = []

    async def handler(req: Req, resp: Resp) -> None:
        seen.append(req)
        await mcp_answer(req, resp)

    events = Events()
    redactor = events.log.redactor
    secrets = SecretResolver({"TOKEN": "s3cr3t-token-value"}, redactor)
    dead = f"http://user:pw@127.0.0.1:{launch.free_port()}/mcp?key=abc"
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, handler)
        servers = [
            server(fake.url, "legacy", headers={"Authorization": "Bearer {{secret:TOKEN}}"}),
            server(modern_server.url, "modern"),
            server(dead, "gone", required=False),
        ]
        with trio.fail_after(30):
            doc, code = await run_check(servers, log=events.log, secrets=secrets)
        assert code == 0 and doc["ok"] is True
        by_name = {s["name"]: s for s in doc["servers"]}
        assert list(by_name) == ["legacy", "modern", "gone"]
        legacy = by_name["legacy"]
        assert (legacy["era"], legacy["protocolVersion"], legacy["connected"]) == ("legacy", "2025-11-25", True)
        assert legacy["serverInfo"] == {"name": "fake", "version": "0"}
        assert legacy["tools"][0]["name"] == "t" and legacy["resources"][0]["uri"] == "r://x"
        assert by_name["modern"]["era"] == "modern" and by_name["modern"]["protocolVersion"] == "2026-07-28"
        assert by_name["modern"]["instructions"] == "Modern-only test peer."
        gone = by_name["gone"]
        assert gone["connected"] is False and "error" in gone and gone["required"] is False
        assert gone["endpoint"].endswith("/mcp") and "pw" not in gone["endpoint"] and "key" not in gone["endpoint"]
        # The secret was sent, but appears nowhere in the document or the events.
        assert seen[0].headers["authorization"] == "Bearer s3cr3t-token-value"
        assert "s3cr3t" not in json.dumps(doc) and "s3cr3t" not in json.dumps(events.lines)

        doc, code = await run_check([server(fake.url, "ok"), server(dead, "needed")], log=events.log,
                                    secrets=SecretResolver({}, Redactor()))
        assert code == 6 and doc["ok"] is False
        assert doc["servers"][1]["connected"] is False
        nursery.cancel_scope.cancel()


async def test_check_missing_secret_names_the_reference_only() -> None:
    events = Events()
    async with trio.open_nursery() as nursery:
        fake = await nursery.start(serve_fake, mcp_answer)
        doc, code = await run_check([server(fake.url, "a", headers={"X-Key": "{{secret:NOPE}}"})], log=events.log,
                                    secrets=SecretResolver({}, events.log.redactor))
        nursery.cancel_scope.cancel()
    assert code == 6
    assert "NOPE" in doc["servers"][0]["error"]
    assert fake.requests == []  # nothing was sent without the header
