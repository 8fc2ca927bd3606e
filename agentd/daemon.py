"""``agentd.main(cfg)``: the daemon's root.

::

    trio.run(agentd.main, cfg)          # a harness, or the CLI after load_config(argv)

``main`` owns the daemon nursery (the root of the nursery tree in docs/architecture.md) and dispatches on
``cfg.mode`` through :data:`MODES` (``once`` here, ``loop``/``schedule``/``reactive`` in agentd.modes);
``--serve-mcp`` starts the self-MCP serve task in the same nursery. ``main`` opens ONE root supervisor
around the daemon nursery and hands it to the serve task and to the mode runner, so served spawns and
the agent's own spawns share one chokepoint (caps, ``--max-subagents``, the token ceiling). It also owns the
window between them: the daemon mode publishes its status and the served ``agent://status`` reads it.
With ``--state-dir`` it opens the run journal once (agentd.run.open_state) and hands it to the mode runner;
without, no journal is opened and nothing is written.

A run itself is composed in agentd.run (open, run, end by one rule); nothing here is global, so two ``main``
calls in one trio process do not interfere. Whatever a mode runner raises ends as a :class:`RunResult` by
that rule (so the CLI always prints one JSON object), except a ``ConfigError`` (exit 2) and cancellation.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import trio

from agentd import telemetry
from agentd.agent.control import ControlToolRegistry
from agentd.agent.result import RunResult, RunStatus, RunUsage
from agentd.client.credentials import CredentialSource, use_credentials
from agentd.config.model import Config, McpServerConfig
from agentd.errors import ConfigError
from agentd.formats.ids import new_run_id
from agentd.intelligence.wire import Usage
from agentd.oversight.drain import current_drain
from agentd.oversight.operator import Operator, use_operator
from agentd.run import (
    Beside,
    Gateway,
    Opened,
    open_run,
    open_state,
    outcome_of,
    reraise_if_not_an_outcome,
    run_config,
)
from agentd.security.loopback import is_loopback_host
from agentd.security.secrets import SecretResolver
from agentd.supervisor.supervisor import Caller, Origin, Supervisor
from agentd.supervisor.tools import register_subagent_tools
from agentd.supervisor.wiring import open_root_supervisor
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog, LevelDial, Sink, stream_sink
from agentd.telemetry.health import Health, current_health, use_health
from agentd.telemetry.stream import EVENTS_PATH, EventBus, use_bus

if TYPE_CHECKING:
    import httpx

    from agentd.cluster.join import Cluster
    from agentd.cluster.member import Execute
    from agentd.cluster.work import WorkItem
    from agentd.ctl.commands import Controls, Loader
    from agentd.journal.store import JournalStore
    from agentd.modes.drivers import FireOnce
    from agentd.modes.shared import Shared
    from agentd.transport.serve import ServeConfig, Serving
    from agentd.transport.webhook_app import WebhookReceiver

#: How long the last export of spans may take when the daemon ends.
FINAL_FLUSH_TIMEOUT = 5.0
#: Open connections the metrics listener accepts (scrapers are few).
METRICS_MAX_CONNECTIONS = 16


class ModeRunner(Protocol):
    """Runs the daemon in one mode inside the daemon nursery; ``env`` is where secrets are looked up.

    ``supervisor`` is the daemon's one root supervisor: the runner offers its ``subagent.*`` tools and reports
    its runs' usage to it, and never opens another. ``board`` is where a daemon mode shows its status;
    ``journal`` is the run journal (``--state-dir``) or ``None``.
    """

    def __call__(
        self, cfg: Config, log: EventLog, daemon: trio.Nursery, *, env: Mapping[str, str] | None,
        supervisor: Supervisor, board: StatusBoard, journal: JournalStore | None,
        fire_once: FireOnce | None = None, shared: Shared | None = None,
    ) -> Awaitable[RunResult]: ...


class StatusBoard:
    """The daemon's window between its mode and its served surface: the mode publishes a snapshot function
    while it runs (:meth:`published`), ``agent://status`` reads it (:meth:`read`). One per ``main`` call.
    (A plain class, like the other holders a once run builds at start-up: agentd/cli.py.)"""

    __slots__ = ("_snapshot", "webhooks")

    def __init__(self, webhooks: WebhookReceiver | None = None) -> None:
        self._snapshot: Callable[[], Mapping[str, Any]] | None = None
        #: Where MCP events arrive by webhook (``--on-event`` while serving HTTPS): mounted on the served
        #: listener, registered with by the daemon mode's subscriptions.
        self.webhooks = webhooks

    @contextlib.contextmanager
    def published(self, snapshot: Callable[[], Mapping[str, Any]]) -> Iterator[None]:
        self._snapshot = snapshot
        try:
            yield
        finally:
            if self._snapshot is snapshot:
                self._snapshot = None

    def read(self) -> Mapping[str, Any] | None:
        return self._snapshot() if self._snapshot is not None else None


def open_log(cfg: Config, run_id: str) -> EventLog:
    """The process's event log as the config asks for it: JSON lines on stderr."""
    return EventLog(
        sink=stream_sink(sys.stderr),
        level=cfg.telemetry.log_level,
        log_content=cfg.telemetry.log_content,
        run_id=run_id,
        comp="agent",
    )


