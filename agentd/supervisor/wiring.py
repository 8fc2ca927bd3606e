"""How a run's :class:`~agentd.config.model.Config` becomes supervisor settings and a child's config.

The root builds its supervisor from the Config (caps, graces, liveness, drain); the Config itself travels
to children as JSON in the run payload (cattrs, one converter), together with the values of exactly the
secrets it references, so a child resolves ``{{secret:NAME}}`` from the payload and never from an
environment it does not have.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import cattrs
import trio

from agentd import telemetry
from agentd.events import EventLog
from agentd.journal.store import JournalStore
from agentd.supervisor.caps import Caps
from agentd.supervisor.ladder import Graces
from agentd.supervisor.liveness import LivenessSettings
from agentd.supervisor.supervisor import (
    Supervisor,
    SupervisorSettings,
    TestScript,
    open_supervisor,
    referenced_secrets,
)
from agentd.telemetry import metrics

if TYPE_CHECKING:
    from agentd.config.model import Config

_converter = cattrs.Converter()


def config_to_wire(cfg: Config) -> dict[str, Any]:
    wire: dict[str, Any] = _converter.unstructure(cfg)
    wire["mcp_servers"] = wire.pop("mcp")
    wire["allow_trifecta"] = False  # audited for the root run only, never inherited by a child
    return wire


def config_from_wire(wire: Mapping[str, Any]) -> Config:
    from agentd.config.model import Config

    data = dict(wire)
    data["mcp"] = data.pop("mcp_servers", [])
    return _converter.structure(data, Config)


def settings_from_config(cfg: Config) -> SupervisorSettings:
    return SupervisorSettings(
        caps=Caps(max_depth=cfg.max_depth, max_children=cfg.max_children, max_subagents=cfg.max_subagents,
                  token_ceiling=cfg.token_ceiling),
        graces=Graces(cancel=cfg.cancel_grace, term=cfg.term_grace),
        liveness=LivenessSettings(pong_timeout=cfg.pong_timeout, progress_timeout=cfg.progress_timeout),
        drain_timeout=cfg.drain_timeout,
    )


@asynccontextmanager
async def open_root_supervisor(
    cfg: Config, *, log: EventLog, env: Mapping[str, str], run_id: str = "", fork_server: bool = True,
    test_script: TestScript | None = None, ledger_store: JournalStore | None = None,
) -> AsyncIterator[Supervisor]:
    """The root agent's supervisor: caps from ``cfg``, children inherit ``cfg`` narrowed to their tool scope
    (MCP servers and A2A peers) and the secrets that narrowed config references.

    Children are forked from a pre-imported fork server by default (started on the first spawn; see
    docs/supervisor.md for the measurements behind that choice). When the process's drain latch fires,
    the supervisor stops accepting spawns and drains (running children get ``drain_timeout``).
    """
    from agentd.drain import current_drain

    wire = config_to_wire(cfg)
    secrets = referenced_secrets(wire, env)
    for value in secrets.values():
        log.redactor.add(value)  # whatever a child reports back is scrubbed like our own lines
    latch = current_drain()
    async with trio.open_nursery() as watchers, open_supervisor(
        # A tool scope names MCP servers and A2A peers alike; the Rule of Two judges the MCP servers' tags.
        servers=frozenset(s.name for s in (*cfg.mcp, *cfg.a2a_peers)), server_tags={s.name: s.tags for s in cfg.mcp},
        settings=settings_from_config(cfg), child_config=wire,
        secrets=secrets, log=log.bind(comp="supervisor"),
        telemetry={"run_id": run_id or cfg.run_id, "log_level": cfg.log_level, "log_content": cfg.log_content,
                   **({"otel": otel} if (otel := telemetry.child_settings()) is not None else {}),
                   **({"metrics": True} if metrics.enabled() else {})},
        fork_server=fork_server, test_script=test_script, ledger_store=ledger_store, run_id=run_id or cfg.run_id,
    ) as sup:

        async def stop_accepting() -> None:
            # Drain: no new subagents from here on; running ones finish or are cancelled with their run.
            await latch.wait()
            await sup.drain(cfg.drain_timeout)

        watchers.start_soon(stop_accepting)
        try:
            yield sup
        finally:
            watchers.cancel_scope.cancel()
