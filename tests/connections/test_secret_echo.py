"""A server that echoes a credential back: agentd never repeats it, not to the model, not on stdout, not in
the transcript. Real MCP server (in-process, loopback HTTP), real recording gateway, real SQLite store."""

from __future__ import annotations

import json

import trio

from agentd.connections.transcript import read_run
from tests.connections.helpers import connection, run
from tests.connections.peer import mcp_peer
from tests.peers.gateway import scripted_gateway, tool_call

SECRET = "hdr-Tok3n-Wq7Xe2Rv9Lp4"


async def test_an_echoed_header_secret_is_redacted_everywhere_agentd_writes_or_forwards(tmp_path):
    db = tmp_path / "t.sqlite3"
    async with (
        mcp_peer(echo_header="X-Api-Key") as peer,
        # The model calls the tool, then answers with the last message it saw: the tool's observation.
        scripted_gateway([tool_call("d__search", {"q": "status"}), {"echo_last": True}]) as gw,
    ):
        host = {
            "intelligence": {"url": gw.url, "model": "m"},
            "connections": {"docs": connection(f"{peer.origin}/mcp", tools=["search"], readTools=["search"],
                                               headers={"X-Api-Key": {"env": "DOCS_KEY"}})},
            "transcript": {"path": str(db), "dataPolicy": "full"},
        }
        manifest = {"connections": [{"ref": "docs", "alias": "d"}],
                    "steps": [{"id": "answer", "prompt": "What is the status?", "tools": ["d__search"]}]}
        with trio.fail_after(30):
            outcome = await run(tmp_path, host, manifest, env={"DOCS_KEY": SECRET})
    assert outcome.code == 0, outcome.raw
    assert any(h.get("x-api-key") == SECRET for h in peer.headers_seen)  # sent where it belongs
    # The model's second request carries the observation: echoed, but redacted.
    observation = json.dumps(gw.requests[1].body)
    assert "you sent X-Api-Key: ***" in observation
    assert SECRET not in observation
    # stdout: the result document (and, with --stream, the event lines).
    assert "***" in outcome.doc["outputs"]["answer"]
    assert SECRET not in outcome.raw
    # The transcript.
    stored = read_run(str(db), "run-1")
    assert stored is not None and "you sent X-Api-Key: ***" in json.dumps(stored)
    assert SECRET not in json.dumps(stored)
    assert SECRET.encode() not in db.read_bytes()
