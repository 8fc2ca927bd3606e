"""The daemon mode drivers: ``loop``, ``schedule`` and ``reactive``.

Each driver is one coroutine that arms its triggers, reports ``task_status.started()``, and runs
until the drain latch is set or :class:`DaemonRuns` decides to stop (breaker, lifetime budget). Every
fire goes through :meth:`DaemonRuns.run`, so it is an ordinary run with its own run id.

* ``loop``: run, wait ``--interval`` (0 or unset: back to back), run again. Failures back off.
* ``schedule``: ``--interval`` fires at a fixed rate from the start (the first fire is immediate; a
  fire that overruns skips the slots it missed rather than piling up), ``--cron`` fires at each
  matching UTC minute.
* ``reactive``: subscribe each ``--subscribe``/``--continue`` URI (and ``--on-event`` MCP event,
  agentd.modes.events), then wake on updates and events through the router; no run happens until something
  changes.

Every mode has the reactive machinery running, so an agent in ``loop`` mode may subscribe itself too.

Drain: stop taking fires and wakes, let running ones finish within ``--drain-timeout`` (then cancel
them), unsubscribe everything, and return: a clean drain is exit 0. The breaker ends the daemon with
``failed`` (exit 1); the lifetime budget with ``exhausted_tokens`` (exit 7) in loop and schedule mode
and a clean drain (exit 0) in reactive mode, as in the original agentd.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import attrs
import trio

from agentd.agent.result import RunResult, RunStatus
from agentd.config.cron import CronSchedule
from agentd.config.model import Config
from agentd.config.validate import split_subscription
from agentd.errors import AgentdError, ConfigError, flatten
from agentd.modes.continue_route import ContinueRoute, OpenSession
from agentd.modes.events import EventRoute
from agentd.modes.router import Router, Wake
from agentd.modes.runs import FAILED_STATUSES, DaemonRuns, Job
from agentd.modes.shared import Shared
from agentd.modes.wake_budget import WakeBudget
from agentd.modes.wake_prompt import events_instruction, wake_instruction, wakes_instruction
from agentd.modes.watch import CLEANUP_TIMEOUT, Origin, ResourcePool, Watcher, read_current
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog
from agentd.transport.webhook_app import WebhookReceiver

WallClock = Callable[[], float]
#: ``fire_once(key, instruction)``: enqueue one occurrence under its unique key (agentd.cluster.work.enqueue).
FireOnce = Callable[[str, str], Awaitable[bool]]
#: ``publish(snapshot)`` shows ``snapshot()`` for as long as the context is entered.
Publish = Callable[[Callable[[], Mapping[str, Any]]], contextlib.AbstractContextManager[None]]


@attrs.define(eq=False)
class DaemonContext:
    """What a driver needs besides its config: the runs, the pool (for reactivity) and the latch."""

    cfg: Config
    runs: DaemonRuns
    log: EventLog
    drain: trio.Event
    pool: ResourcePool | None = None
    server_names: Iterable[str] = ()
    open_session: OpenSession | None = None
    #: Wall-clock seconds since the epoch, for cron (tests pass one that follows trio's clock).
    wall_clock: WallClock = time.time
    watcher: Watcher | None = None
    router: Router | None = None
    continue_route: ContinueRoute | None = None
    #: Shows :func:`reactive_status` to ``agent://status`` while the daemon runs: handed in by the daemon, which
    #: owns both this mode and the served surface (None: nobody is looking).
    publish: Publish | None = None
    #: ``--cluster``: a cron occurrence is handed to the cluster under its key (once per key across the
    #: members, whichever member then runs it) instead of being run here; True when this call created it.
    fire_once: FireOnce | None = None
    #: ``--cluster``: the cluster owns the subscriptions (each watched by the one member holding its lease) and
    #: the agent's self-scheduled runs (agentd.modes.shared).
    shared: Shared | None = None
    #: ``--on-event``: the MCP event subscriptions, routed through the router like resource updates.
    events: EventRoute | None = None
    #: Where MCP events arrive by webhook (the daemon serves HTTPS); None: no webhook delivery.
    webhooks: WebhookReceiver | None = None


def reactive_status(ctx: DaemonContext) -> dict[str, Any]:
    """A read-only snapshot for ``agent://status``: what is watched and why, wakes, runs, budget."""
    runs, router = ctx.runs, ctx.router
    return {
        "mode": ctx.cfg.mode,
        "draining": not runs.accepting,
        "runs": runs.runs,
        "running": runs.active,
        "subscriptions": [view.to_json() for view in ctx.watcher.view()] if ctx.watcher is not None else [],
        "wakes": attrs.asdict(router.stats) if router is not None else None,
        **({"events": ctx.events.view()} if ctx.events is not None else {}),
        "lifetime_tokens": {"spent": runs.budget.spent, "limit": runs.budget.limit},
    }


