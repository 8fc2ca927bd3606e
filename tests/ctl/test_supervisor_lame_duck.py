"""In lame duck the supervisor refuses served spawns (retryable, cap ``lame_duck``) before admitting anything."""

from __future__ import annotations

from agentd.supervisor.caps import Refusal
from agentd.supervisor.supervisor import Caller, Origin, SpawnRequest, open_supervisor


async def test_lame_duck_refuses_served_spawns_without_admitting():
    async with open_supervisor(servers=frozenset()) as sup:
        sup.lame_duck = True
        refused = await sup.spawn(Caller(Origin.MANAGEMENT), SpawnRequest(instruction="work"))
        assert isinstance(refused, Refusal) and refused.cap == "lame_duck" and refused.retryable
        assert sup.statistics().tree_live == frozenset()  # nothing admitted, no slot taken