async def main(
    cfg: Config, *, log: EventLog | None = None, env: Mapping[str, str] | None = None,
    reload: Loader | None = None, beside: Callable[[], Awaitable[None]] | None = None,
) -> RunResult:
    """Run agentd as configured and return the root run's result (the CLI prints ``result.to_json()``).

    ``log`` replaces the stderr log (a harness capturing events); ``env`` is where ``{{secret:NAME}}``
    references are looked up (default: the process environment); ``reload`` re-reads the configuration for
    SIGHUP and ``agentd ctl reload`` (the CLI passes its argv and environment; without it a reload is refused).
    ``beside`` runs in the daemon nursery for the daemon's life (the CLI's live view redrawing its status line).
    """
    run_id = cfg.run_id or new_run_id()
    log = (log or open_log(cfg, run_id)).bind(run_id=run_id)
    if log.dial is None:  # one level for every copy of the daemon's log: a reload may change it
        log = log.bind(dial=LevelDial(log.level))
    runner = MODES.get(cfg.mode)
    if runner is None:
        raise ConfigError(f"--mode {cfg.mode!r} is not a mode (once, loop, schedule, reactive)")
    _start_tracing(cfg, env, log)
    if cfg.telemetry.metrics_addr is not None:
        metrics.enable()
    recorder = None
    if cfg.telemetry.report_file is not None:
        from agentd.telemetry.report import Recorder

        recorder = Recorder(caps={"token_ceiling": cfg.budgets.token_ceiling, "max_tokens": cfg.budgets.max_tokens,
                                  "max_steps": cfg.budgets.max_steps, "max_depth": cfg.subagents.max_depth,
                                  "max_children": cfg.subagents.max_children, "max_subagents": cfg.subagents.max_total,
                                  **({} if cfg.budgets.usd is None else {"budget_usd": cfg.budgets.usd / 10**12})})
        log = log.bind(sink=_tee(log.sink, recorder.record))
    bus = EventBus()
    if cfg.serve.mcp is not None:  # /events on the serve port: every line goes to its subscribers too
        log = log.bind(sink=_tee(log.sink, bus.publish))
    operator = Operator()
    # health asks the drain latch (current in the asking task, as before) and the operator through these
    health = Health(mode=cfg.mode, draining=lambda: current_drain().requested, lame_duck=lambda: operator.lame_duck)
    with (use_health(health), use_bus(bus), use_operator(operator), _people(cfg, bus),
          use_credentials(_HostCredentials(cfg, os.environ if env is None else env)),
          telemetry.remote_parent({"traceparent": cfg.telemetry.traceparent} if cfg.telemetry.traceparent else None)):
        try:
            return await _main(cfg, log, runner, env, run_id, operator, reload, beside)
        finally:
            with trio.CancelScope(shield=True):  # spans and metrics side by side: at most 5 s in all
                async with trio.open_nursery() as flushing:
                    flushing.start_soon(telemetry.flush, FINAL_FLUSH_TIMEOUT)
                    flushing.start_soon(metrics.flush, FINAL_FLUSH_TIMEOUT)
            if recorder is not None and cfg.telemetry.report_file is not None:
                try:
                    recorder.write(cfg.telemetry.report_file)
                except OSError as exc:
                    log.warn("config.warning", warning=f"--report-file {cfg.telemetry.report_file}: not written "
                                                       f"({exc.strerror})")


