"""How a run's :class:`~agentd.config.model.Config` becomes supervisor settings and a child's config.

The root builds its supervisor from the Config (caps, graces, liveness, drain); the Config itself travels
to children as JSON in the run payload (cattrs, one converter), together with the values of exactly the
secrets it references, so a child resolves ``{{secret:NAME}}`` from the payload and never from an
environment it does not have.

The converter is built, and the root's Config unstructured, only when a child is first spawned
(:class:`ChildConfig`): cattrs's import and its generated code for Config are most of a once run's start-up
that has no subagent. Which secrets the child config references is found without it (``attrs.asdict``
holds the same strings), so the redactor knows them from the start.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from agentd import telemetry
from agentd.security.rule_of_two import catalogue_tags
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
from agentd.telemetry.events import EventLog

if TYPE_CHECKING:
    import cattrs

    from agentd.config.model import Config
    from agentd.journal.store import JournalStore


@functools.cache
def _converter() -> cattrs.Converter:
    """The one converter of the wire config (imported and built on first use)."""
    import cattrs

    return cattrs.Converter()


def config_to_wire(cfg: Config) -> dict[str, Any]:
    return _for_child(_converter().unstructure(cfg))


def _for_child(doc: dict[str, Any]) -> dict[str, Any]:
    """What of an unstructured Config a child inherits (under the wire's names: each setting by its flat
    name, agentd.config.model.FLAT_NAMES)."""
    from agentd.config.model import flattened

    wire = flattened(doc)
    wire["mcp_servers"] = wire.pop("mcp")
    wire["allow_trifecta"] = False  # audited for the root run only, never inherited by a child
    # The daemon's own memberships stay with it: a child is no cluster member (so the DSN's password
    # reference never travels down) and serves no operator socket.
    wire["cluster"] = None
    wire["ctl_socket"] = None
    return wire


def config_from_wire(wire: Mapping[str, Any]) -> Config:
    from agentd.config.model import Config, nested

    data = dict(wire)
    data["mcp"] = data.pop("mcp_servers", [])
    return _converter().structure(nested(data), Config)


class ChildConfig(Mapping[str, Any]):
    """``config_to_wire(cfg)``, computed on first read: a run that spawns no child never unstructures it."""

    __slots__ = ("_cfg", "_wire")

    def __init__(self, cfg: Config) -> None:
        self._cfg = cfg
        self._wire: dict[str, Any] | None = None

    def _data(self) -> dict[str, Any]:
        if self._wire is None:
            self._wire = config_to_wire(self._cfg)
        return self._wire

    def __getitem__(self, key: str) -> Any:
        return self._data()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data())

    def __len__(self) -> int:
        return len(self._data())


def child_secrets(cfg: Config, env: Mapping[str, str]) -> dict[str, str]:
    """The values of the secrets the child config references (the same strings as the wire's, no cattrs)."""
    return referenced_secrets(_for_child(attrs.asdict(cfg)), env)


def settings_from_config(cfg: Config) -> SupervisorSettings:
    return SupervisorSettings(
        caps=Caps(max_depth=cfg.subagents.max_depth, max_children=cfg.subagents.max_children, max_subagents=cfg.subagents.max_total,
                  token_ceiling=cfg.budgets.token_ceiling, budget_usd=cfg.budgets.usd, spawn_rate=float(cfg.subagents.spawn_rate),
                  spawn_burst=cfg.subagents.spawn_burst),
        graces=Graces(cancel=cfg.ladder.cancel_grace, term=cfg.ladder.term_grace),
        liveness=LivenessSettings(pong_timeout=cfg.ladder.pong_timeout, progress_timeout=cfg.ladder.progress_timeout),
        drain_timeout=cfg.ladder.drain_timeout,
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
    from agentd.oversight.drain import current_drain

    secrets = child_secrets(cfg, env)
    for value in secrets.values():
        log.redactor.add(value)  # whatever a child reports back is scrubbed like our own lines
    latch = current_drain()
    async with trio.open_nursery() as watchers, open_supervisor(
        # A tool scope names MCP servers and A2A peers alike; the Rule of Two judges both (an untagged peer
        # brings untrusted input and external communication, agentd.security.rule_of_two.peer_tags).
        servers=frozenset(s.name for s in (*cfg.mcp, *cfg.a2a_peers)),
        server_tags=catalogue_tags(((s.name, s.tags) for s in cfg.mcp), ((p.name, p.tags) for p in cfg.a2a_peers)),
        settings=settings_from_config(cfg), child_config=ChildConfig(cfg),
        secrets=secrets, log=log.bind(comp="supervisor"),
        telemetry={"run_id": run_id or cfg.run_id, "log_level": cfg.telemetry.log_level, "log_content": cfg.telemetry.log_content,
                   **({"otel": otel} if (otel := telemetry.child_settings()) is not None else {}),
                   **({"metrics": True} if metrics.enabled() else {})},
        fork_server=fork_server, test_script=test_script, ledger_store=ledger_store, run_id=run_id or cfg.run_id,
        # Children journal their own runs beside the root's (one SQLite file; not in a cluster's shared journal).
        journal_dir=cfg.journal.state_dir if cfg.cluster.dsn is None else None,
    ) as sup:

        async def stop_accepting() -> None:
            # Drain: no new subagents from here on; running ones finish or are cancelled with their run.
            await latch.wait()
            await sup.drain(cfg.ladder.drain_timeout)

        watchers.start_soon(stop_accepting)
        try:
            yield sup
        finally:
            watchers.cancel_scope.cancel()
