"""What each ``agentd ctl`` command does inside the daemon: :class:`Controls` answers one request.

The socket (agentd.ctl.server) hands every request here; the answer is the document ``agentd ctl`` prints.
An answer with ``error`` is a refusal (exit 1); nothing here raises for bad input.

- ``status``: mode, pause / lame duck / drain, the runs in flight, the supervisor's statistics and free
  capacity, the mode's own snapshot (what ``agent://status`` shows) and the config's reload count; with
  ``--cluster`` a ``cluster`` section: this member's slots and the capacity signal its heartbeat last read
  (agentd.cluster.capacity).
- ``pause`` / ``resume``: the operator switch (agentd.oversight.operator); with ``--state-dir`` the paused state is
  saved, so a restarted daemon starts paused.
- ``lame-duck`` (``{"on": false}`` ends it).
- ``cancel``: a run by its run id (the daemon's once run or a wake), else a subagent or served run by its
  handle (``0.3``, ``served.2``).
- ``approvals``: what waits for a person (agentd.oversight.approvals): tool calls marked ``approve``, servers' questions
  (elicitation). ``approve ID`` sends the call (once); ``deny ID [REASON]`` never sends it and the model is told
  why; ``answer ID CONTENT`` answers a question with the form's values, checked against its schema (``decline``
  or ``cancel`` instead of the content: the MCP actions). docs/approvals.md.
- ``reload``: re-read the config (agentd.ctl.reload decides what may change), the same as SIGHUP. What
  reopens connections (MCP servers, intelligence endpoints) is staged first; one stage failing (a required
  server unreachable) discards them all and the running config is kept (outcome ``failed``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from agentd import defaults
from agentd.config.model import Config
from agentd.ctl.reload import plan_reload
from agentd.errors import AgentdError
from agentd.journal.errors import JournalError
from agentd.oversight.drain import current_drain
from agentd.oversight.operator import Operator, Staged
from agentd.supervisor.caps import Refusal
from agentd.supervisor.supervisor import Caller, Origin, Supervisor
from agentd.telemetry.events import EventLog
from agentd.telemetry.health import current_health

if TYPE_CHECKING:
    from agentd.journal.store import JournalStore
    from agentd.oversight.approvals import Approvals

#: The daemon-state namespace (``--state-dir``) of the operator's switches that survive a restart.
OPERATOR_STATE: Final = "operator"
#: How long ``cancel`` waits for a subagent to end (its kill ladder is bounded well below this).
CANCEL_WAIT: Final = 30.0

#: Re-reads the configuration the daemon was started with (the CLI's argv, file and environment).
Loader = Callable[[], Config]
#: Applies a reloaded config to one running part: ``(old, new)``.
Applier = Callable[[Config, Config], Awaitable[None]]


@attrs.define(eq=False)
class Controls:
    operator: Operator
    cfg: Config
    supervisor: Supervisor
    log: EventLog
    journal: JournalStore | None = None
    loader: Loader | None = None
    #: The running mode's snapshot (``agent://status``), when it publishes one.
    snapshot: Callable[[], Mapping[str, Any] | None] = lambda: None
    #: ``--cluster``: the member's slots and last capacity read (None: not a cluster member).
    cluster: Callable[[], Mapping[str, Any] | None] = lambda: None
    #: The queue of what waits for a person (None: this daemon has none, so nothing waits).
    approvals: Approvals | None = None
    reloads: int = 0
    _reload_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    async def handle(self, request: Mapping[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "status":
            return self.status()
        if op in ("pause", "resume"):
            return await self.pause(op == "pause")
        if op == "lame-duck":
            on = request.get("on", True)
            if not isinstance(on, bool):
                return {"error": '"on" must be true or false'}
            self.operator.set_lame_duck(on)
            self.log.warn("ctl.lame_duck", on=on, running=len(self.operator.runs()))
            return {"lame_duck": on, "ready": self._ready()}
        if op == "cancel":
            target = request.get("run")
            if not isinstance(target, str) or not target:
                return {"error": '"run" must name a run id or a subagent handle'}
            return await self.cancel(target, str(request.get("reason") or "cancelled by the operator")[:200])
        if op == "reload":
            return await self.reload(trigger="ctl")
        if op == "approvals":
            return {"approvals": [item.to_json() for item in self.approvals.pending()] if self.approvals else []}
        if op in ("approve", "deny", "answer"):
            return self.decide(op, request)
        return {"error": f"unknown command {str(op)[:64]!r} (status, pause, resume, lame-duck, cancel, reload, "
                         "approvals, approve, deny, answer)"}

    # -- the commands ----------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        stats = self.supervisor.statistics()
        caps = self.supervisor.settings.caps
        live = len(stats.tree_live) if stats.tree_live is not None else len(stats.live)
        return {
            "mode": self.cfg.mode,
            "run_id": self.log.run_id,
            "pid": os.getpid(),
            "paused": self.operator.paused,
            "lame_duck": self.operator.lame_duck,
            "draining": current_drain().requested,
            "ready": self._ready(),
            "runs": [entry.to_json() for entry in self.operator.runs()],
            "held": self.operator.held,
            "approvals": len(self.approvals.pending()) if self.approvals is not None else 0,
            "supervisor": {"draining": stats.draining, "live": live, "counts": stats.counts,
                           "tokens_used": stats.tokens_used, "fork_server_pid": stats.fork_server_pid},
            "capacity": {"max_subagents": caps.max_subagents, "live_subagents": live,
                         "free_subagents": max(0, caps.max_subagents - live),
                         "accepting": not (stats.draining or self.operator.lame_duck)},
            "daemon": self.snapshot(),
            "cluster": self.cluster(),
            "config": {"path": self.cfg.config_path, "reloads": self.reloads},
        }

    async def pause(self, paused: bool) -> dict[str, Any]:
        affected = self.operator.set_paused(paused)
        self.log.warn("ctl.pause" if paused else "ctl.resume", affected=affected)
        saved = await self._save({"paused": paused or None})
        return {"paused": paused, "affected": affected, "saved": saved}

    async def cancel(self, target: str, reason: str) -> dict[str, Any]:
        if self.operator.cancel(target, reason):
            self.log.warn("ctl.cancel", run=target, kind="run", reason=reason)
            return {"cancelled": target, "kind": "run"}
        origin = Origin.MANAGEMENT if target.startswith("served.") else Origin.STDIO
        with trio.move_on_after(CANCEL_WAIT):
            view = await self.supervisor.cancel(Caller(origin, self.supervisor.handle), target, reason)
            if isinstance(view, Refusal):
                return {"error": f"no run or subagent {target[:200]!r} is running here"}
            self.log.warn("ctl.cancel", run=target, kind="subagent", reason=reason)
            return {"cancelled": target, "kind": "subagent", "status": view.status}
        return {"cancelled": target, "kind": "subagent", "status": "cancelling"}

    def decide(self, op: str, request: Mapping[str, Any]) -> dict[str, Any]:
        """``approve`` / ``deny`` an approval, ``answer`` an elicitation (see the module docstring)."""
        from agentd.oversight.approvals import MAX_REASON, Decision

        item_id = request.get("id")
        if not isinstance(item_id, str) or not item_id:
            return {"error": '"id" must name a pending approval (agentd ctl approvals lists them)'}
        item = self.approvals.get(item_id) if self.approvals is not None else None
        if item is None:
            return {"error": f"nothing waits under id {item_id[:64]!r} (decided already, or its run ended; "
                             "agentd ctl approvals lists what waits)"}
        if op == "answer":
            if item.kind != "elicitation":
                return {"error": f"{item_id} is a tool call to approve: use agentd ctl approve or deny"}
            decision = _answer(request.get("content"), item.schema or {})
            if isinstance(decision, str):
                return {"error": decision}
        else:
            if item.kind != "approval":
                return {"error": f"{item_id} is a question (elicitation): use agentd ctl answer ID JSON"}
            reason = request.get("reason")
            decision = Decision("approve") if op == "approve" else Decision(
                "deny", str(reason)[:MAX_REASON] if reason else "denied by the operator")
        assert self.approvals is not None
        self.approvals.decide(item_id, decision)
        self.log.warn("ctl.decide", id=item_id, kind=item.kind, action=decision.action, run=item.run_id)
        return {"id": item_id, "kind": item.kind, "action": decision.action, "run_id": item.run_id}

    async def reload(self, *, trigger: str) -> dict[str, Any]:
        """Re-read the config; apply it whole or not at all (see agentd.ctl.reload)."""
        async with self._reload_lock:
            if self.loader is None:
                return self._reload_failed(trigger, "invalid", "this daemon was not started from the command "
                                                               "line: there is no config to re-read")
            loader = self.loader
            try:
                # off the event loop and bounded: the file is the operator's, but a FIFO or a huge file must not
                # stop the daemon (agentd.config.yaml_file bounds the read and the parse; this bounds the wait)
                with trio.fail_after(defaults.RELOAD_READ_TIMEOUT):
                    reread = await trio.to_thread.run_sync(loader, abandon_on_cancel=True)
            except trio.TooSlowError:
                return self._reload_failed(trigger, "invalid", "reading the config took longer than "
                                                               f"{defaults.RELOAD_READ_TIMEOUT:g} s")
            except AgentdError as exc:  # validation (the Rule of Two included): nothing changes
                return self._reload_failed(trigger, "invalid", str(exc))
            except OSError as exc:
                return self._reload_failed(trigger, "invalid", f"cannot read the config ({exc.strerror})")
            plan = plan_reload(self.cfg, reread)
            if not plan.allowed:
                return self._reload_failed(
                    trigger, "refused", f"only a restart can change {', '.join(plan.refused)}",
                    refused=list(plan.refused))
            old = self.cfg
            staged: list[Staged] = []
            try:  # what a reload reopens (MCP servers, intelligence endpoints), beside what runs
                for stage in list(self.operator.stagers):
                    if (opened := await stage(old, reread)) is not None:
                        staged.append(opened)
            except AgentdError as exc:  # a required server unreachable, say: the running config is kept
                for opened in staged:
                    opened.discard()
                return self._reload_failed(trigger, "failed", str(exc))
            except BaseException:
                for opened in staged:
                    opened.discard()
                raise
            for opened in staged:
                await opened.commit()
            for apply in list(self.operator.appliers):
                await apply(old, reread)
            self.cfg = reread
            self.reloads += 1
            summary = {k: v for opened in staged for k, v in opened.summary().items()}
            self.log.warn("ctl.reload", outcome="applied", trigger=trigger, changed=list(plan.changed),
                          reloads=self.reloads, **summary)
            return {"reloaded": True, "changed": list(plan.changed), "reloads": self.reloads,
                    "ts": round(time.time(), 3), **summary}

    # -- helpers ---------------------------------------------------------------------------------------

    def _reload_failed(self, trigger: str, outcome: str, error: str, **fields: Any) -> dict[str, Any]:
        self.log.error("ctl.reload", outcome=outcome, trigger=trigger, error=error, **fields)
        return {"reloaded": False, "outcome": outcome, "error": error, **fields}

    def _ready(self) -> bool:
        health = current_health()
        return health.ready() if health is not None else not (current_drain().requested or self.operator.lame_duck)

    async def _save(self, changes: Mapping[str, Any]) -> bool:
        if self.journal is None:
            return False
        try:
            await self.journal.put_state(OPERATOR_STATE, changes)
        except JournalError as exc:
            self.log.warn("journal.write_failed", namespace=OPERATOR_STATE, error=str(exc))
            return False
        return True


def _answer(content: Any, schema: Mapping[str, Any]) -> Any:
    """An elicitation's :class:`~agentd.oversight.approvals.Decision` from ``answer``'s content (the form's values, checked
    against the requested schema; ``"decline"``/``"cancel"`` for those actions), or why it cannot be one."""
    from agentd.mcp.schemas import CheckTooCostly, SchemaUnusable, compile_schema, first_error
    from agentd.oversight.approvals import Decision

    if content in ("decline", "cancel"):
        return Decision(content)
    if not isinstance(content, dict):
        return 'the answer must be a JSON object (the form\'s values), or "decline" or "cancel"'
    compiled = compile_schema(dict(schema))
    if compiled.validator is None:
        return f"the requested schema cannot be checked ({compiled.error or compiled.unusable}): decline instead"
    try:
        error = first_error(compiled.validator, content)
    except (CheckTooCostly, SchemaUnusable) as exc:
        return f"the answer cannot be checked against the requested schema ({exc})"
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        return f"the answer does not match the requested schema{f' at {where}' if where else ''}: {error.message}"
    return Decision("accept", content=content)


async def restore_operator(operator: Operator, journal: JournalStore | None, log: EventLog) -> None:
    """Start paused if an earlier daemon with this state directory was paused when it stopped."""
    if journal is None:
        return
    try:
        saved = await journal.get_state(OPERATOR_STATE)
    except JournalError as exc:
        log.warn("journal.write_failed", namespace=OPERATOR_STATE, error=str(exc))
        return
    if saved.get("paused"):
        operator.set_paused(True)
        log.warn("ctl.pause", affected=0, restored=True)


__all__ = ["OPERATOR_STATE", "Applier", "Controls", "Loader", "restore_operator"]