def _people(cfg: Config, bus: EventBus) -> contextlib.AbstractContextManager[Any]:
    """The queue of what waits for a person (agentd.oversight.approvals), where one can answer: a daemon with a control
    socket (``--ctl-socket``, or ``--state-dir``'s). Without one, an approval is denied and an elicitation
    declined at once. When the daemon serves, what waits is on ``/events`` (and so on ``/ui/``) for as long as
    it waits: ``approval.waiting``, held for every new subscriber, then ``approval.settled``."""
    if cfg.ctl_socket is None and cfg.journal.state_dir is None:
        return contextlib.nullcontext()
    from agentd.oversight.approvals import Approvals, Pending, use_approvals

    queue = Approvals()
    if cfg.serve.mcp is not None:
        def show(item: Pending, waiting: bool) -> None:
            key = f"approval {item.id}"
            if waiting:
                bus.hold(key, item.waiting_line)
            else:
                bus.release(key, item.settled_line())

        queue.watchers.append(show)
    return use_approvals(queue)


class _HostCredentials:
    """The daemon's credential source for OAuth / client-credentials connections (agentd.client.credentials):
    agentd.connections.source.HostCredentials, imported on the first such connection (a run without one, and a
    reload that adds one later, pay nothing until then)."""

    __slots__ = ("_cfg", "_env", "_source")

    def __init__(self, cfg: Config, env: Mapping[str, str]) -> None:
        self._cfg, self._env = cfg, env
        self._source: CredentialSource | None = None

    def auth_for(self, server: McpServerConfig, log: EventLog) -> httpx.Auth:
        if self._source is None:
            from agentd.connections.source import HostCredentials

            self._source = HostCredentials(self._env, self._cfg.egress.policy(), self._cfg.runtime_module)
        return self._source.auth_for(server, log)


