"""A cluster failover re-sends an idempotent call under the key it was first sent with: two agentd members against a
real PostgreSQL, the owner SIGKILLed while the call it sent hangs, the other member takes the item over after the
lease and resumes it from the shared journal (docs/mcp-client.md, "Idempotency keys")."""

from __future__ import annotations

import signal

from agentd.cluster.store import open_pg_journal
from agentd.cluster.work import enqueue
from tests.cluster.test_members import _is_done, _member_argv, _members, _owners, _pid_of, _wait_for
from tests.durable.peer import counting_peer
from tests.peers.gateway import Rule, scripted_gateway, text, tool_call
from tests.postgres import PASSWORD

KEY = "io.modelcontextprotocol/idempotency-key"


async def test_the_member_taking_over_resends_the_call_under_its_first_key(pg_dsn, tmp_path):
    async with counting_peer() as peer, scripted_gateway(
        rules=[Rule({"last_role": "tool"}, text("looked up"))],
        default=tool_call("pay__lookup", {"key": "order-7", "hold": "after"}),
    ) as gw, open_pg_journal(pg_dsn, PASSWORD) as store:
        async with _members(_member_argv(pg_dsn, gw, peer), 2, tmp_path) as procs:
            await enqueue(store, "job-1", "run", {"instruction": "look the order up"})
            [first] = await _wait_for(lambda: _owners(store, "job-1"))

            async def executed_once() -> bool:
                return peer.count("lookup") == 1

            await _wait_for(executed_once)  # executed, and its answer held: the owner dies waiting
            next(p for p in procs if p.pid == _pid_of(first)).send_signal(signal.SIGKILL)
            await _wait_for(lambda: _is_done(store, "job-1"), 60)
        owners = await _owners(store, "job-1")
    assert len(owners) == 2 and owners[1] != first
    assert peer.count("lookup") == 2
    sent, resent = (call["meta"] for call in peer.received)
    assert sent[KEY] == resent[KEY] and sent[KEY].startswith("job-1/")
    assert gw.requests[-1].messages[-1]["content"] == "lookup order-7 done (execution #2)"