async def run_daemon(ctx: DaemonContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                     ) -> RunResult:
    """Run ``ctx.cfg.mode`` until drained or stopped; the result's status carries the exit code."""
    cfg, runs = ctx.cfg, ctx.runs
    if cfg.mode == "reactive":
        runs.budget_status = RunStatus.COMPLETED
    body = _body_for(ctx)
    try:
        with ctx.publish(lambda: reactive_status(ctx)) if ctx.publish is not None else contextlib.nullcontext():
            return await _serve(ctx, body, task_status)
    except BaseExceptionGroup as group:
        error = flatten(group)
        if isinstance(error, AgentdError):
            raise error from None  # a bad --subscribe is exit 2, not a crash in a group
        raise


def drain_wait(drain_timeout: float) -> float:
    """How long running fires may take once draining: ``--drain-timeout`` minus a reserve (up to 2 s) for
    unsubscribing and closing sessions, so the whole drain fits the timeout the CLI enforces."""
    return max(0.0, drain_timeout - min(2.0, drain_timeout / 5))


async def _serve(ctx: DaemonContext, body: Callable[[], Awaitable[None]], task_status: trio.TaskStatus[None]
                 ) -> RunResult:
    cfg, runs = ctx.cfg, ctx.runs
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(runs.serve)
            if ctx.pool is not None:
                await _start_reactivity(ctx, nursery)
            if ctx.events is not None:
                await ctx.events.arm(cfg.modes.on_events, nursery)
            await _arm(ctx)
            if ctx.shared is not None and ctx.watcher is not None and ctx.router is not None:
                await nursery.start(ctx.shared.serve, ctx.watcher, ctx.router.notify)
            await runs.restore(ctx.router.notify if ctx.router is not None else None)
            nursery.start_soon(body)
            task_status.started()
            await _first_of(ctx.drain.wait, runs.stopping.wait)
            reason = "signal" if ctx.drain.is_set() else (runs.stop.reason if runs.stop else "")
            ctx.log.warn("drain.start", reason=reason, running=runs.active, drain_timeout=cfg.ladder.drain_timeout)
            runs.close()
            if ctx.router is not None:
                ctx.router.close()
            with trio.move_on_after(drain_wait(cfg.ladder.drain_timeout)) as waited:
                if ctx.router is not None:
                    await ctx.router.wait_idle()
                await runs.wait_idle()
            nursery.cancel_scope.cancel()
    finally:
        # Also when cancelled from outside (a forced stop): unsubscribing is shielded and bounded.
        if ctx.continue_route is not None:
            ctx.continue_route.close()
        if ctx.watcher is not None:
            await ctx.watcher.unwatch_all()
    ctx.log.warn("drain.end", outcome="cut" if waited.cancelled_caught else "drained", runs=runs.runs,
                 drain_timeout=cfg.ladder.drain_timeout)
    stop = runs.stop
    status = stop.status if stop is not None else RunStatus.COMPLETED
    return RunResult(
        run_id=runs.base_run_id,
        status=status,
        partial=False,
        result={"mode": cfg.mode, "runs": runs.runs, "stopped": stop.reason if stop else "drained"},
        steps=runs.runs,
        usage=runs.usage,
        error=stop.reason if stop is not None and status is not RunStatus.COMPLETED else None,
    )


async def _first_of(*waits: Callable[[], Awaitable[Any]]) -> None:
    async with trio.open_nursery() as nursery:
        async def one(wait: Callable[[], Awaitable[Any]]) -> None:
            await wait()
            nursery.cancel_scope.cancel()

        for wait in waits:
            nursery.start_soon(one, wait)


