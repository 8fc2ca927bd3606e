"""One child session: what a subagent process runs (re-exec'd or forked), from its payload to its exit.

The child reads its run payload (configuration and secrets included) as the first frame on stdin, says
``ready``, runs turns and reports ``usage``/``progress``/``result`` on stdout. A control reader task
answers pings and handles ``cancel``/``inject``/``admitted`` independently of the turn, so a slow model
call never looks like a dead child. Its own subagents are supervised by a nested :class:`Supervisor`
whose authority is the root, reached through this same channel.

Orphan safety: the child refuses to start if the parent that started it is already gone, and then
watches it (a pidfd): when the parent dies, the child cancels its own subtree and exits. Its stdin also
reaches EOF then, which ends the session the same way. Forked children also have ``PR_SET_PDEATHSIG``. Its fd 1 is
pointed at stderr once the channel has its own copy, so a stray ``print`` cannot corrupt a frame.

Imports are kept to what a child uses: no httpx and no HTTP server on this path unless the turn runner needs them.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import attrs
import trio

from agentd.child.context import ChildContext, TurnRunner
from agentd.child.parent import die_with_parent, libc, wait_parent_gone
from agentd.oversight.approvals import Approvals, use_approvals
from agentd.supervisor.asks import RemoteAsker
from agentd.supervisor.authority import RemoteAuthority
from agentd.supervisor.channel import ControlChannel
from agentd.supervisor.forkserver import FORKS_ENV
from agentd.supervisor.messages import (
    Admitted,
    Answered,
    Cancel,
    Failed,
    Inject,
    MetricsDelta,
    Ping,
    Pong,
    Ready,
    Result,
    RunPayload,
    Spawn,
)
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog, stream_sink

_PAYLOAD_WAIT = 30.0


def session_main() -> int:
    """A child session on this process's stdin/stdout (a re-exec'd or forked child); returns the exit status."""
    die_with_parent()
    in_fd = os.dup(0)
    out_fd = os.dup(1)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    forks = os.environ.pop(FORKS_ENV, "")
    return trio.run(_child, in_fd, out_fd, int(forks) if forks.isdigit() else None)


async def _child(in_fd: int, out_fd: int, forks: int | None, runner: TurnRunner | None = None) -> int:
    """The session on ``in_fd``/``out_fd`` (closed when it returns); ``runner`` overrides the payload's choice
    (the fork server's rehearsal)."""
    out_stream, in_stream = trio.lowlevel.FdStream(out_fd), trio.lowlevel.FdStream(in_fd)
    try:
        return await _session(ControlChannel(out_stream, in_stream), forks, runner)
    finally:
        out_stream.close()
        in_stream.close()


async def _session(channel: ControlChannel, forks: int | None, runner: TurnRunner | None) -> int:
    with trio.move_on_after(_PAYLOAD_WAIT):
        first = await channel.receive()
    if not isinstance(first, Spawn):
        return 2
    payload = first.payload
    test = payload.test or {}
    if test.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    metrics.disable()  # a forked child starts with nothing of its parent's
    if payload.telemetry.get("metrics"):  # the root counts the tree: hand it our observations
        metrics.collect_deltas()
    await channel.send(Ready(pid=os.getpid()))
    session = _Session(payload, channel, runner or _pick_runner(payload), forks)
    return await session.run()


def _pick_runner(payload: RunPayload) -> TurnRunner:
    if payload.test is not None:
        from agentd.child.scripted import scripted_turn

        return scripted_turn
    from agentd.child.turn import loop_turn

    return loop_turn


@attrs.define(eq=False)
class _Session:
    payload: RunPayload
    channel: ControlChannel
    runner: TurnRunner
    #: This forked child's connection to the tree's fork server (None: a re-exec, whose children re-exec).
    forks: int | None = None
    _inbox: tuple[trio.MemorySendChannel[str], trio.MemoryReceiveChannel[str]] = attrs.field(
        factory=lambda: trio.open_memory_channel[str](64)
    )
    _turn_scope: trio.CancelScope | None = None
    _cancelled: str | None = None
    _session_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _authority: RemoteAuthority | None = None
    _asker: RemoteAsker | None = None
    _ctx: ChildContext | None = None

    async def run(self) -> int:
        from agentd.supervisor.supervisor import SupervisorSettings, open_supervisor

        self._authority = RemoteAuthority(self.channel)
        self._asker = RemoteAsker(self.channel)
        settings = SupervisorSettings.from_payload(self.payload.supervision)
        # a question for a person (an approval, an elicitation) goes up to the root's queue (agentd.supervisor.asks)
        with use_approvals(Approvals(forward=self._asker.forward)):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._control)
                nursery.start_soon(self._watch_parent)
                if not (self.payload.test or {}).get("ignore_sigterm"):
                    nursery.start_soon(self._on_sigterm)
                journal = self.payload.journal or {}  # where this child's own children journal: where it does
                with self._session_scope:
                    async with open_supervisor(
                        settings=settings, authority=self._authority, handle=self.payload.handle,
                        log=_supervisor_log(self.payload),
                        telemetry=self.payload.telemetry, child_config=self.payload.config,
                        secrets=self.payload.secrets,
                        test_script=_nested_script if self.payload.test is not None else None,
                        fork_server=self.forks is not None, fork_connection=self.forks,
                        journal_dir=str(journal["state_dir"]) if isinstance(journal.get("state_dir"), str) else None,
                        journal_at={"cluster": journal["cluster"]} if isinstance(journal.get("cluster"), dict) else None,
                    ) as sup:
                        ctx = self._ctx = ChildContext(self.payload, self.channel, sup,
                                                       history=list(self.payload.history), cancelled=self._cancelled)
                        await self._turns(ctx)
                    # Leaving the block cancels our own children down their ladders before we exit:
                    # the tree ends deepest first.
                nursery.cancel_scope.cancel()
            return 0

    async def _turns(self, ctx: ChildContext) -> None:
        message = self.payload.instruction
        while True:
            result = await self._turn(ctx, message)
            await self._send_metrics()
            if result is None:
                return
            try:
                # Through the stream's checkpoint (not a plain write): the session's own tasks (SIGTERM
                # handler, parent watch) have all started before the parent sees the first result.
                await self.channel.send(result)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not self.payload.warm or self._cancelled is not None or result.status != "completed":
                return
            give_back_freed_memory()  # idle until the next message: hand the turn's freed pages back
            try:
                message = await self._inbox[1].receive()
            except trio.EndOfChannel:
                return

    async def _turn(self, ctx: ChildContext, message: str) -> Result | None:
        """Run one turn; None when it failed (already reported as a ``failed`` frame)."""
        with trio.CancelScope() as self._turn_scope:
            if self._cancelled is not None:
                self._turn_scope.cancel()
            try:
                return await self.runner(ctx, message)
            except Exception as exc:  # a failed turn is reported; the child still exits cleanly
                reason = f"{type(exc).__name__}: {exc}"
                for secret in self.payload.secrets.values():
                    if len(secret) >= 4:
                        reason = reason.replace(secret, "***")
                await _report_failure(self.channel, reason)
                return None
        return Result(status="cancelled", partial=True, result={"cancelled": self._cancelled})

    async def _control(self) -> None:
        test = self.payload.test or {}
        try:
            while (message := await self.channel.receive()) is not None:
                if isinstance(message, Ping):
                    if not test.get("no_pong"):
                        pong = Pong(seq=message.seq)
                        if not self.channel.send_nowait(pong):  # a plain write when it cannot block
                            await self.channel.send(pong)
                        await self._send_metrics()
                elif isinstance(message, Cancel):
                    if not test.get("ignore_cancel"):
                        self._cancel(message.reason)
                elif isinstance(message, Inject):
                    self._inbox[0].send_nowait(message.message)
                elif isinstance(message, Admitted):
                    assert self._authority is not None
                    self._authority.deliver(message)
                elif isinstance(message, Answered):
                    assert self._asker is not None
                    self._asker.deliver(message)
        except Exception:
            pass
        # The parent closed our stdin (a kill-ladder rung) or is gone: end the session.
        if not test.get("ignore_eof"):
            self._cancel("the parent closed the channel")

    async def _send_metrics(self) -> None:
        """What this process's runs did since the last frame, up to the root (with pongs and results)."""
        deltas = metrics.deltas()
        while deltas is not None and deltas.pending:
            frame = MetricsDelta(depth=self.payload.depth, observations=deltas.take())
            try:
                await self.channel.send(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    def _cancel(self, reason: str) -> None:
        self._cancelled = reason
        if self._ctx is not None and self._ctx.cancelled is None:
            self._ctx.cancelled = reason
        self._inbox[0].close()
        if self._turn_scope is not None:
            self._turn_scope.cancel()

    async def _watch_parent(self) -> None:
        await wait_parent_gone()
        # Orphaned (the parent was killed): end our own subtree down its ladder, then exit.
        self._cancel("the parent is gone")
        self._session_scope.cancel()

    async def _on_sigterm(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                # The parent is past the polite rungs: end our own subtree now, then exit.
                self._cancel("terminated")
                self._session_scope.cancel()
                return


def give_back_freed_memory() -> None:
    """Return the pages a finished turn freed to the kernel (glibc ``malloc_trim``; elsewhere a no-op).

    A turn's large buffers (request and response bodies, the model's context) come from malloc and stay
    resident after they are freed; an idle warm session would otherwise keep them (about 1.8 MiB per child
    after one turn). Costs well under a millisecond.
    """
    try:
        libc().malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _nested_script(request: Any, handle: str) -> dict[str, Any]:
    """In test mode only, a child's own children are scripted too: the instruction is their script."""
    import json

    try:
        script = json.loads(request.instruction)
    except ValueError:
        script = None
    return script if isinstance(script, dict) else {"steps": [["echo"]]}


async def _report_failure(channel: ControlChannel, reason: str) -> None:
    with trio.move_on_after(1.0):
        try:
            await channel.send(Failed(reason=reason[:2000]))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _supervisor_log(payload: RunPayload) -> EventLog:
    """The nested supervisor's log: JSON lines on this child's stderr, which its parent relays upward, so a
    grandchild's lines (relayed here as ``subagent.stderr``) reach the root too."""
    telemetry = payload.telemetry
    log = EventLog(sink=stream_sink(sys.stderr), level=str(telemetry.get("log_level", "info")),
                   log_content=bool(telemetry.get("log_content", False)), run_id=str(telemetry.get("run_id", "")),
                   agent_path=payload.handle, comp="supervisor")
    for value in payload.secrets.values():
        log.redactor.add(value)
    return log
