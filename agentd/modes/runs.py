"""One place every daemon fire goes through: run ids, budgets, the governor, self-requests, drain.

Whatever starts a run in a daemon mode (a loop iteration, a schedule or cron fire, a wake, a run the
agent scheduled for itself) calls :meth:`DaemonRuns.run`. That gives each an ordinary run with its own
run id and its own self-tools, clips its token budget to what is left of the lifetime budget, feeds
its outcome to the restart governor, and applies the subscribe/unsubscribe/schedule requests it
queued once it has ended. When the governor's breaker opens or the lifetime budget runs out it records
why the daemon must stop and sets :attr:`stopping`; the mode driver then drains.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final, Literal

import attrs
import trio

from agentd.agent.budgets import Limits
from agentd.agent.control import ControlToolRegistry
from agentd.agent.result import RunResult, RunStatus, RunUsage
from agentd.journal.errors import JournalError
from agentd.journal.store import KEPT_RUNS, JournalStore
from agentd.modes.governor import LifetimeBudget, RestartGovernor
from agentd.modes.selftools import ScheduleRequest, SelfRequests, SubscriptionRequest, register_self_tools
from agentd.modes.shared import Shared
from agentd.modes.watch import Origin, Watcher, content_digest
from agentd.oversight.operator import current_operator
from agentd.telemetry.events import EventLog, null_log

Trigger = Literal["loop", "schedule", "wake", "scheduled", "continue", "resume"]
#: Statuses that count as a failure for the restart governor (budget cuts and refusals do not).
FAILED_STATUSES: Final = frozenset(
    {RunStatus.FAILED, RunStatus.CRASHED, RunStatus.INTELLIGENCE_FAILED, RunStatus.MCP_FAILED}
)
#: Runs the agent may have scheduled for itself and not yet started, daemon-wide.
MAX_PENDING_SCHEDULED: Final = 64
#: Daemon-state namespaces (``--state-dir``): the agent's own subscriptions (by URI, with the digest of the
#: contents last seen) and its pending self-scheduled runs (by id, with the wall-clock time and instruction).
SELF_SUBSCRIPTIONS: Final = "reactive.self_subscriptions"
SELF_SCHEDULES: Final = "reactive.self_schedules"


@attrs.frozen
class Job:
    trigger: Trigger
    instruction: str
    uri: str | None = None
    #: Earlier turns (OpenAI chat messages) a ``--continue`` session's run starts from.
    seed: tuple[Mapping[str, Any], ...] = ()
    #: A ``--continue`` turn: the run ids of the earlier turns ``seed`` is made of (journaled as references).
    seed_runs: tuple[str, ...] | None = None
    #: The run id of a wake an earlier process left unfinished: this run resumes it (``--state-dir``).
    resume: str | None = None
    #: Awaited with the run id just before the run starts (an event wake journals which run carries its cursor).
    started: Callable[[str], Awaitable[None]] | None = attrs.field(default=None, eq=False)


#: Runs one ordinary run: ``(job, run_id, controls, limits) -> RunResult``. The daemon's adapter opens
#: nothing per run: it calls the loop with the daemon's pool and intelligence and its built-in tools.
RunJob = Callable[[Job, str, ControlToolRegistry, Limits], Awaitable[RunResult]]


@attrs.frozen
class Stop:
    """Why the daemon ends on its own: the breaker (exit 1) or the lifetime budget."""

    status: RunStatus
    reason: str


@attrs.define(eq=False)
class DaemonRuns:
    run_job: RunJob
    base_run_id: str
    limits: Limits
    log: EventLog = attrs.field(factory=null_log)
    governor: RestartGovernor = attrs.field(factory=RestartGovernor)
    budget: LifetimeBudget = attrs.field(factory=LifetimeBudget)
    watcher: Watcher | None = None
    #: Lifetime budget exhaustion: reactive daemons drain and exit 0, loop/schedule exit 7.
    budget_status: RunStatus = RunStatus.EXHAUSTED_TOKENS
    accepting: bool = True
    stop: Stop | None = None
    stopping: trio.Event = attrs.field(factory=trio.Event)
    runs: int = 0
    usage: RunUsage = attrs.field(factory=RunUsage)
    #: The journal's daemon state (``--state-dir``): self subscriptions and schedules survive a restart.
    state: JournalStore | None = None
    #: Wakes an earlier process left unfinished (``Job("resume", ...)``, each with its seed): run by :meth:`restore`.
    unfinished: list[Job] = attrs.field(factory=list)
    #: ``--cluster``: the agent's subscriptions and scheduled runs are the cluster's (agentd.modes.shared).
    shared: Shared | None = None
    _kept_uris: set[str] = attrs.field(factory=set, init=False)
    _active: int = attrs.field(default=0, init=False)
    _idle: trio.Event = attrs.field(factory=trio.Event, init=False)
    _not_before: float = attrs.field(default=-math.inf, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _scheduled: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self._idle.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the timers of runs the agent scheduled for itself; runs until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def close(self) -> None:
        """Drain: start nothing new (running runs go on; scheduled timers are dropped)."""
        self.accepting = False
        if (operator := current_operator()) is not None:
            operator.poke()  # runs held by a lame duck give up

    async def _admitted(self) -> bool:
        """The operator's lame duck holds a new run until it ends; False once the daemon stopped accepting."""
        operator = current_operator()
        if operator is None or not operator.lame_duck:
            return self.accepting
        return await operator.admit(lambda: self.accepting)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    @property
    def active(self) -> int:
        return self._active

    def halt(self, status: RunStatus, reason: str) -> None:
        if self.stop is None:
            self.stop = Stop(status, reason)
        self.accepting = False
        self.stopping.set()

    async def backoff_gate(self) -> None:
        """Wait out the governor's backoff after a failure before starting the next run.

        Without a backoff due it returns without a scheduling round: it sits on the wake path, whose
        budget is a few milliseconds, and every caller checkpoints soon after anyway.
        """
        if self._not_before > trio.current_time():
            await trio.sleep_until(self._not_before)

    @contextmanager
    def _counted(self) -> Iterator[None]:
        if self._active == 0:
            self._idle = trio.Event()
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def run(self, job: Job) -> RunResult | None:
        """One ordinary run of ``job``; None when the daemon is no longer taking runs."""
        if not await self._admitted():
            return None
        if self._out_of_budget():
            return None
        with self._counted():
            if job.resume is None:
                self.runs += 1
            run_id = job.resume or f"{self.base_run_id}.{self.runs}"
            log = self.log.bind(run_id=run_id)
            requests = SelfRequests()
            controls = ControlToolRegistry()
            register_self_tools(controls, requests, self.watcher)
            max_tokens = self.limits.max_tokens
            left = self.budget.remaining()
            if left is not None:
                max_tokens = left if max_tokens == 0 else min(max_tokens, left)
            limits = self.limits if max_tokens == self.limits.max_tokens else attrs.evolve(self.limits,
                                                                                            max_tokens=max_tokens)
            log.info("trigger.fired", trigger=job.trigger, uri=job.uri, run=self.runs)
            log.info("run.start", mode="daemon", trigger=job.trigger, uri=job.uri,
                     instruction=log.content(job.instruction), max_tokens=max_tokens)
            try:
                if job.started is not None:
                    await job.started(run_id)
                result = await self.run_job(job, run_id, controls, limits)
            except Exception as exc:  # one crashed run is an outcome; the daemon goes on
                log.error("run.failed", error=f"{type(exc).__name__}: {exc}", trigger=job.trigger, uri=job.uri)
                result = RunResult(run_id=run_id, status=RunStatus.CRASHED, error=f"{type(exc).__name__}: {exc}")
            log.emit("run.end", "warn" if result.status in FAILED_STATUSES else "info", status=result.status.value,
                     trigger=job.trigger, uri=job.uri, steps=result.steps, usage=result.usage.to_json(),
                     partial=result.partial, **({"error": result.error} if result.error else {}))
            self.budget.charge(result.usage.total_tokens)
            self.usage = self.usage.add(result.usage.prompt_tokens, result.usage.completion_tokens)
            self._account(result, log)
            if requests:
                await self.apply(requests, log)
            self._out_of_budget()
            return result

    def _account(self, result: RunResult, log: EventLog) -> None:
        if result.status not in FAILED_STATUSES:
            self.governor.success()
            return
        self.note_failure(log)

    def note_failure(self, log: EventLog) -> None:
        """A fire failed (a failed run, or a wake whose read failed): back off, or open the breaker."""
        now = trio.current_time()
        verdict = self.governor.failure(now)
        if verdict.breaker_open:
            log.error("governor.breaker", failures=verdict.failures_in_window, window_s=self.governor.window)
            self.halt(RunStatus.FAILED, f"restart breaker open: {verdict.failures_in_window} failures within "
                                        f"{self.governor.window:g} s")
            return
        self._not_before = now + verdict.backoff
        log.warn("governor.backoff", backoff_s=verdict.backoff, failures=verdict.failures_in_window)

    def _out_of_budget(self) -> bool:
        if not self.budget.exhausted:
            return False
        if self.stop is None:
            self.log.warn("budget.exhausted", budget="lifetime_tokens", spent=self.budget.spent,
                          limit=self.budget.limit)
        self.halt(self.budget_status, f"lifetime token budget of {self.budget.limit} spent")
        return True

    async def apply(self, requests: SelfRequests, log: EventLog) -> None:
        """Apply what the run queued, in order. A failed request is logged; it never fails the daemon."""
        for sub in requests.subscriptions:
            if self.shared is not None and self.watcher is not None:
                await self._apply_shared(self.shared, sub, log)
                continue
            if self.watcher is None:
                log.warn("mcp.subscribe", uri=sub.uri, action=sub.action, origin="self", applied=False,
                         reason="no reactive machinery in this mode")
                continue
            try:
                if sub.action == "subscribe":
                    if not self.watcher.watching(sub.uri, Origin.SELF):
                        await self.watcher.watch(sub.uri, Origin.SELF)
                elif self.watcher.watching(sub.uri, Origin.SELF):
                    await self.watcher.unwatch(sub.uri, Origin.SELF)
                else:
                    log.info("mcp.subscribe", uri=sub.uri, action="unsubscribe", origin="self", applied=False,
                             reason="not subscribed by the agent (operator subscriptions stay)")
                    continue
                log.info("mcp.subscribe", uri=sub.uri, action=sub.action, origin="self", applied=True)
                if sub.action == "subscribe":
                    await self._keep_subscription(sub.uri, await self._digest(sub.uri), log)
                else:
                    await self._keep_subscription(sub.uri, None, log, drop=True)
            except Exception as exc:
                log.warn("mcp.subscribe", uri=sub.uri, action=sub.action, origin="self", applied=False,
                         error=type(exc).__name__, reason=str(exc))
        for request in requests.schedules:
            if self.shared is not None:
                await self.shared.schedule(request.after_seconds, request.instruction)
                continue
            self.schedule(request.after_seconds, request.instruction, log,
                          key=await self._keep_schedule(request, log))

    async def _apply_shared(self, shared: Shared, sub: SubscriptionRequest, log: EventLog) -> None:
        """A subscribe/unsubscribe of the agent as a cluster row: whichever member owns it watches it."""
        try:
            if sub.action == "subscribe":
                await shared.subscribe(sub.uri)
            elif not await shared.unsubscribe(sub.uri):
                log.info("mcp.subscribe", uri=sub.uri, action="unsubscribe", origin="self", applied=False,
                         reason="not subscribed by the agent (operator subscriptions stay)")
                return
        except JournalError as exc:
            log.warn("mcp.subscribe", uri=sub.uri, action=sub.action, origin="self", applied=False,
                     error=type(exc).__name__, reason=str(exc))
            return
        log.info("mcp.subscribe", uri=sub.uri, action=sub.action, origin="self", applied=True, cluster=True)

    # --- durable daemon state (--state-dir) ---

    async def keep_runs(self, key: str, run_ids: Sequence[str]) -> None:
        """Retention keeps these finished runs, under ``key``, until this is called again for ``key`` (a
        ``--continue`` session's turns: each later turn refers to them). Nothing without ``--state-dir``."""
        await self._put(KEPT_RUNS, {key: list(run_ids)}, self.log)

    async def _put(self, namespace: str, changes: Mapping[str, Any], log: EventLog) -> bool:
        if self.state is None:
            return False
        try:
            await self.state.put_state(namespace, changes)
        except JournalError as exc:  # the daemon goes on; this change will not survive a restart
            log.warn("journal.write_failed", namespace=namespace, error=str(exc))
            return False
        return True

    async def _digest(self, uri: str) -> str | None:
        """The digest of ``uri``'s contents now (None when it cannot be read): what a restart compares."""
        if self.state is None or self.watcher is None:
            return None
        try:
            read = await self.watcher.pool.read_resource(uri, None)
        except Exception:  # not found, server down: compared as "unknown", so a restart wakes
            return None
        return content_digest(list(read.contents))

    async def _keep_subscription(self, uri: str, digest: str | None, log: EventLog, *, drop: bool = False) -> None:
        if drop:
            self._kept_uris.discard(uri)
            await self._put(SELF_SUBSCRIPTIONS, {uri: None}, log)
        elif await self._put(SELF_SUBSCRIPTIONS, {uri: {"digest": digest}}, log):
            self._kept_uris.add(uri)

    async def _keep_schedule(self, request: ScheduleRequest, log: EventLog) -> str | None:
        key = uuid.uuid4().hex
        saved = {"at": time.time() + request.after_seconds, "instruction": request.instruction}
        return key if await self._put(SELF_SCHEDULES, {key: saved}, log) else None

    async def seen(self, uri: str, contents: Any) -> None:
        """A wake read ``uri``: remember what it saw, so a restart wakes only for a change missed while down."""
        if uri in self._kept_uris:
            digest = content_digest(list(contents)) if contents is not None else None
            await self._put(SELF_SUBSCRIPTIONS, {uri: {"digest": digest}}, self.log)

    async def restore(self, notify: Callable[[str, str | None], None] | None) -> None:
        """Re-establish what an earlier process kept: the agent's subscriptions, read after subscribing (a
        change missed while down is a wake through ``notify``), its pending self-scheduled runs, and the wakes
        it left unfinished (each resumed from its last committed step under its own run id)."""
        if self.state is None:
            return
        assert self._nursery is not None, "DaemonRuns.serve must be started first"
        for job in self.unfinished:
            self._nursery.start_soon(self.run, job)
        self.unfinished = []
        try:
            subscriptions = await self.state.get_state(SELF_SUBSCRIPTIONS)
            schedules = await self.state.get_state(SELF_SCHEDULES)
        except JournalError as exc:
            self.log.warn("journal.write_failed", namespace=SELF_SUBSCRIPTIONS, error=str(exc))
            return
        for uri, saved in subscriptions.items():
            if self.watcher is None:
                break
            try:
                if not self.watcher.watching(uri, Origin.SELF):
                    await self.watcher.watch(uri, Origin.SELF)
            except Exception as exc:
                self.log.warn("mcp.subscribe", uri=uri, action="subscribe", origin="self", applied=False,
                              restored=True, error=type(exc).__name__, reason=str(exc))
                continue
            self._kept_uris.add(uri)
            digest = await self._digest(uri)
            changed = digest is None or digest != (saved or {}).get("digest")
            self.log.info("mcp.subscribe", uri=uri, action="subscribe", origin="self", applied=True, restored=True,
                          changed=changed)
            if changed and notify is not None:
                notify(uri, None)
        for key, saved in schedules.items():
            after = max(0.0, float(saved.get("at", 0)) - time.time())
            self.schedule(after, str(saved.get("instruction", "")), self.log, key=key)

    def schedule(self, after: float, instruction: str, log: EventLog, *, key: str | None = None) -> None:
        if self._nursery is None or not self.accepting or self._scheduled >= MAX_PENDING_SCHEDULED:
            log.warn("schedule.fire", after_s=after, applied=False,
                     reason="daemon not taking runs" if self._nursery is None or not self.accepting
                     else f"{MAX_PENDING_SCHEDULED} self-scheduled runs already pending")
            return
        self._scheduled += 1
        log.info("trigger.armed", trigger="scheduled", after_s=after)
        self._nursery.start_soon(self._fire_later, after, instruction, key)

    async def _fire_later(self, after: float, instruction: str, key: str | None = None) -> None:
        try:
            await trio.sleep(after)
        finally:
            self._scheduled -= 1
        if await self._admitted():
            if key is not None:  # fired at most once: forgotten before it runs (the run itself is journaled)
                await self._put(SELF_SCHEDULES, {key: None}, self.log)
            self.log.info("schedule.fire", trigger="scheduled", after_s=after, applied=True)
            await self.backoff_gate()
            await self.run(Job("scheduled", instruction))