def _body_for(ctx: DaemonContext) -> Callable[[], Awaitable[None]]:
    cfg = ctx.cfg
    if cfg.mode == "loop":
        return lambda: _loop(ctx)
    if cfg.mode == "schedule":
        if cfg.modes.cron is not None:
            expr = CronSchedule.parse(cfg.modes.cron, cfg.modes.cron_tz)
            try:  # "0 0 30 2 *" parses but never fires: say so now (exit 2), not at the first fire
                expr.next_after(dt.datetime.fromtimestamp(ctx.wall_clock(), dt.UTC))
            except ValueError as exc:
                raise ConfigError(f"--cron {cfg.modes.cron!r}: {exc}") from None
            return lambda: _cron(ctx, expr)
        if cfg.modes.interval is None or cfg.modes.interval <= 0:
            raise ConfigError("--mode schedule needs --interval > 0 or --cron")
        return lambda: _fixed_rate(ctx, cfg.modes.interval)  # type: ignore[arg-type]
    if cfg.mode == "reactive":
        if ctx.pool is None:
            raise ConfigError("--mode reactive needs MCP servers to subscribe on")
        return trio.sleep_forever
    raise ConfigError(f"--mode {cfg.mode} is not a daemon mode")


def _instruction(ctx: DaemonContext) -> str:
    return ctx.cfg.instruction or ""


async def _loop(ctx: DaemonContext) -> None:
    interval = ctx.cfg.modes.interval or 0.0
    while ctx.runs.accepting:
        await ctx.runs.backoff_gate()
        if await ctx.runs.run(Job("loop", _instruction(ctx))) is None:
            return
        await trio.sleep(interval)