async def _main(
    cfg: Config, log: EventLog, runner: ModeRunner, env: Mapping[str, str] | None, run_id: str,
    operator: Operator, reload: Loader | None, beside: Callable[[], Awaitable[None]] | None = None,
) -> RunResult:
    board = StatusBoard(_webhooks(cfg, log))
    escaped: ConfigError | None = None
    environ = os.environ if env is None else env
    # ONE root supervisor per daemon, opened before and closed after the daemon nursery: the served
    # self-MCP (Management origin) and the agent's own runs (Stdio origin) spawn through the same
    # chokepoint, so the caps are counted once (the token ceiling is per run tree: docs/supervisor.md).
    async with (
        _open_journal(cfg, log, environ) as (journal, cluster),
        open_root_supervisor(cfg, log=log, env=environ, run_id=log.run_id, ledger_store=journal) as supervisor,
        trio.open_nursery() as daemon,
    ):
        if beside is not None:
            daemon.start_soon(beside)
        metrics_port = await _start_observing(cfg, log, daemon, env)
        await _start_controls(cfg, log, daemon, operator, supervisor, board, journal, reload, cluster)
        served, serve_port = await _start_serving(cfg, log, daemon, env, supervisor, board, cluster, journal)
        where = addresses(cfg, serve_port, metrics_port)
        if where:
            log.bind(comp="proc").info("proc.ready", mode=cfg.mode, **where)
        if cluster is not None:
            from agentd.cluster.store import child_locator

            # The subagents of the member's own run and wakes journal in the shared database too (unfenced, as
            # those runs are); a claimed item's, fenced by its lease (_cluster_executor).
            supervisor.journal_at = child_locator(cluster.store, None)
            shared = await daemon.start(_claimed_runs_share, cfg, log, env) if cfg.cluster.capacity > 0 else None
            await daemon.start(cluster.serve, _cluster_executor(cfg, log, env, supervisor, cluster, shared))
        if (health := current_health()) is not None:
            health.started = True
        try:
            if served is not None and cfg.instruction is None:
                result = RunResult(run_id=run_id, status=RunStatus.COMPLETED)  # a pure worker: no own run
            elif cluster is not None and cfg.instruction is None:
                # A pure cluster worker: it runs claimed work until it is told to drain.
                await current_drain().wait()
                result = RunResult(run_id=run_id, status=RunStatus.COMPLETED)
            else:
                result = await runner(cfg, log, daemon, env=env, supervisor=supervisor, board=board,
                                      journal=journal, fire_once=_fire_once(cfg, cluster),
                                      shared=_shared(cfg, cluster))
        except BaseException as exc:
            try:
                reraise_if_not_an_outcome(exc, log, say=False)  # the run itself said it was cancelled
            except ConfigError as error:
                # Raised as itself once the daemon nursery is closed (not inside its exception group), so a
                # harness and the CLI both see the ConfigError (exit 2).
                escaped = error
                daemon.cancel_scope.cancel()
                result = RunResult(run_id=run_id, status=RunStatus.FAILED, error=str(error))
            else:
                result = outcome_of(exc, run_id=run_id, log=log)
        if served is not None and escaped is None:
            # While serving, the daemon stays up until signalled, whatever its mode; then the serve task
            # drains (listener, then served runs within --drain-timeout) and ends on its own.
            await served.wait()
        # Services other parts start in the daemon nursery (serve, watchers) end with the root run in once mode.
        daemon.cancel_scope.cancel()
    log.flush()  # the rate limiter's pending log.suppressed summaries
    if escaped is not None:
        raise escaped
    return result


@contextlib.asynccontextmanager
async def _open_journal(cfg: Config, log: EventLog, env: Mapping[str, str]
                        ) -> AsyncIterator[tuple[JournalStore | None, Cluster | None]]:
    """The run journal: the cluster's shared one with ``--cluster`` (agentd.cluster), else ``--state-dir``'s."""
    if cfg.cluster.dsn is None:
        async with open_state(cfg.journal.state_dir, log=log, keep_for=cfg.journal.keep_for,
                              keep_runs=cfg.journal.keep_runs) as journal:
            yield journal, None
        return
    from agentd.cluster.join import open_cluster  # psycopg: only for a cluster member
    from agentd.cluster.store import MemberJournal

    address = cfg.serve.mcp
    async with open_cluster(cfg, log, env, address=address) as cluster:
        yield MemberJournal(cluster.store, log.run_id), cluster


def _fire_once(cfg: Config, cluster: Cluster | None) -> FireOnce | None:
    """``--cluster``: a cron occurrence becomes a work item under its key, so it runs once in the cluster."""
    if cluster is None:
        return None
    from agentd.cluster.work import enqueue
    from agentd.journal.errors import JournalError

    async def fire_once(key: str, instruction: str) -> bool:
        payload: dict[str, Any] = {"instruction": instruction}
        if cfg.output_contract is not None:
            payload["output_contract"] = cfg.output_contract
        try:
            return await enqueue(cluster.store, key, "schedule", payload)
        except JournalError as exc:  # the database is away: another member may still enqueue this occurrence
            cluster.log.warn("cluster.unavailable", error=str(exc))
            return False

    return fire_once


