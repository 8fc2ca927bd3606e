"""Compose the self-MCP from a :class:`~agentd.config.model.Config`: surface + ASGI app + HTTP server.

The daemon calls ``await nursery.start(serve_self_mcp, config, backend, ...)`` in its own nursery;
``shutdown_trigger`` is the drain latch. Returns once serving has stopped and open streams were drained.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio

from agentd.config.model import Config
from agentd.security.secrets import SecretResolver
from agentd.selfmcp.backend import SelfMcpBackend
from agentd.selfmcp.served_events import ServedEvents
from agentd.selfmcp.surface import AgentInfo, DaemonStatus, SelfMcpLimits, SelfMcpSurface
from agentd.telemetry.events import EventLog, null_log
from agentd.telemetry.stream import EVENTS_PATH
from agentd.transport.asgi_server import AsgiOptions, McpAsgiApp
from agentd.transport.gate import LOOPBACK_HOSTS
from agentd.transport.mounts import Mount
from agentd.transport.resource_server import OAuthSettings, ResourceServer
from agentd.transport.serve import ServeConfig, Serving, serve_mcp
from agentd.transport.webhook_app import PATH as WEBHOOK_PATH
from agentd.transport.webhook_app import WebhookReceiver

if TYPE_CHECKING:
    from agentd.cluster.store import PgJournal
    from agentd.cluster.watch import DoneWatch
    from agentd.journal.store import JournalStore
    from agentd.supervisor.supervisor import Supervisor


def serve_config(config: Config, secrets: SecretResolver) -> ServeConfig:
    """The listener settings; the bearer template is resolved here (and so registered for redaction)."""
    assert config.serve.mcp is not None
    return ServeConfig(
        url=config.serve.mcp,
        cert=Path(config.serve.cert) if config.serve.cert else None,
        key=Path(config.serve.key) if config.serve.key else None,
        client_ca=Path(config.serve.client_ca) if config.serve.client_ca else None,
        bearer=secrets.resolve(config.serve.bearer) if config.serve.bearer else None,
        max_connections=config.serve.max_connections,
        max_per_client=config.serve.max_per_client,
        http2=config.serve.http2,
        oauth=OAuthSettings(config.serve.oauth_issuer, config.serve.oauth_audience, config.serve.oauth_scope)
        if config.serve.oauth_issuer else None,
        websocket_paths=frozenset({EVENTS_PATH}),
    )


def build_app(config: Config, backend: SelfMcpBackend, cfg: ServeConfig, log: EventLog, *,
              run_id: str | None = None, daemon_status: DaemonStatus | None = None,
              events: ServedEvents | None = None) -> tuple[SelfMcpSurface, McpAsgiApp]:
    """``run_id`` is the daemon's real run id (``config.run_id`` is empty when the daemon generated one);
    ``daemon_status`` is the daemon mode's snapshot for ``agent://status`` (the daemon hands it in); ``events`` the
    served event log (journaled with ``--state-dir``; in memory when None)."""
    limits = SelfMcpLimits(
        max_concurrent_spawns=config.serve.max_spawns,
        max_warm=config.serve.max_warm,
        max_queued=config.serve.max_queued,
        retention=config.serve.retention,
        cancel_grace=config.ladder.cancel_grace,
    )
    info = AgentInfo(run_id=run_id or config.run_id, mode=config.mode)
    if daemon_status is not None:
        info = attrs.evolve(info, daemon_status=daemon_status)
    surface = SelfMcpSurface(backend, info, limits=limits, log=log, serve_tasks=config.serve.tasks, events=events)
    options = AsgiOptions(
        operator_scope=config.serve.oauth_operator_scope,
        accept_cancel=config.serve.accept_cancel,
        paths=cfg.paths,
        bearer=cfg.bearer,
        allowed_hosts=LOOPBACK_HOSTS if cfg.loopback else None,
        max_body=config.serve.max_body,
        keepalive=config.serve.keepalive,
        max_sessions=config.serve.max_sessions,
        oauth=ResourceServer(cfg.oauth, egress=config.egress.policy(), log=log) if cfg.oauth is not None else None,
    )
    return surface, McpAsgiApp(surface, options, log=log, owners=surface.owners)


def served_url(cfg: ServeConfig, serving: Serving) -> str:
    """``--serve-mcp`` with the bound port (``:0`` binds a free one): the default OAuth audience."""
    parts = urlsplit(cfg.url)
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    return urlunsplit((parts.scheme, f"{host}:{serving.port}", parts.path.rstrip("/"), "", ""))


async def serve_self_mcp(
    config: Config,
    backend: SelfMcpBackend,
    *,
    secrets: SecretResolver,
    shutdown_trigger: Callable[[], Awaitable[object]],
    log: EventLog | None = None,
    run_id: str | None = None,
    daemon_status: DaemonStatus | None = None,
    events: ServedEvents | None = None,
    webhooks: WebhookReceiver | None = None,
    task_status: trio.TaskStatus[Serving] = trio.TASK_STATUS_IGNORED,
) -> None:
    log = (log or null_log()).bind(comp="serve")
    cfg = serve_config(config, secrets)
    surface, app = build_app(config, backend, cfg, log, run_id=run_id, daemon_status=daemon_status, events=events)
    async with trio.open_nursery() as nursery:
        await nursery.start(surface.run)
        # --- A2A (--serve-a2a, docs/a2a.md): the same listener and gate, A2A paths mounted in front ---
        supervisor = getattr(backend, "supervisor", None)
        if config.serve.a2a and supervisor is not None:
            from agentd.selfmcp.a2a import A2aMount, A2aService, ServedLimits

            service = A2aService(
                supervisor, log=log,
                limits=ServedLimits(config.serve.max_spawns, config.serve.max_warm, config.serve.retention),
                busy=lambda: sum(1 for r in surface.runs.values() if r.final is None), owners=surface.owners,
            )  # fmt: skip
            await nursery.start(service.run)
            app.mount(*A2aMount(app, service, scheme="https" if cfg.tls else "http", instruction=config.instruction,
                                servers=[s.name for s in config.mcp], log=log).mounts())  # fmt: skip
        # --- end A2A ---
        if webhooks is not None and cfg.tls:  # MCP events by webhook: the servers' POSTs, signed, no bearer
            app.mount(Mount(WEBHOOK_PATH, webhooks, under=True))

        async def trigger() -> None:
            await shutdown_trigger()
            await surface.answered(ANSWER_MARGIN)  # calls whose runs just ended write their answers first

        oauth = app.options.oauth

        def bound(serving: Serving) -> None:
            if oauth is not None:
                oauth.bind(served_url(cfg, serving))
            if webhooks is not None and cfg.tls:
                parts = urlsplit(served_url(cfg, serving))
                webhooks.base_url = f"{parts.scheme}://{parts.netloc}"

        async def serve(task_status: trio.TaskStatus[Serving]) -> None:
            await serve_mcp(app, cfg, shutdown_trigger=trigger, log=log, on_bound=bound,
                            task_status=task_status)
            nursery.cancel_scope.cancel()  # drained: the run watchers go too

        serving: Serving = await nursery.start(serve)
        task_status.started(serving)


async def serve_for_daemon(
    cfg: Config,
    log: EventLog,
    *,
    env: Mapping[str, str] | None = None,
    supervisor: Supervisor | None = None,
    daemon_status: DaemonStatus | None = None,
    cluster: PgJournal | None = None,
    journal: JournalStore | None = None,
    cluster_watch: DoneWatch | None = None,
    webhooks: WebhookReceiver | None = None,
    task_status: trio.TaskStatus[Serving] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The daemon's serve task: the self-MCP over the daemon's root supervisor, until the drain latch.

    ``supervisor`` is the daemon's one root supervisor (agentd.daemon.main hands it over), so served
    spawns (Management origin) and the agent's own spawns (Stdio origin) meet the same chokepoint and
    count against the same caps; without one (a library caller) a root supervisor is opened here. With
    ``journal`` (``--state-dir``) served handles survive a restart (agentd.selfmcp.journaled).
    On drain the listener stops (streams get their final frames), then the supervisor drains its
    runs within ``--drain-timeout`` and cancels the rest down the kill ladder.
    """
    from agentd.oversight.drain import current_drain
    from agentd.selfmcp.supervised import SupervisorBackend
    from agentd.supervisor.wiring import open_root_supervisor

    environment = dict(os.environ if env is None else env)
    secrets = SecretResolver(env=environment, redactor=log.redactor)
    latch = current_drain()
    async with AsyncExitStack() as stack:
        if supervisor is None:
            supervisor = await stack.enter_async_context(
                open_root_supervisor(cfg, log=log, env=environment, run_id=log.run_id))
        root = supervisor
        drained = False

        async def drain_then_stop() -> None:
            # Served runs drain while the listener still answers (new spawns are refused): a sync spawn
            # in flight gets its final answer, its result or ``cancelled``, before the listener stops.
            nonlocal drained
            await latch.wait()
            await root.drain(served_drain_budget(root))
            drained = True

        async def serve(task_status: trio.TaskStatus[Serving]) -> None:
            backend: SelfMcpBackend = SupervisorBackend(root)
            events = None
            if cluster is not None:  # --cluster: async spawns are cluster work (agentd.selfmcp.clustered)
                from agentd.selfmcp.clustered import ClusterBackend

                backend = ClusterBackend(backend, cluster, cluster_watch)
            elif journal is not None:
                from agentd.selfmcp.journaled import JournaledBackend

                journaled = JournaledBackend(SupervisorBackend(root), journal, log.bind(comp="serve"),
                                             retention=cfg.serve.retention)
                await journaled.restore()
                backend = journaled
                events = ServedEvents(journal, log=log.bind(comp="serve"))  # cursors survive a restart
                await events.load()
            await serve_self_mcp(cfg, backend, secrets=secrets, shutdown_trigger=drain_then_stop,
                                 log=log, run_id=log.run_id, daemon_status=daemon_status, events=events,
                                 webhooks=webhooks, task_status=task_status)

        async with trio.open_nursery() as nursery:
            started: Serving = await nursery.start(serve)
            task_status.started(started)
        if not drained:
            await root.drain()


#: What the served drain keeps back from ``--drain-timeout`` to answer the calls in flight once their runs
#: ended (the CLI cancels everything at ``--drain-timeout``).
ANSWER_MARGIN: Final = 1.0


def served_drain_budget(supervisor: Supervisor) -> float:
    """How long served runs may keep running after the drain latch: ``--drain-timeout`` less the kill
    ladder's graces (ending the rest takes at most those) and :data:`ANSWER_MARGIN`."""
    graces = supervisor.settings.graces
    reserve = graces.cancel + graces.eof + graces.term + ANSWER_MARGIN
    return max(0.0, supervisor.settings.drain_timeout - reserve)