async def _fixed_rate(ctx: DaemonContext, interval: float) -> None:
    next_fire = trio.current_time()
    while ctx.runs.accepting:
        await trio.sleep_until(next_fire)
        await ctx.runs.backoff_gate()
        ctx.log.info("schedule.fire", trigger="interval", interval_s=interval)
        if await ctx.runs.run(Job("schedule", _instruction(ctx))) is None:
            return
        next_fire += interval
        now = trio.current_time()
        if next_fire <= now:
            missed = int((now - next_fire) // interval) + 1
            next_fire += missed * interval
            ctx.log.warn("schedule.fire", trigger="interval", skipped=missed, reason="the previous run overran")


def occurrence_key(expression: str, instruction: str, due: dt.datetime) -> str:
    """One cron occurrence's key across a cluster: the same schedule and instruction at the same minute."""
    digest = hashlib.sha256(f"{expression}\n{instruction}".encode()).hexdigest()[:16]
    return f"schedule.{digest}.{int(due.timestamp())}"


async def _cron(ctx: DaemonContext, expr: CronSchedule) -> None:
    while ctx.runs.accepting:
        now = ctx.wall_clock()
        due = expr.next_after(dt.datetime.fromtimestamp(now, dt.UTC))
        ctx.log.info("trigger.armed", trigger="cron", cron=expr.expression, tz=str(expr.tz),
                     next_fire=due.isoformat())
        await trio.sleep(max(0.0, due.timestamp() - now))
        if ctx.fire_once is not None:
            key = occurrence_key(expr.expression, _instruction(ctx), due)
            created = await ctx.fire_once(key, _instruction(ctx))
            ctx.log.info("schedule.fire", trigger="cron", cron=expr.expression, due=due.isoformat(), cluster=key,
                         enqueued=created)
            continue
        await ctx.runs.backoff_gate()
        ctx.log.info("schedule.fire", trigger="cron", cron=expr.expression, due=due.isoformat())
        if await ctx.runs.run(Job("schedule", _instruction(ctx))) is None:
            return


async def _start_reactivity(ctx: DaemonContext, nursery: trio.Nursery) -> None:
    assert ctx.pool is not None
    cfg = ctx.cfg
    ctx.router = Router(lambda wake: _wake(ctx, wake), debounce=cfg.modes.debounce,
                        max_concurrent=cfg.modes.max_concurrent_wakes, log=ctx.log, on_done=lambda w, e: _wake_done(ctx, e),
                        batch=cfg.modes.max_uris_per_wake,
                        bounded=lambda uri: ctx.continue_route is None or not ctx.continue_route.owns(uri),
                        budget=WakeBudget(per_uri=cfg.modes.max_wakes_per_uri_per_minute,
                                          per_daemon=cfg.modes.max_wakes_per_minute))  # fmt: skip
    ctx.watcher = Watcher(ctx.pool, ctx.router.notify, cfg.modes.poll_interval, ctx.log)
    if cfg.modes.on_events:
        ctx.events = EventRoute(ctx.pool, ctx.router.notify, ctx.log, ctx.runs.state, shared=ctx.shared,
                                webhooks=ctx.webhooks)
    ctx.runs.watcher = ctx.watcher
    if cfg.modes.continue_uris:
        if ctx.open_session is None:
            raise ConfigError("--continue needs warm sessions, which this build does not wire")
        ctx.continue_route = ContinueRoute(ctx.open_session, ctx.pool, _instruction(ctx), ctx.log)
    await nursery.start(ctx.watcher.run)
    await nursery.start(ctx.router.run)
    if ctx.continue_route is not None:
        await nursery.start(ctx.continue_route.run)


async def _arm(ctx: DaemonContext) -> None:
    """Subscribe the configured URIs. ``--continue`` wins over ``--subscribe`` for the same URI: one owner."""
    if ctx.watcher is None:
        return
    names = list(ctx.server_names)
    if not names:
        # No declared server owns any URI: nothing to subscribe on. Warn once and keep going (a worker
        # whose job is to serve stays up); with nothing to serve either, validation refused (exit 2).
        unowned = [split_subscription(v, names, flag="--continue")[1] for v in ctx.cfg.modes.continue_uris]
        unowned += [split_subscription(v, names)[1] for v in ctx.cfg.modes.subscribe]
        if unowned:
            ctx.log.warn("reactive.unowned", uris=unowned[:16], count=len(unowned),
                         reason="no MCP server is declared (--mcp) to own these URIs; nothing is subscribed")
        return
    continued = {split_subscription(v, names, flag="--continue") for v in ctx.cfg.modes.continue_uris}
    continued_uris = {uri for _, uri in continued}
    wanted: dict[str, tuple[str, Origin, str | None]] = {}
    for server, uri in continued:
        assert ctx.continue_route is not None
        ctx.continue_route.own(uri)
        wanted.setdefault(uri, (uri, Origin.CONTINUE, server))
    declared: list[tuple[str | None, str]] = []
    for value in ctx.cfg.modes.subscribe:
        server, uri = split_subscription(value, names)
        if uri in continued_uris:
            ctx.log.warn("config.warning", uri=uri, reason="--subscribe and --continue name the same URI; "
                         "--continue owns its updates")
            continue
        if ctx.shared is not None:  # the member holding its lease watches it
            declared.append((server, uri))
            continue
        wanted.setdefault(uri, (uri, Origin.CONFIG, server))
    # Armed concurrently (bounded): each is a read, a subscribe and a read, and a daemon may watch thousands.
    await ctx.watcher.watch_many(list(wanted.values()))
    if ctx.shared is not None:
        await ctx.shared.declare(declared + (ctx.events.declared() if ctx.events is not None else []))


async def _wake(ctx: DaemonContext, wake: Wake) -> None:
    """Notify-then-read: read the resource now (every resource of a batched wake), then run the instruction
    on what it is now."""
    assert ctx.pool is not None
    if ctx.continue_route is not None and ctx.continue_route.owns(wake.uri):
        await ctx.continue_route.feed(wake)
        return
    runs = ctx.runs
    await runs.backoff_gate()
    if not runs.accepting:
        return
    if ctx.events is not None and any(ctx.events.owns(item.uri) for item in wake.items):
        await _wake_events(ctx, ctx.events, wake)
        return
    if wake.also:
        read = await _read_batch(ctx, wake)
    else:
        one = await _read_one(ctx, wake)
        read = [one] if one is not None else []
    if not read:
        return  # another member owns these subscriptions now: the wake is its (fenced)
    metrics.woke(sum(item.updates for item in wake.items))
    # A resource may hold a credential a server echoed: registered secret values never reach the model.
    if len(read) == 1:
        _, server, contents = read[0]
        prompt = wake_instruction(_instruction(ctx), read[0][0].uri, server, contents)
    else:
        prompt = wakes_instruction(_instruction(ctx), [(item.uri, server, contents) for item, server, contents in read])
    result = await runs.run(Job("wake", ctx.log.redactor.scrub(prompt), read[0][0].uri))
    if result is not None and result.status in FAILED_STATUSES:
        ctx.log.bind(run_id=result.run_id).warn("reactive.wake_failed", uri=wake.uri, seq=wake.seq,
                                                 status=result.status.value, error=result.error or "")


async def _wake_events(ctx: DaemonContext, route: EventRoute, wake: Wake) -> None:
    """A wake carrying MCP events (agentd.modes.events): every occurrence pending for its subscriptions, and
    the resources a batched wake took along, read now. The cursors after the occurrences are journaled once the
    run has ended."""
    taken = [t for item in wake.items if route.owns(item.uri) and (t := route.take(item.uri)) is not None]
    others = [item for item in wake.items if not route.owns(item.uri)]
    ran = False
    try:
        changed: list[tuple[str, str | None, Any]] = []
        if others:
            read = await _read_batch(ctx, attrs.evolve(others[0], also=tuple(others[1:])))
            changed = [(item.uri, server, contents) for item, server, contents in read]
        if taken and ctx.shared is not None:  # recorded under this member's lease first, or not run here
            fenced = [item for item in taken if not await route.fenced(item)]
            for item in fenced:
                await route.done(item, ran=False)
            taken = [item for item in taken if item not in fenced]
        if not taken and not changed:
            return
        for item in taken:
            ctx.log.info("reactive.wake", uri=item.key, server=item.server, event_type=item.name, seq=wake.seq,
                         occurrences=len(item.occurrences), gap=item.gap,
                         wait_ms=round((trio.current_time() - wake.first_update_at) * 1000, 3))
        metrics.woke(sum(len(t.occurrences) for t in taken) + len(changed))
        prompt = events_instruction(_instruction(ctx), taken, changed)

        async def started(run_id: str) -> None:
            for item in taken:
                await route.started(item, run_id)

        result = await ctx.runs.run(Job("wake", ctx.log.redactor.scrub(prompt), wake.uri, started=started))
        ran = result is not None
        if result is not None and result.status in FAILED_STATUSES:
            ctx.log.bind(run_id=result.run_id).warn("reactive.wake_failed", uri=wake.uri, seq=wake.seq,
                                                     status=result.status.value, error=result.error or "")
    finally:
        # The cursors are journaled even when the wake is being cancelled (shielded, bounded).
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT):
            for item in taken:
                await route.done(item, ran=ran)