def _shared(cfg: Config, cluster: Cluster | None) -> Shared | None:
    """``--cluster``: subscriptions owned by one member at a time, self-scheduled runs as work items."""
    if cluster is None:
        return None
    from agentd.cluster.subscriptions import Subscriptions, scope_of
    from agentd.modes.clustered import ClusterReactive

    subs = Subscriptions(cluster.store, scope_of(cfg.instruction or ""), cluster.queue.member, cluster.queue.capacity)
    payload = {"output_contract": cfg.output_contract} if cfg.output_contract is not None else {}
    return ClusterReactive(subs, cluster.log, cluster.ttl, payload)


async def _claimed_runs_share(cfg: Config, log: EventLog, env: Mapping[str, str] | None, *,
                              task_status: trio.TaskStatus[Opened] = trio.TASK_STATUS_IGNORED) -> None:
    """The MCP pool a member's claimed runs share, open for the member's life (as a daemon's wakes share the
    daemon's; a reload reopens its servers once): a thousand runs waiting at once hold a thousand conversations,
    not a thousand pools and their catalogues. Each run still opens its own model client, so a thousand model
    calls do not queue on one client's few connections or trip one breaker together. A required server that
    cannot be reached fails the member at its start (exit 6)."""
    async with open_run(Gateway.of(cfg), cfg.mcp, log=log, secrets=SecretResolver(env=env, redactor=log.redactor),
                        run_id=log.run_id, a2a_peers=cfg.a2a_peers, egress=cfg.egress.policy()) as opened:
        task_status.started(opened)
        await trio.sleep_forever()


def _cluster_executor(cfg: Config, log: EventLog, env: Mapping[str, str] | None, supervisor: Supervisor,
                      cluster: Cluster, shared: Opened | None = None) -> Execute:
    """How a member runs a claimed item: one run of this daemon's configuration with the item's instruction,
    journaled through the item's fenced journal (a re-claimed item resumes from its last committed step).

    The run is its own run tree (``Caller.tree`` is the item's id) with the ``subagent.*`` tools; its subagents
    journal their runs (``ITEM/STEP.CALL``) in the same database, each process with its own connection, every
    commit fenced by the item's lease (agentd.cluster.store.open_fenced_journal): after a failover the member
    that took the item over resumes them from their journals, and a member that lost it commits nothing."""
    from agentd.cluster.store import child_locator

    async def execute(item: WorkItem, journal: JournalStore) -> RunResult:
        payload = item.payload
        contract = payload.get("output_contract")
        controls = ControlToolRegistry()
        if cfg.subagents.max_depth > 0:
            register_subagent_tools(controls, supervisor, Caller(Origin.STDIO, supervisor.handle, tree=item.work_id,
                                                                 own_tree_only=True))
        supervisor.journal_trees[item.work_id] = child_locator(cluster.store, item.lease)

        async def settle() -> RunUsage:
            return await supervisor.settle_run(item.work_id)

        try:
            return await run_config(cfg, run_id=item.work_id, log=log, env=env,
                                    instruction=str(payload["instruction"]),
                                    output_contract=contract if isinstance(contract, str) else None, journal=journal,
                                    controls=controls, settle=settle, shared=shared)
        finally:
            supervisor.journal_trees.pop(item.work_id, None)

    return execute


def _tee(first: Sink, second: Sink) -> Sink:
    def both(line: dict[str, Any]) -> None:
        second(line)
        first(line)

    return both


async def _start_observing(cfg: Config, log: EventLog, daemon: trio.Nursery,
                           env: Mapping[str, str] | None) -> int | None:
    """The daemon's own observability tasks: heartbeat, health file, metrics listener, span exporter; the
    metrics listener's bound port (None without ``--metrics-addr``)."""
    health = current_health()
    if health is not None:
        daemon.start_soon(health.heartbeat)
        if cfg.telemetry.health_file is not None:
            daemon.start_soon(health.write_file, cfg.telemetry.health_file)
    if telemetry.enabled():
        daemon.start_soon(telemetry.run_exporter)
    if metrics.otel_enabled():
        daemon.start_soon(metrics.run_exporter)
    if cfg.telemetry.metrics_addr is not None:
        from agentd.transport.observe_app import serve_metrics  # the HTTP server: only with metrics

        resolver = SecretResolver(env=env, redactor=log.redactor)
        bearer = resolver.resolve(cfg.serve.bearer) if cfg.serve.bearer else None
        serving: Serving = await daemon.start(serve_metrics, metrics_serve_config(cfg, bearer), log)
        return serving.port
    return None


