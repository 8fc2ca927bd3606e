"""One subagent: a child process driven over its control channel, inside one nursery.

The node's nursery holds the channel reader and the stderr drain (shielded, they live until the process
is reaped, so a result written during the kill ladder is still read) and a cancellable work scope with the
pinger. Whatever ends the work (a final result, a failure, a stuck verdict, :meth:`SubagentNode.cancel`,
or cancellation from outside: the caller's deadline, the parent run finishing), the node's ``finally``
walks the kill ladder shielded and bounded, then reaps. The outcome is one :class:`RunView`.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from subprocess import PIPE
from typing import Any

import attrs
import trio

from agentd.agent.result import RunUsage
from agentd.supervisor.authority import Authority
from agentd.supervisor.caps import Refusal, is_within
from agentd.supervisor.channel import ChannelBroken, ControlChannel
from agentd.supervisor.forkserver import ForkedProcess, ForkServer, ForkServerGone
from agentd.supervisor.idlepings import IdlePings
from agentd.supervisor.ladder import Graces, run_ladder
from agentd.supervisor.liveness import Liveness, LivenessSettings
from agentd.supervisor.messages import (
    Admit,
    Admitted,
    Ask,
    Cancel,
    Failed,
    Inject,
    Message,
    MetricsDelta,
    Ping,
    Pong,
    Progress,
    Ready,
    Release,
    Result,
    RunPayload,
    Spawn,
    Usage,
)
from agentd.telemetry.events import EventLog

TERMINAL = frozenset({"completed", "failed", "cancelled", "refused", "exhausted_steps", "exhausted_tokens",
                      "exhausted_budget",
                      "deadline", "stalled", "loop_detected"})
_STDERR_LINE_CAP = 8192

#: Environment variables a child inherits; everything else (tokens, keys, the operator's shell) stays out
#: of the child's environment listing. Secrets travel in the run payload instead.
_ENV_KEEP = frozenset({"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONPATH",
                       "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "VIRTUAL_ENV", "SYSTEMROOT"})


def child_environment(parent_env: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in parent_env.items() if k in _ENV_KEEP or k.startswith("LC_")}
    env["AGENT_SUBAGENT"] = "1"
    env["AGENTD_PARENT_PID"] = str(os.getpid())
    return env


@attrs.frozen
class RunView:
    """The one result shape for sync and async callers: ``{handle, status, done, partial, result}``.

    A warm session's view also carries ``turns``, how many turns it has answered: while it is
    ``awaiting_turn``, ``result`` is the latest turn's result and ``turns`` says which turn that was.
    """

    handle: str
    status: str
    done: bool
    partial: bool = False
    result: Any = None
    turns: int | None = None
    #: What the subagent and everything below it used so far (None: not known here, e.g. a journaled view).
    usage: RunUsage | None = None

    def structured(self) -> dict[str, Any]:
        body = {"handle": self.handle, "status": self.status, "done": self.done,
                "partial": self.partial, "result": self.result}
        if self.turns is not None:
            body["turns"] = self.turns
        if self.usage is not None:
            body["usage"] = self.usage.to_json()
        return body


@attrs.frozen
class NodeSettings:
    graces: Graces = attrs.field(factory=Graces)
    liveness: LivenessSettings = attrs.field(factory=LivenessSettings)
    python: str = sys.executable
    argv_tail: tuple[str, ...] = ("-m", "agentd")


class SessionBusy(Exception):
    """``send`` to a session that is not waiting for a message (still running, or ended)."""


@attrs.define(eq=False)
class SubagentNode:
    handle: str
    payload: RunPayload
    authority: Authority
    log: EventLog
    settings: NodeSettings = attrs.field(factory=NodeSettings)
    #: Fork children from this pre-imported server instead of re-executing (None: re-exec).
    fork_server: ForkServer | None = None
    #: The supervisor's timer for idle warm sessions (None: this node's pinger pings it while idle too).
    idle_pings: IdlePings | None = None
    #: The child's environment (None: :func:`child_environment` of ours, built at launch).
    env: Mapping[str, str] | None = None
    status: str = "starting"
    pid: int | None = None
    usage_tokens: int = 0
    #: The child subtree's usage (every ``usage`` frame: the child's own and its descendants', each once).
    usage: RunUsage = attrs.field(factory=RunUsage)
    #: The caller's run tree when the caller was the agent's own run (its result counts this subtree), else None.
    tree: str | None = None
    #: Turns answered (a result frame each); a warm session's views carry it.
    turns: int = 0
    #: Why the child process could not be started (out of descriptors, processes...); None once it was.
    start_error: str | None = None
    ended: trio.Event = attrs.field(factory=trio.Event)
    #: Set when the child said ``ready`` (never set if it ended before that).
    ready: trio.Event = attrs.field(factory=trio.Event)
    #: Called after every observable change (pid, ready, status, usage, the end): the supervisor's
    #: ``wait_until`` is woken by it instead of polling.
    on_change: Callable[[], None] = lambda: None
    _view: RunView | None = attrs.field(default=None, init=False)
    _turn_done: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: Set (and replaced) whenever a turn answers or the run ends: what :meth:`wait_turns` waits on.
    _turn_answered: trio.Event = attrs.field(factory=trio.Event, init=False)
    _stop: trio.Event = attrs.field(factory=trio.Event, init=False)
    _io_done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _channel: ControlChannel | None = attrs.field(default=None, init=False)
    _cancel_reason: str | None = attrs.field(default=None, init=False)
    _failure: str | None = attrs.field(default=None, init=False)
    _last: Result | None = attrs.field(default=None, init=False)
    _final: bool = attrs.field(default=False, init=False)
    _eof: bool = attrs.field(default=False, init=False)
    _turn_running: bool = attrs.field(default=True, init=False)
    _liveness: Liveness | None = attrs.field(default=None, init=False)
    #: Set when a warm session's next turn starts: wakes an idle pinger to ping at the working pace.
    _turn_begun: trio.Event = attrs.field(factory=trio.Event, init=False)
    _ping_seq: int = attrs.field(default=0, init=False)
    #: This idle period's ticket with :attr:`idle_pings`; bumped when the period ends, which drops the entry.
    _idle_ticket: int = attrs.field(default=0, init=False)

    # -- what callers see -------------------------------------------------------------------------

    def view(self) -> RunView:
        if self._view is not None:
            return self._view
        last = self._last if not self._turn_running else None
        # "starting" (spawned, not yet ready) is an internal distinction: callers see it running.
        status = "running" if self.status == "starting" else self.status
        return RunView(self.handle, status, False, last is not None and last.partial,
                       last.result if last is not None else None, self._turns_seen(), self.usage)

    def _turns_seen(self) -> int | None:
        return self.turns if self.warm else None

    @property
    def warm(self) -> bool:
        return self.payload.warm

    def cancel(self, reason: str = "cancelled") -> None:
        """Start ending the subagent; the ladder runs in :meth:`run`'s ``finally``."""
        if self._cancel_reason is None and not self.ended.is_set():
            self._cancel_reason = reason
            self.log.info("subagent.cancel", handle=self.handle, reason=reason)
        if self._scope is not None:
            self._scope.cancel()

    async def wait_turn(self) -> RunView:
        """Wait for the current turn (or the whole run) to finish."""
        await self._turn_done.wait()
        if self._final or self._stop.is_set():
            await self.ended.wait()
        return self.view()

    async def wait_turns(self, after: int) -> RunView:
        """Wait until more than ``after`` turns have answered, or the run has ended."""
        while self.turns <= after and not self.ended.is_set():
            await self._turn_answered.wait()
        return self.view()

    def _answered(self) -> None:
        self._turn_answered.set()
        self._turn_answered = trio.Event()

    async def send(self, message: str) -> None:
        """Deliver the next message to a warm session waiting for one."""
        if not self.warm or self.status != "awaiting_turn" or self._channel is None:
            raise SessionBusy(f"handle {self.handle} is {self.status}, not awaiting a message")
        self.status = "running"
        self._turn_running = True
        self._turn_done = trio.Event()
        self.on_change()
        if self._liveness is not None:
            self._liveness.turn_started(trio.current_time())
        self._turn_begun.set()
        await self._channel.send(Inject(message=message))

    # -- the run ----------------------------------------------------------------------------------

    async def _launch(self) -> trio.Process | ForkedProcess:
        env = child_environment(os.environ) if self.env is None else self.env
        if self.fork_server is not None:
            try:
                return await self.fork_server.launch(env)
            except ForkServerGone as exc:
                self.log.warn("subagent.failed", handle=self.handle, reason=f"fork server: {exc}; re-exec instead")
        argv = [self.settings.python, *self.settings.argv_tail]
        return await trio.lowlevel.open_process(
            argv, stdin=PIPE, stdout=PIPE, stderr=PIPE, start_new_session=True, env=env,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            proc = await self._launch()
        except OSError as exc:
            self._failure = f"could not start the subagent process: {exc.strerror or type(exc).__name__}"
            self.start_error = self._failure
            with trio.CancelScope(shield=True):
                await self._settle(None, "never started")
            task_status.started()
            return
        self.pid = proc.pid
        self.on_change()
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        channel = self._channel = ControlChannel(proc.stdin, proc.stdout)
        self._liveness = Liveness.starting_at(self.settings.liveness, trio.current_time())
        self.log.info("subagent.spawn", handle=self.handle, child_pid=proc.pid, depth=self.payload.depth,
                      warm=self.payload.warm, tool_scope=self.payload.tool_scope,
                      forked=isinstance(proc, ForkedProcess))
        task_status.started()
        rung = "exited"
        try:
            async with trio.open_nursery() as nursery:
                io_scope = trio.CancelScope(shield=True)
                nursery.start_soon(self._io, io_scope, channel, proc.stderr, nursery)
                try:
                    with trio.CancelScope() as self._scope:
                        if self._cancel_reason is not None:
                            self._scope.cancel()
                        await channel.send(Spawn(self.payload))
                        async with trio.open_nursery() as work:
                            work.start_soon(self._pinger, channel)
                            await self._stop.wait()
                            work.cancel_scope.cancel()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the child died before reading; the reader reports why
                finally:
                    with trio.CancelScope(shield=True):
                        try:
                            rung = await self._end(proc, channel)
                            with trio.move_on_after(1.0):
                                await self._io_done.wait()
                        finally:  # else the shielded reader outlives a failed ladder and this never returns
                            io_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await _close_pipes(proc)
                self._channel = None
                await self._settle(proc.returncode, rung)

    async def _end(self, proc: trio.Process | ForkedProcess, channel: ControlChannel) -> str:
        send_cancel = None
        if not self._final and not self._eof:
            # Still working: this ending is a cancellation (explicit, a deadline, or the parent ending),
            # unless it was already classed as a failure (stuck, garbage on the channel).
            if self._failure is None and self._cancel_reason is None:
                self._cancel_reason = "parent ended"
                self.log.info("subagent.cancel", handle=self.handle, reason=self._cancel_reason)
            reason = self._cancel_reason or "failed"
            send_cancel = functools.partial(channel.send, Cancel(reason=reason))

        def note(rung: str) -> None:
            if rung in ("sigterm", "sigkill"):
                self.log.warn(f"subagent.{rung}", handle=self.handle, child_pid=proc.pid)

        return await run_ladder(
            proc, graces=self.settings.graces, send_cancel=send_cancel, close_stdin=channel.close_send,
            on_rung=note,
        )

    async def _settle(self, returncode: int | None, rung: str) -> None:
        last = self._last
        if self._final and last is not None:
            view = RunView(self.handle, last.status, True, last.partial, last.result, self._turns_seen(), self.usage)
        elif self._cancel_reason is not None and self._failure is None:
            partial_result = last.result if last is not None else None
            partial = self._turn_running or (last is not None and last.partial)
            view = RunView(self.handle, "cancelled", True, partial, partial_result, self._turns_seen(), self.usage)
        else:
            reason = self._failure or _early_exit_reason(returncode)
            view = RunView(self.handle, "failed", True, last is not None, {"error": reason}, usage=self.usage)
            self.log.warn("subagent.failed", handle=self.handle, reason=reason)
        self.status = view.status
        self._view = view
        self.log.info("subagent.exit", handle=self.handle, status=view.status, rung=rung,
                      returncode=returncode, usage_tokens=self.usage_tokens)
        with trio.move_on_after(1.0):
            await self.authority.release(self.handle)
        self._turn_done.set()
        self.ended.set()
        self._answered()
        self.on_change()

    # -- tasks inside the node ---------------------------------------------------------------------

    async def _io(self, scope: trio.CancelScope, channel: ControlChannel, stderr: trio.abc.ReceiveStream,
                  nursery: trio.Nursery) -> None:
        with scope:
            async with trio.open_nursery() as io:
                io.start_soon(self._read, channel, nursery)
                io.start_soon(self._drain_stderr, stderr)
        self._io_done.set()

    async def _read(self, channel: ControlChannel, nursery: trio.Nursery) -> None:
        try:
            while (message := await channel.receive()) is not None:
                await self._on_message(message, channel, nursery)
            self._eof = True
        except ChannelBroken as exc:
            self._fail(f"broke the control channel: {exc.reason}")
        finally:
            self._stop.set()
            self._turn_done.set()

    def _fail(self, reason: str) -> None:
        if self._failure is None and not self._final:
            self._failure = reason

    async def _on_message(self, message: Message, channel: ControlChannel, nursery: trio.Nursery) -> None:
        now = trio.current_time()
        live = self._liveness
        assert live is not None
        if isinstance(message, Pong):
            live.pong(now)
            return
        if isinstance(message, MetricsDelta):  # rides along with pongs: not progress
            await self.authority.report_metrics(message)
            return
        live.progress(now)
        if isinstance(message, Ready):
            if self.status == "starting":
                self.status = "running"
            self.ready.set()
            self.on_change()
            self.log.info("subagent.ready", handle=self.handle, child_pid=message.pid)
        elif isinstance(message, Usage):
            self.usage_tokens += message.total
            prompt, completion = max(0, message.prompt_tokens), max(0, message.completion_tokens)
            self.usage = self.usage.add(prompt, completion, min(max(0, message.estimated_tokens), prompt + completion),
                                        None if message.cost is None else max(0, message.cost))
            self.on_change()
            await self.authority.report_usage(self.handle, message)
        elif isinstance(message, Result):
            self._last = message
            self._turn_running = False
            self.turns += 1
            self.log.info("subagent.result", handle=self.handle, status=message.status, partial=message.partial)
            if self.warm and self._cancel_reason is None and message.status == "completed":
                self.status = "awaiting_turn"
                live.turn_finished(now)
                self.on_change()
            else:
                self._final = self._cancel_reason is None and self._failure is None
                self._stop.set()
            self._turn_done.set()
            self._answered()
        elif isinstance(message, Failed):
            self._fail(f"subagent failed: {message.reason}")
            self._stop.set()
        elif isinstance(message, Admit):
            nursery.start_soon(self._admit, message, channel)
        elif isinstance(message, Release):
            if is_within(message.handle, self.handle) and message.handle != self.handle:
                await self.authority.release(message.handle)
        elif isinstance(message, Progress):
            pass
        elif isinstance(message, Ask):
            nursery.start_soon(self._ask, message, channel)
        else:
            raise ChannelBroken(f"unexpected {message.METHOD!r} frame from a child")

    async def _ask(self, request: Ask, channel: ControlChannel) -> None:
        """A question for a person from this child's subtree: asked here (or further up), answered down."""
        from agentd.supervisor.asks import answer_ask

        answer = await answer_ask(request, self.handle)
        try:
            await channel.send(answer)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _admit(self, request: Admit, channel: ControlChannel) -> None:
        # A child may only spawn under its own handle: the caller it claims is checked, not trusted.
        if not is_within(request.caller, self.handle):
            decision: Any = Refusal(f"spawn refused: handle {request.caller} is outside {self.handle}")
        else:
            decision = await self.authority.admit(request.caller, request.tool_scope, budget=request.budget,
                                                  handle=request.handle)
        if isinstance(decision, Refusal):
            answer = Admitted(ref=request.ref, refusal=decision.message, retryable=decision.retryable)
        else:
            answer = Admitted(ref=request.ref, handle=decision.handle, depth=decision.depth,
                              scope=sorted(decision.scope))
        try:
            await channel.send(answer)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            if not isinstance(decision, Refusal):
                await self.authority.release(decision.handle)

    async def _pinger(self, channel: ControlChannel) -> None:
        live = self._liveness
        assert live is not None
        interval = live.settings.ping_interval
        while True:
            if live.working:
                await trio.sleep(interval)
            else:  # an idle warm session: ping seldom, and at the working pace again once a turn starts
                begun = self._turn_begun
                if self.idle_pings is not None:  # the supervisor's timer pings it (and judges it) meanwhile
                    self.idle_pings.add(self, self._idle_ticket, live.settings.idle_ping_interval)
                    try:
                        await begun.wait()
                    finally:
                        self._idle_ticket += 1
                else:
                    with trio.move_on_after(live.settings.idle_ping_interval):
                        await begun.wait()
                if begun.is_set():
                    self._turn_begun = trio.Event()
                    continue
            if not self._judge(live, trio.current_time()):
                return
            self._ping_seq += 1
            live.ping_sent(trio.current_time())
            if not await self._send_ping(channel, Ping(seq=self._ping_seq), interval):
                return

    def _judge(self, live: Liveness, now: float) -> bool:
        """False (and the node stopping) when the verdict says the child is stuck."""
        verdict = live.verdict(now)
        if verdict is None:
            return True
        self.log.warn("subagent.stuck", handle=self.handle, reason=verdict)
        self._fail(verdict)
        self._stop.set()
        return False

    async def _send_ping(self, channel: ControlChannel, ping: Ping, bound: float) -> bool:
        """Send a ping, giving up after ``bound`` s (its pong is then missing); False if the pipe is gone."""
        with trio.move_on_after(bound):
            try:
                await channel.send(ping)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return False
        return True

    def idle_round(self, now: float, ticket: int) -> bool:
        """One round of :attr:`idle_pings` for this idle session: judge it, then ping it.

        False when it leaves the timer: its idle period is over (the ticket is stale), it is stuck, or
        its pipe is gone.
        """
        live, channel = self._liveness, self._channel
        if ticket != self._idle_ticket or live is None or channel is None or live.working or self._stop.is_set():
            return False
        if not self._judge(live, now):
            return False
        self._ping_seq += 1
        live.ping_sent(now)
        ping = Ping(seq=self._ping_seq)
        try:
            if channel.send_nowait(ping):
                return True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False  # the reader sees the end
        assert self.idle_pings is not None
        self.idle_pings.nursery.start_soon(self._send_ping, channel, ping, live.settings.ping_interval)
        return True

    async def _drain_stderr(self, stream: trio.abc.ReceiveStream) -> None:
        pending = b""
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._stderr_line(line)
            if len(pending) > _STDERR_LINE_CAP:
                self._stderr_line(pending)
                pending = b""
        if pending:
            self._stderr_line(pending)

    def _stderr_line(self, raw: bytes) -> None:
        line = raw[:_STDERR_LINE_CAP].decode("utf-8", "replace").rstrip("\r")
        if line:
            self.log.info("subagent.stderr", handle=self.handle, line=line)


async def _close_pipes(proc: trio.Process | ForkedProcess) -> None:
    """Close our ends of the child's stdin/stdout/stderr once it is reaped: an ended node may be kept
    (its view stays readable), its pipes must not be."""
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            try:
                await stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass


def _early_exit_reason(returncode: int | None) -> str:
    if returncode is None:
        return "the subagent could not be reaped"
    if returncode < 0:
        return f"the subagent crashed (killed by signal {-returncode}) before reporting a result"
    return f"the subagent exited (status {returncode}) before reporting a result"