Read = tuple[Wake, "str | None", "list[Any] | None"]
#: Reads of one batched wake in flight at once: every read in flight holds its own HTTP/1.1 connection, and
#: httpx's pool costs CPU per request in proportion to the connections it keeps.
BATCH_READS = 4


async def _limited(limiter: trio.CapacityLimiter, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
    async with limiter:
        await fn(*args)


async def _read_one(ctx: DaemonContext, item: Wake, batch: int = 1) -> Read | None:
    """Read one URI of a wake (None contents: it no longer exists) and log its ``reactive.wake``; None when
    another cluster member owns the subscription now (``--cluster``: the wake is recorded fenced, or not run)."""
    assert ctx.pool is not None
    contents, server = await read_current(ctx.pool, item.uri, item.server)
    if ctx.shared is not None and not await ctx.shared.record(item.uri, contents):
        return None
    await ctx.runs.seen(item.uri, contents)
    ctx.log.info("reactive.wake", uri=item.uri, server=server, seq=item.seq, updates=item.updates,
                 wait_ms=round((trio.current_time() - item.first_update_at) * 1000, 3),
                 **({"batch": batch} if batch > 1 else {}))
    return item, server, contents


async def _read_batch(ctx: DaemonContext, wake: Wake) -> list[Read]:
    """Read every URI of a batched wake concurrently. One that cannot be read fails alone (logged, and a
    failure for the governor); the wake goes on with the rest, and fails only when none could be read.
    A URI another cluster member owns now is left out (empty: nothing for this member to run)."""
    items = wake.items
    done: dict[int, Read] = {}
    errors: list[Exception] = []

    async def one(index: int, item: Wake) -> None:
        try:
            read = await _read_one(ctx, item, len(items))
        except Exception as exc:
            errors.append(exc)
            ctx.log.error("reactive.wake_failed", uri=item.uri, seq=item.seq, error=type(exc).__name__,
                          message=str(exc))
            ctx.runs.note_failure(ctx.log)
        else:
            if read is not None:
                done[index] = read

    limiter = trio.CapacityLimiter(BATCH_READS)
    async with trio.open_nursery() as nursery:
        for index, item in enumerate(items):
            nursery.start_soon(_limited, limiter, one, index, item)
    if not done and errors:
        raise errors[0]
    return [done[index] for index in sorted(done)]


def _wake_done(ctx: DaemonContext, error: BaseException | None) -> None:
    """A wake that raised (its read failed, say) counts as a failure for the governor."""
    if error is not None:
        ctx.runs.note_failure(ctx.log)


__all__ = ["DaemonContext", "Publish", "reactive_status", "run_daemon"]