def with_port(url: str, port: int | None) -> str:
    """``url`` as it was given, with the bound port in place of ``:0`` (any other text kept verbatim)."""
    parts = urlsplit(url)
    if port is None or parts.port != 0:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit(":", 1)[0] + f":{port}"))


def addresses(cfg: Config, serve_port: int | None, metrics_port: int | None) -> dict[str, str]:
    """Where a daemon serves, for a person and for ``proc.ready``: the ``--serve-mcp`` URL as given (a ``:0``
    port replaced by the bound one), the A2A card when ``--serve-a2a``, the ``/events`` stream, the ``/ui/``
    page, the command
    that watches it, the metrics URL, the state directory and the control socket. Empty when nothing listens
    (and then nothing more is imported: a once run's start-up stays light)."""
    where: dict[str, str] = {}
    if cfg.serve.mcp is not None and serve_port is not None:
        url = with_port(cfg.serve.mcp, serve_port)
        parts = urlsplit(url)
        where["mcp"] = url
        if cfg.serve.a2a:
            from agentd.a2a.types import CARD_PATH

            where["a2a_card"] = urlunsplit((parts.scheme, parts.netloc, CARD_PATH, "", ""))
        from agentd.transport.ui_app import UI_PREFIX

        ws = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
        where["events"] = urlunsplit((ws, parts.netloc, EVENTS_PATH, "", ""))
        where["ui"] = urlunsplit((parts.scheme, parts.netloc, UI_PREFIX, "", ""))
        where["watch"] = f"agentd top {url}"
    if cfg.telemetry.metrics_addr is not None and metrics_port is not None:
        scheme = "https" if _metrics_tls(cfg) else "http"
        where["metrics"] = with_port(f"{scheme}://{cfg.telemetry.metrics_addr}/metrics", metrics_port)
    if not where:
        return where
    from agentd.ctl.server import socket_path

    if cfg.journal.state_dir is not None:
        where["state_dir"] = str(cfg.journal.state_dir)
    ctl = socket_path(cfg.ctl_socket, cfg.journal.state_dir)
    if ctl is not None:
        where["ctl_socket"] = str(ctl)
    return where


def _metrics_loopback(cfg: Config) -> bool:
    assert cfg.telemetry.metrics_addr is not None
    return is_loopback_host(cfg.telemetry.metrics_addr.rpartition(":")[0].strip("[]"))


def _metrics_tls(cfg: Config) -> bool:
    """A non-loopback ``--metrics-addr`` takes the self-MCP's TLS files; a loopback one stays plain HTTP
    without authentication (a local scraper, as documented), whatever the MCP listener uses."""
    return not _metrics_loopback(cfg) and cfg.serve.cert is not None and cfg.serve.key is not None


def metrics_serve_config(cfg: Config, bearer: str | None) -> ServeConfig:
    """``--metrics-addr`` as a listener: loopback plain and open; otherwise TLS (and mTLS) with the self-MCP's
    files and its bearer when they are given."""
    from agentd.transport.serve import ServeConfig

    assert cfg.telemetry.metrics_addr is not None
    tls = _metrics_tls(cfg)
    return ServeConfig(
        url=f"{'https' if tls else 'http'}://{cfg.telemetry.metrics_addr}/metrics",
        cert=Path(cfg.serve.cert) if tls and cfg.serve.cert else None,
        key=Path(cfg.serve.key) if tls and cfg.serve.key else None,
        client_ca=Path(cfg.serve.client_ca) if tls and cfg.serve.client_ca else None,
        bearer=None if _metrics_loopback(cfg) else bearer,
        max_connections=METRICS_MAX_CONNECTIONS,
        max_per_client=METRICS_MAX_CONNECTIONS,
    )


async def _start_controls(
    cfg: Config, log: EventLog, daemon: trio.Nursery, operator: Operator, supervisor: Supervisor,
    board: StatusBoard, journal: JournalStore | None, reload: Loader | None, cluster: Cluster | None = None,
) -> None:
    """The operator's controls (agentd.ctl): the paused state an earlier process saved, the control socket
    (``--ctl-socket``, or ``STATE_DIR/ctl.sock``) and SIGHUP as a reload. Without a journal or a socket (a
    once run) the controls' module loads only if a SIGHUP comes."""
    from agentd.ctl.server import serve_ctl, socket_path

    operator.on_change.append(lambda op: setattr(supervisor, "lame_duck", op.lame_duck))

    async def relevel(_old: Config, new: Config) -> None:
        if log.dial is not None:
            log.dial.level = new.telemetry.log_level

    operator.appliers.append(relevel)
    if journal is not None:
        from agentd.ctl.commands import restore_operator

        await restore_operator(operator, journal, log)
    built: list[Controls] = []

    def controls() -> Controls:
        if not built:
            from agentd.ctl.commands import Controls
            from agentd.oversight.approvals import current_approvals

            made = Controls(operator, cfg, supervisor, log.bind(comp="ctl"), journal=journal, loader=reload,
                            snapshot=board.read, approvals=current_approvals())
            if cluster is not None:
                capacity = cluster.board
                made.cluster = lambda: capacity.to_json(trio.current_time())
            built.append(made)
        return built[0]

    daemon.start_soon(_reload_on_sighup, controls)
    path = socket_path(cfg.ctl_socket, cfg.journal.state_dir)
    if path is not None:
        await daemon.start(serve_ctl, path, controls().handle, controls().log)


async def _reload_on_sighup(controls: Callable[[], Controls]) -> None:
    """SIGHUP re-reads the config (``ExecReload=kill -HUP $MAINPID``), as ``agentd ctl reload`` does."""
    try:
        receiver = trio.open_signal_receiver(signal.SIGHUP)
    except (RuntimeError, ValueError):  # not the main thread: there are no signals to watch
        return
    with receiver as signals:
        async for _ in signals:
            controls().log.warn("proc.signal", signal="SIGHUP", action="reload")
            await controls().reload(trigger="SIGHUP")


def _start_tracing(cfg: Config, env: Mapping[str, str] | None, log: EventLog) -> None:
    """``--otel``: trace this process and export its metrics (OTEL_SDK_DISABLED=true wins, and
    OTEL_METRICS_EXPORTER=none leaves metrics out); settings from the OTEL_* variables.
    Exporter header values (an API key, say) are secrets: registered with the log's redactor."""
    if not cfg.telemetry.otel:
        return
    from agentd.telemetry.settings import OtelSettings, sdk_disabled

    environ = os.environ if env is None else env
    if not sdk_disabled(environ):
        settings = OtelSettings.from_env(environ, log_content=cfg.telemetry.log_content)
        for value in (*settings.headers.values(), *settings.metrics_headers.values()):
            log.redactor.add(value)
        telemetry.enable(settings)
        if settings.metrics:
            metrics.enable_otel(settings)


async def _start_serving(
    cfg: Config, log: EventLog, daemon: trio.Nursery, env: Mapping[str, str] | None,
    supervisor: Supervisor, board: StatusBoard, cluster: Cluster | None = None,
    journal: JournalStore | None = None,
) -> tuple[trio.Event | None, int | None]:
    """Start ``--serve-mcp`` in the daemon nursery (agentd/selfmcp/serving.py): an event set when it ended,
    and the bound port."""
    if cfg.serve.mcp is None:
        return None, None
    from agentd.selfmcp.serving import serve_for_daemon  # the HTTP server: only for a daemon that serves

    ended = trio.Event()

    async def serve(task_status: trio.TaskStatus[Serving]) -> None:
        try:
            await serve_for_daemon(cfg, log, env=env, supervisor=supervisor, daemon_status=board.read,
                                   webhooks=board.webhooks,
                                   cluster=cluster.store if cluster is not None else None,
                                   cluster_watch=cluster.watch if cluster is not None else None,
                                   journal=journal, task_status=task_status)
        finally:
            ended.set()

    serving: Serving = await daemon.start(serve)
    return ended, serving.port


async def _once(
    cfg: Config, log: EventLog, daemon: trio.Nursery, *, env: Mapping[str, str] | None,
    supervisor: Supervisor, board: StatusBoard, journal: JournalStore | None, fire_once: FireOnce | None = None,
    shared: Shared | None = None,
) -> RunResult:
    """The root run: with the root supervisor's ``subagent.*``/``graph.run`` tools while depth remains, and,
    with an MCP server, the in-run ``subscribe`` and ``await_resource`` (agentd.modes.once).

    When the run ends its own subagents (``0.*``) are cancelled, as a finishing parent's are; served
    runs (``served.N``) on the same supervisor keep running until the daemon drains.
    """
    root = supervisor
    controls = ControlToolRegistry()
    if cfg.subagents.max_depth > 0:
        register_subagent_tools(controls, root, Caller(Origin.STDIO, root.handle))

    async def on_usage(usage: Usage, cost: int | None) -> bool | str:
        # The root's own tokens count against the tree ceiling like every descendant's, and it obeys it too.
        return await root.authority.report_usage(root.handle, usage, cost=cost)

    try:
        # Its result counts its subagents' usage once they ended (root.settle_run ends those left running).
        return await run_config(cfg, run_id=log.run_id, log=log, env=env, controls=controls, on_usage=on_usage,
                                journal=journal, settle=root.settle_run,
                                beside=_in_run_waits(cfg, log, controls) if cfg.mcp else None)
    except BaseException:
        drain = current_drain()
        if drain.requested:  # cut by the drain's end: its subagents' usage still shows in the final document
            with trio.CancelScope(shield=True):
                used = await root.settle_run()
            drain.note_subagents(used.prompt_tokens, used.completion_tokens, used.estimated_tokens)
        raise
    finally:
        root.cancel_own_subtree("parent ended")


def _in_run_waits(cfg: Config, log: EventLog, controls: ControlToolRegistry) -> Beside:
    def beside(opened: Opened) -> contextlib.AbstractAsyncContextManager[None]:
        from agentd.modes.once import in_run_waits  # the watcher: only for a once run with an MCP server

        return in_run_waits(opened, controls, log, cfg.modes.poll_interval)

    return beside


async def _daemon_mode(
    cfg: Config, log: EventLog, daemon: trio.Nursery, *, env: Mapping[str, str] | None,
    supervisor: Supervisor, board: StatusBoard, journal: JournalStore | None, fire_once: FireOnce | None = None,
    shared: Shared | None = None,
) -> RunResult:
    from agentd.modes.entry import daemon_mode  # the router and watchers: only for a daemon mode

    return await daemon_mode(cfg, log, daemon, env=None if env is None else dict(env), supervisor=supervisor,
                             publish=board.published, journal=journal, fire_once=fire_once, shared=shared,
                             webhooks=board.webhooks)


def _webhooks(cfg: Config, log: EventLog) -> WebhookReceiver | None:
    """The webhook receiver of a daemon that wakes on MCP events and serves (HTTPS only: its URL is set once
    the listener is bound, agentd.selfmcp.serving)."""
    if not cfg.modes.on_events or cfg.serve.mcp is None:
        return None
    from agentd.transport.webhook_app import WebhookReceiver

    return WebhookReceiver(log=log.bind(comp="webhooks"))


#: ``cfg.mode`` -> its runner.
MODES: dict[str, ModeRunner] = {
    "once": _once,
    "loop": _daemon_mode,
    "schedule": _daemon_mode,
    "reactive": _daemon_mode,
}
