"""The step loop: think with the model, act through tools, until a final answer or a budget runs out.

One step is one model call plus the tool calls it asked for, run one after another in the model's
order. Each call ends as exactly one observation in the conversation:

* the tool's result (``isError`` included: the tool ran, the model reads what it said);
* a *rejection* when agentd refused to send it: a wire name it never offered, arguments that are not a
  JSON object or do not validate against the tool's ``inputSchema`` (checked before sending);
* a labelled *fault* when the server or transport failed the request (a JSON-RPC error, a broken
  connection), or a correctable *protocol error* (-32601/-32602), as :mod:`agentd.mcp.failure_policy`
  decides. Faults are not the tool's output and the text says so; the client has already re-sent what the
  policy allows, so the loop never resends. A server failing three times in a row is marked down (exit 6 if
  required, its tools withdrawn if optional).
  :data:`MAX_CONSECUTIVE_FAULTS` faults in a row with no successful call end the run as ``failed``:
  the servers are broken, and burning the step budget on them helps nobody.

With a :class:`StepJournal` (``--state-dir``), each step's model reply and tool requests are committed
before any of its calls is sent, and each call's observation as soon as it is made; a :class:`Resume`
(rebuilt from that journal after a crash) starts the loop from the last committed step. A call whose outcome
was lost is re-sent only when its tool declares ``idempotentHint: true``; otherwise the model is told the
outcome is unknown. Without a journal the loop pays one ``is None`` test per step and per call.

The final model message with no tool calls is the result, distilled (:mod:`agentd.agent.distill`).
Budgets (:mod:`agentd.agent.budgets`) end the run with ``partial: true`` and the best result so far: the
last text the model wrote. The deadline is a ``move_on_after`` around the steps so that best result
survives the cut; in-flight calls are cancelled by it (the client tells the server).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio

from agentd import defaults, telemetry
from agentd.agent import approval, observe
from agentd.agent.budgets import BudgetMeter, Limits
from agentd.agent.catalogue import Catalogue, Entry, catalogue_key, catalogues_for
from agentd.agent.control import ChildJournal, ControlContext, ControlToolRegistry
from agentd.agent.distill import Distillate, distill, parse_json_answer
from agentd.agent.ports import Intelligence, ToolPool
from agentd.agent.prompt import initial_messages, system_prompt
from agentd.agent.result import RunResult, RunStatus
from agentd.errors import AgentdError, IntelligenceError, McpError
from agentd.formats import jsontext as json_text
from agentd.formats.ids import call_key, new_key_nonce
from agentd.intelligence import release_idle
from agentd.intelligence.tally import CallTally, tallying
from agentd.intelligence.wire import ModelReply, ToolCall, Usage
from agentd.mcp import failure_policy, schemas
from agentd.oversight.drain import current_drain
from agentd.oversight.operator import current_operator
from agentd.prices import BUDGET_USD, Price, usd
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog
from agentd.telemetry.spans import chat_span, end_chat_span, tool_span

MAX_CONSECUTIVE_FAULTS = 3
#: Characters of tool observations kept in the conversation (about 64k tokens). Beyond it the oldest are
#: replaced by a short note, so a long run degrades gracefully instead of overflowing the model's context.
MAX_HISTORY_OBSERVATION_CHARS = 256_000
#: How many offered tool names a rejection lists, to help the model pick a real one.
_LIST_NAMES = 40

#: Called with each model reply's usage increment, as the gateway reported it, and what it cost in picodollars
#: (agentd.prices; None when the run is not priced: a cost beside the usage, so a priced step builds no second
#: usage value); may be async (the supervisor's tree ceiling). A true answer says the run's token ceiling (its tree's, or its slice of it) is
#: spent: the run ends ``exhausted_tokens`` at this reply, making no further model request; :data:`BUDGET_USD`
#: says the tree's money budget is: the run ends ``exhausted_budget``.
UsageHook = Callable[[Usage, int | None], Awaitable[bool | str | None] | bool | str | None]


class ToolObserver(Protocol):
    """Optional hooks around each tool call (agentd.connections: lifecycle events, per-iteration limits,
    the durable transcript). ``started`` may refuse a call: its reason becomes a rejection observation."""

    def requested(self, step: int, call: ToolCall) -> None: ...

    def started(self, step: int, call: ToolCall, entry: Entry) -> str | None: ...

    def completed(
        self,
        step: int,
        call: ToolCall,
        entry: Entry | None,
        kind: str,
        is_error: bool,
        ms: float,
        observation: str,
    ) -> None: ...


class StepJournal(Protocol):
    """Where the loop commits what it did (agentd.journal's recorder, through agentd.run).

    ``replied`` commits a step's assistant message (its tool calls are the requests) and usage before any
    call is sent (write-ahead); ``observed`` commits one call's observation as the model will see it.
    """

    async def replied(self, step: int, message: Mapping[str, Any], prompt_tokens: int,
                      completion_tokens: int) -> None: ...

    async def observed(self, step: int, call_id: str, ok: bool, text: str) -> None: ...

    async def task_started(self, step: int, call_id: str, task_id: str) -> None: ...

    async def approval_pending(self, step: int, call_id: str, server: str, tool: str,
                               arguments: Mapping[str, Any]) -> None: ...

    async def approval_decided(self, step: int, call_id: str, action: str, reason: str | None) -> None: ...

    async def elicitation_pending(self, step: int, call_id: str, server: str, message: str,
                                  schema: Mapping[str, Any]) -> None: ...

    async def elicitation_decided(self, step: int, call_id: str, action: str, content: Mapping[str, Any] | None,
                                  reason: str | None = None) -> None: ...


@attrs.frozen
class Resume:
    """Where a recovered run starts again: the conversation after the instruction, as committed."""

    messages: tuple[Mapping[str, Any], ...]
    steps: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: The last step's tool calls with no committed observation, in the model's order.
    pending: tuple[ToolCall, ...] = ()
    #: Of those, the ones the server runs as tasks: call id → task id (polled again, never re-called).
    tasks: Mapping[str, str] = attrs.field(factory=dict)
    #: Of those, the ones marked ``approve`` that a person decided: call id → (``approve``/``deny``, reason). One
    #: marked and not listed here was never sent: the resumed run asks again.
    approvals: Mapping[str, tuple[str, str | None]] = attrs.field(factory=dict)


@attrs.frozen
class RunRequest:
    """What to run: the task, its identity, and its bounds."""

    instruction: str
    run_id: str
    limits: Limits = attrs.field(factory=Limits)
    output_contract: str | None = None
    #: Earlier turns to start from (a subagent's narrowed context), OpenAI chat message dicts.
    seed: tuple[Mapping[str, Any], ...] = ()
    #: A recovered run's committed conversation (agentd.run rebuilds it from the journal).
    resume: Resume | None = None
    #: The random part of this run's tool-call idempotency keys (agentd.formats.ids.call_key): fresh for every request,
    #: the journaled one for a resumed run (agentd.run.journal_run).
    key_nonce: str = attrs.field(factory=new_key_nonce)
    #: The run's model's price (agentd.prices) when the run is priced: each reply's cost is counted in its usage
    #: and told to ``on_usage`` (the tree's money budget).
    price: Price | None = None


class _Run:
    """Mutable state of one run; never shared between runs. (A plain class: this module loads at a once run's
    start-up, where an attrs class of this size costs a few milliseconds of CPU to build.)"""

    __slots__ = (
        "_kept",
        "approved",
        "best_text",
        "catalogue",
        "controls",
        "down",
        "elided",
        "failing",
        "faults_in_a_row",
        "intel",
        "journal",
        "last_ok",
        "last_outcome",
        "log",
        "messages",
        "meter",
        "observation_chars",
        "observer",
        "on_usage",
        "pool",
        "reprompted",
        "request",
        "resume_tasks",
    )

    def __init__(self, request: RunRequest, pool: ToolPool, intel: Intelligence, controls: ControlToolRegistry,
                 log: EventLog, on_usage: UsageHook | None, meter: BudgetMeter, *,
                 observer: ToolObserver | None = None, journal: StepJournal | None = None) -> None:
        self.request = request
        self.pool = pool
        self.intel = intel
        self.controls = controls
        self.log = log
        self.on_usage = on_usage
        self.meter = meter
        self.messages: list[dict[str, Any]] = []
        self.catalogue: Catalogue | None = None
        self.best_text: str | None = None
        self.faults_in_a_row = 0
        self.reprompted = False
        self.observation_chars = 0
        self.elided = 0
        self._kept: deque[int] = deque()  # indices of tool messages not yet elided, oldest first
        self.observer = observer
        self.journal = journal
        self.last_ok = False
        #: How the last tool call ended (``result``, ``tool_error``, ``rejected``, ``fault``): its span's outcome.
        self.last_outcome = "result"
        #: Per server, the failures in a row that count toward "down" (agentd.mcp.failure_policy.DOWN_AFTER).
        self.failing: dict[str, int] = {}
        #: Optional servers marked down in this run: their tools are no longer offered.
        self.down: set[str] = set()
        #: A resumed run's calls whose server runs them as tasks (call id → task id): polled, not called again.
        self.resume_tasks: dict[str, str] = dict(request.resume.tasks) if request.resume is not None else {}
        #: A resumed run's calls a person approved before the crash: not asked again.
        self.approved: set[str] = set()

    # -- catalogue -------------------------------------------------------------------------------

    def current_catalogue(self) -> Catalogue:
        tools, controls = tuple(self.pool.tools()), tuple(self.controls)
        if self.down:
            tools = tuple(t for t in tools if t.server not in self.down)
        if self.catalogue is None or self.catalogue.key != catalogue_key(tools, controls):
            self.catalogue = catalogues_for(self.pool).build(tools, controls, log=self.log)
        return self.catalogue

    # -- one step --------------------------------------------------------------------------------

    async def step(self) -> RunResult | None:
        """One model call and its tool calls; a result when the run is over, else ``None``."""
        catalogue = self.current_catalogue()
        self.meter.steps += 1
        step = self.meter.steps
        called = time.perf_counter()
        tally = CallTally()
        with chat_span(str(getattr(self.intel, "model", "default"))) as span:
            try:
                with tallying(tally):
                    reply = await self.intel.complete(self.messages, catalogue.chat_tools)
            except IntelligenceError:
                metrics.gateway_call(time.perf_counter() - called, "error")
                raise
            except trio.Cancelled:
                await self.cut_reply(step, tally)  # the deadline, a drain's end, a cancel: count what it cost
                raise
            cost = self.meter.add_usage(reply.usage.prompt_tokens, reply.usage.completion_tokens)  # priced once
            end_chat_span(span, reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.finish_reason,
                          cost=cost)
        metrics.gateway_call(time.perf_counter() - called, "ok")
        metrics.step(reply.usage.prompt_tokens, reply.usage.completion_tokens, cost=cost)
        spent_out: bool | str | None = False
        if self.on_usage is not None:
            verdict = self.on_usage(reply.usage, cost)
            spent_out = await verdict if inspect.isawaitable(verdict) else verdict
        if reply.content and reply.content.strip():
            self.best_text = reply.content
        self.log.info(
            "loop.step",
            step=step,
            tool_calls=len(reply.tool_calls),
            content=self.log.content(reply.content or ""),
            finish_reason=reply.finish_reason,
            usage=self.meter.usage.to_json(),
        )
        self.messages.append(_assistant_message(reply))
        if self.journal is not None:
            await self.journal.replied(step, self.messages[-1], reply.usage.prompt_tokens,
                                       reply.usage.completion_tokens)
        if spent_out:
            # The money budget or the token ceiling holds here as for every subagent: this reply crossed it, so
            # nothing it asked for runs and no further model request is made. Its tokens are counted (above) and
            # committed (replied).
            return self.spent(spent_out)
        if self.observer is not None:
            for call in reply.tool_calls:
                self.observer.requested(step, call)
        if not reply.tool_calls:
            return self.final(reply)
        for index, call in enumerate(reply.tool_calls):
            ended = await self.run_call(call, catalogue, step, index)
            if self.journal is not None and self.messages[-1].get("tool_call_id") == call.id:  # not: drained waiting
                await self.journal.observed(step, call.id, self.last_ok, self.messages[-1]["content"])
            if ended is not None:
                return ended
        return None

    async def budget_left(self) -> RunResult | None:
        """Before a priced run's first model call: ask the tree's books (a zero report) whether any money or
        tokens are left, so a run restarted after its tree spent its budget makes no request at all."""
        if self.on_usage is None:
            return None
        verdict = self.on_usage(Usage(), 0)
        spent_out = await verdict if inspect.isawaitable(verdict) else verdict
        return self.spent(spent_out) if spent_out else None

    def spent(self, which: object) -> RunResult:
        """The run's end when the tree's books say a budget is spent: the money budget (``BUDGET_USD``) or,
        for any other true verdict, the token ceiling."""
        if which == BUDGET_USD:
            _budget_event(self.log, BUDGET_USD, self)
            return self.finish(RunStatus.EXHAUSTED_BUDGET, self.best_text,
                               error="the money budget is spent (--budget-usd)")
        _budget_event(self.log, "token_ceiling", self)
        return self.finish(RunStatus.EXHAUSTED_TOKENS, self.best_text,
                           error="the token ceiling is spent (--token-ceiling)")

    async def cut_reply(self, step: int, tally: CallTally) -> None:
        """A model call was cut: count what the gateway had answered (its usage, else an estimate, marked) in
        the run's usage and report it like any reply's (shielded and bounded: the run is being cancelled)."""
        cut = tally.cut()
        if not cut.total:
            return
        usage = cut.usage()
        cost = self.meter.add_usage(usage.prompt_tokens, usage.completion_tokens, usage.estimated_tokens)
        self.log.warn("loop.cut_reply", step=step, prompt_tokens=usage.prompt_tokens,
                      completion_tokens=usage.completion_tokens, estimated=cut.estimated)
        if self.on_usage is not None:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + defaults.CUT_REPORT_WAIT):
                verdict = self.on_usage(usage, cost)
                if inspect.isawaitable(verdict):
                    await verdict

    async def recover(self, resume: Resume) -> RunResult | None:
        """Settle the calls whose outcome was lost, then end the run if its last reply was final."""
        catalogue = self.current_catalogue()
        step = self.meter.steps
        order = _call_order(resume.messages, resume.pending)
        for call, index in zip(resume.pending, order, strict=True):
            entry = catalogue.resolve(call.name)
            decided = resume.approvals.get(call.id)
            if entry is not None and entry.server is not None and decided is not None and decided[0] == "deny":
                # denied before the crash, its observation not committed: never sent, the model is told again
                self.observe(call, observe.denied(entry.server, entry.name, decided[1] or "no reason given"),
                             "denied", entry, step, time.perf_counter())
                ended = None
            elif (entry is not None and entry.server is not None and decided is None
                  and approval.needed(self.pool, entry.server, entry.name)):
                ended = await self.run_call(call, catalogue, step, index)  # never approved, never sent: ask again
            elif entry is not None and (entry.idempotent or call.id in self.resume_tasks or self.resumes(entry, call)):
                if decided is not None:
                    self.approved.add(call.id)
                ended = await self.run_call(call, catalogue, step, index)
            else:
                self.observe(call, observe.unknown_outcome(entry.name if entry else call.name), "unknown", entry,
                             step, time.perf_counter())
                ended = None
            if self.journal is not None and self.messages[-1].get("tool_call_id") == call.id:
                await self.journal.observed(step, call.id, self.last_ok, self.messages[-1]["content"])
            if ended is not None:
                return ended
        last = self.messages[-1]
        if last.get("role") == "assistant" and not last.get("tool_calls"):
            return self.final(ModelReply(last.get("content"), finish_reason="stop"))
        return None

    def resumes(self, entry: Entry, call: ToolCall) -> bool:
        """A lost control call that continues its journaled work when made again (a synchronous spawn)."""
        control = self.controls.get(entry.name) if entry.server is None else None
        if control is None or control.resumes is None or self.journal is None:
            return False
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            return False
        return isinstance(arguments, dict) and control.resumes(arguments)

    def restore(self, resume: Resume) -> None:
        """Take a recovered conversation, its step count and its usage (before :meth:`recover`)."""
        for message in resume.messages:
            self.messages.append(dict(message))
            if message.get("role") == "tool":
                self._kept.append(len(self.messages) - 1)
                self.observation_chars += len(str(message.get("content") or ""))
            elif message.get("role") == "assistant" and str(message.get("content") or "").strip():
                self.best_text = str(message["content"])
        self.fit_history()
        self.meter.steps = resume.steps
        self.meter.add_usage(resume.prompt_tokens, resume.completion_tokens)

    def final(self, reply: ModelReply) -> RunResult | None:
        contract = self.request.output_contract
        text = reply.content or ""
        wants_retry = contract is not None and not self.reprompted and not parse_json_answer(text)[0]
        if wants_retry and self.meter.exhausted() is None:
            # One chance to honour the contract, paid for with a step like any other turn.
            self.reprompted = True
            self.messages.append({"role": "user", "content": _REPROMPT})
            return None
        cut_by_model = reply.finish_reason == "length"
        return self.finish(RunStatus.COMPLETED, text, forced_partial=cut_by_model)

    def finish(
        self,
        status: RunStatus,
        text: str | None,
        *,
        forced_partial: bool = False,
        error: str | None = None,
        drained: bool = False,
    ) -> RunResult:
        if text is not None:
            text = self.log.redactor.scrub(text)  # the model may repeat a secret it was never shown verbatim
        distillate: Distillate = distill(text, output_contract=self.request.output_contract)
        partial = forced_partial or distillate.partial or status is not RunStatus.COMPLETED
        self.log.emit(
            "loop.final",
            "info" if status is RunStatus.COMPLETED else "warn",
            status=status.value,
            steps=self.meter.steps,
            partial=partial,
            parsed=distillate.parsed,
            elided_observations=self.elided,
            result=self.log.content(text or ""),
            usage=self.meter.usage.to_json(),
        )
        return RunResult(
            run_id=self.request.run_id,
            status=status,
            partial=partial,
            result=distillate.value,
            steps=self.meter.steps,
            usage=self.meter.usage,
            error=error,
            drained=drained,
        )

    # -- one tool call ---------------------------------------------------------------------------

    async def run_call(self, call: ToolCall, catalogue: Catalogue, step: int, index: int) -> RunResult | None:
        """Make the ``index``-th call (the model's order) of ``step``: its position names it (its idempotency
        key, agentd.formats.ids.call_key), so a resumed run re-sends it under the same key."""
        entry = catalogue.resolve(call.name)
        with tool_span(entry.name if entry else call.name, call.id, server=entry.server if entry else None,
                       arguments=call.arguments) as span:
            ended = await self._run_call(call, catalogue, step, entry, index)
            if self.last_outcome != "result":
                telemetry.mark_error(span, self.last_outcome)
            return ended

    async def _run_call(
        self, call: ToolCall, catalogue: Catalogue, step: int, entry: Entry | None, index: int
    ) -> RunResult | None:
        started = time.perf_counter()
        self.log.info(
            "tool.call",
            step=step,
            call_id=call.id,
            wire_name=call.name,
            server=entry.server if entry else None,
            tool=entry.name if entry else None,
            arguments=self.log.content(call.arguments),
        )
        if entry is not None and entry.validator is not None and len(call.arguments) > _INLINE_CHECK_CHARS:
            # Off the event loop: a check costs up to its budget (a quarter of a second or so); the daemon
            # serves meanwhile, and a deadline abandons the thread (it ends within its budget).
            problem, arguments = await trio.to_thread.run_sync(_check_call, call, entry, catalogue,
                                                               abandon_on_cancel=True)
        else:
            problem, arguments = _check_call(call, entry, catalogue)
        if problem is not None or entry is None:
            self.log.warn("tool.rejected", step=step, call_id=call.id, wire_name=call.name, reason=problem)
            self.observe(call, observe.rejection(problem or "unknown tool"), "rejected", entry, step, started)
            return None
        refusal = self.observer.started(step, call, entry) if self.observer is not None else None
        if refusal is not None:
            self.log.warn("tool.rejected", step=step, call_id=call.id, wire_name=call.name, reason=refusal)
            self.observe(call, observe.rejection(refusal), "rejected", entry, step, started)
            return None
        control = self.controls.get(entry.name) if entry.server is None else None
        if entry.server is None and control is None:  # unregistered since this step's catalogue was built
            reason = f"the control tool {entry.name!r} is no longer offered"
            self.log.warn("tool.rejected", step=step, call_id=call.id, wire_name=call.name, reason=reason)
            self.observe(call, observe.rejection(reason), "rejected", entry, step, started)
            return None
        if control is not None:
            ctx = ControlContext(run_id=self.request.run_id, log=self.log, step=step, call_id=call.id,
                                 journal=self.journal if self.journal is not None and isinstance(self.journal, ChildJournal)
                                 else None)
            try:
                outcome = await control.handler(arguments, ctx)
            except AgentdError as exc:
                return self.fault(call, entry, str(exc), step, started)
            text = observe.render_content(outcome.content, outcome.structured)
            self.faults_in_a_row = 0
            self.observe(
                call,
                observe.tool_result(text, is_error=outcome.is_error),
                "result",
                entry,
                step,
                started,
                is_error=outcome.is_error,
            )
            if outcome.end_turn:
                return self.finish(RunStatus.COMPLETED, self.best_text)
            return None
        assert entry.server is not None
        if call.id not in self.approved and approval.needed(self.pool, entry.server, entry.name):
            denial = await self.ask(call, entry, arguments, step)
            if denial is _DRAINED:  # stopping while a person was asked: unsent, undecided, asked again on resume
                drain = current_drain()
                return self.finish(RunStatus.CANCELLED, self.best_text, error=f"drained ({drain.reason})",
                                   drained=True)
            if denial is not None:
                self.observe(call, observe.denied(entry.server, entry.name, denial), "denied", entry, step, started)
                return None
        try:
            request = self.request
            with self.answering(entry.server, step, call.id):
                result = await self.pool.call_tool(
                    entry.server, entry.name, arguments, run_id=request.run_id,
                    idempotency_key=call_key(request.run_id, request.key_nonce, step, index),
                    resume_task=self.resume_tasks.pop(call.id, None), on_task=self._task_started(step, call.id),
                )
        except McpError as exc:
            return self.server_failed(call, entry, exc, step, started)
        self.faults_in_a_row = 0
        self.failing.pop(entry.server, None)
        text = observe.render_content(result.content, result.structured)
        self.observe(
            call,
            observe.tool_result(text, is_error=result.is_error),
            "result",
            entry,
            step,
            started,
            is_error=result.is_error,
        )
        return None

    def answering(self, server: str, step: int, call_id: str) -> contextlib.AbstractContextManager[None]:
        """While a call to ``server`` runs: what answers its elicitation and sampling requests, when the host opted
        it in (agentd.agent.asks); otherwise nothing (the client refuses both, as it declares neither)."""
        conn = self.pool.connections.get(server)
        declared: tuple[str, ...] = getattr(getattr(conn, "config", None), "capabilities", ()) or ()
        if not declared:
            return contextlib.nullcontext()
        from agentd.agent.asks import ServerAsks
        from agentd.oversight.approvals import answering

        async def count(usage: Usage) -> None:
            cost = self.meter.add_usage(usage.prompt_tokens, usage.completion_tokens)  # priced as a step's reply
            if self.on_usage is not None:
                verdict = self.on_usage(usage, cost)
                if inspect.isawaitable(verdict):
                    await verdict

        return answering(ServerAsks(self.request.run_id, self.log, self.intel, count,
                                    lambda: bool(self.meter.limits.max_tokens)
                                    and self.meter.usage.total_tokens >= self.meter.limits.max_tokens,
                                    journal=self.journal, step=step, call_id=call_id,
                                    sampling_tools="sampling.tools" in declared))

    async def ask(self, call: ToolCall, entry: Entry, arguments: Mapping[str, Any], step: int) -> str | None:
        """Hold a call marked ``approve`` until a person decides (agentd.oversight.approvals): None when approved, else why
        it was denied (:data:`_DRAINED`: the process is stopping, nothing decided). Committed before the wait and
        after the decision, so a crash never sends it unasked."""
        assert entry.server is not None
        from agentd.oversight.approvals import current_approvals  # a run with no marked tool never loads it

        shown = approval.summary(arguments, self.log.redactor)
        queue = current_approvals()
        fields: dict[str, Any] = {"step": step, "call_id": call.id, "server": entry.server, "tool": entry.name}
        if queue is None:  # nobody can be asked in this process: denied at once, nothing hangs
            self.log.warn("approval.decided", **fields, action="deny", reason=approval.NOBODY, waited_s=0.0)
            return approval.NOBODY
        if self.journal is not None:
            await self.journal.approval_pending(step, call.id, entry.server, entry.name, shown)
        item = queue.approval(self.request.run_id, entry.server, entry.name, shown)
        self.log.warn("approval.pending", id=item.id, **fields,
                      arguments=self.log.content(json.dumps(shown, ensure_ascii=False)))
        decision = await queue.wait(item, current_drain())
        if decision is None:
            return _DRAINED
        self.log.warn("approval.decided", id=item.id, **fields, action=decision.action, reason=decision.reason,
                      waited_s=round(time.time() - item.created, 3))
        if self.journal is not None:
            await self.journal.approval_decided(step, call.id, decision.action, decision.reason)
        return None if decision.approved else (decision.reason or "no reason given")

    def _task_started(self, step: int, call_id: str) -> Callable[[str], Awaitable[None]]:
        """What runs once a call's task exists, before it is polled: its id committed (``tool.task``) when the run
        is journaled; and the model client's idle connections let go, as the wait may last hours."""
        journal = self.journal
        intel = self.intel

        async def started(task_id: str) -> None:
            if journal is not None:
                await journal.task_started(step, call_id, task_id)
            await release_idle(intel)

        return started

    def fit_history(self) -> None:
        """Elide the oldest observations (never the newest) while they exceed the history bound."""
        while self.observation_chars > MAX_HISTORY_OBSERVATION_CHARS and len(self._kept) > 1:
            index = self._kept.popleft()
            message = self.messages[index]
            self.observation_chars -= len(message["content"])
            self.elided += 1
            self.messages[index] = {**message, "content": observe.elided(len(message["content"]))}

    def server_failed(
        self, call: ToolCall, entry: Entry, exc: McpError, step: int, started: float
    ) -> RunResult | None:
        """A tools/call the server failed, after the client's retries: the failure policy decides the observation
        (agentd.mcp.failure_policy) and whether the server is now down (exit 6 if required, else omitted)."""
        assert entry.server is not None
        failure = failure_policy.classify(exc)
        decision = failure_policy.decide(failure, failure_policy.request_kind("tools/call", idempotent=entry.idempotent))
        if decision.outcome is failure_policy.Outcome.CORRECTABLE:
            self.failing.pop(entry.server, None)  # the server answered: it is up
            self.observe(call, observe.correctable(entry.server, entry.name, str(exc)), "protocol_error", entry,
                         step, started, reason=str(exc))  # fmt: skip
            return None
        if decision.counts_down:
            count = self.failing.get(entry.server, 0) + 1
            self.failing[entry.server] = count
            if count >= failure_policy.DOWN_AFTER:
                conn = self.pool.connections.get(entry.server)
                required = bool(getattr(getattr(conn, "config", None), "required", True))
                self.log.error("mcp.server_down", server=entry.server, required=required, failures=count,
                               failure=failure.value, error=str(exc))  # fmt: skip
                self.observe(call, observe.fault(entry.server, entry.name, str(exc)), "fault", entry, step, started,
                             reason=str(exc))  # fmt: skip
                if required:
                    return self.finish(RunStatus.MCP_FAILED, self.best_text,
                                       error=f"required MCP server {entry.server!r} is down after {count} failures "
                                             f"in a row; last: {exc}")  # fmt: skip
                self.down.add(entry.server)  # optional: its tools leave the catalogue for the rest of the run
                self.faults_in_a_row = 0
                return None
        return self.fault(call, entry, str(exc), step, started)

    def fault(self, call: ToolCall, entry: Entry, reason: str, step: int, started: float) -> RunResult | None:
        server = entry.server or "agentd"
        self.faults_in_a_row += 1
        self.observe(
            call, observe.fault(server, entry.name, reason), "fault", entry, step, started, reason=reason
        )
        if self.faults_in_a_row >= MAX_CONSECUTIVE_FAULTS:
            return self.finish(
                RunStatus.FAILED,
                self.best_text,
                error=f"{self.faults_in_a_row} tool faults in a row; last: {reason}",
            )
        return None

    def observe(
        self,
        call: ToolCall,
        text: str,
        kind: str,
        entry: Entry | None,
        step: int,
        started: float,
        *,
        is_error: bool = False,
        reason: str | None = None,
    ) -> None:
        self.last_outcome = "tool_error" if kind == "result" and is_error else kind
        metrics.tool_call(entry.server if entry else None, self.last_outcome)
        # A server may echo a credential back (a header, a token): registered secret values never reach the
        # model, the transcript or the result. Scrubbed before the cap, so no part of one survives a cut.
        text = observe.cap(self.log.redactor.scrub(text))
        self.last_ok = kind == "result" and not is_error
        self.messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
        self._kept.append(len(self.messages) - 1)
        self.observation_chars += len(text)
        self.fit_history()
        fields: dict[str, Any] = {
            "step": step,
            "call_id": call.id,
            "wire_name": call.name,
            "server": entry.server if entry else None,
            "tool": entry.name if entry else None,
            "kind": kind,
            "is_error": is_error,
            "size": len(text),
            "content": self.log.content(text),
            "ms": round((time.perf_counter() - started) * 1000, 3),
        }
        if reason is not None:
            fields["reason"] = reason
        self.log.emit("tool.result", "warn" if kind == "fault" else "info", **fields)
        if self.observer is not None:
            self.observer.completed(step, call, entry, kind, is_error, fields["ms"], text)


#: What :meth:`_Run.ask` returns when a drain ended the wait: the run stops as drained, the call unsent.
_DRAINED = "\x00drained"

#: Arguments up to this long are checked on the event loop (microseconds for any sane schema, and the check's
#: budget caps a hostile one); longer ones, where checks get costly, in a worker thread.
_INLINE_CHECK_CHARS = 4096

_REPROMPT = (
    "Your last message did not contain a JSON value. Reply again with only the JSON value the output "
    "contract asks for, and no tool calls."
)


def _assistant_message(reply: ModelReply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return message


def _call_order(messages: Sequence[Mapping[str, Any]], pending: Sequence[ToolCall]) -> list[int]:
    """Each pending call's place (0-based) among its step's tool calls, as the journaled assistant message lists
    them: the index it was first sent under. A call the message does not list (it always does) gets a place past
    the end, still distinct."""
    listed: list[str] = []
    for message in reversed(messages):
        if message.get("role") == "assistant" and message.get("tool_calls"):
            listed = [str(c.get("id")) for c in message["tool_calls"] if isinstance(c, Mapping)]
            break
    taken: set[int] = set()
    order: list[int] = []
    spare = len(listed)
    for call in pending:
        place = next((i for i, cid in enumerate(listed) if cid == call.id and i not in taken), None)
        if place is None:
            place, spare = spare, spare + 1
        taken.add(place)
        order.append(place)
    return order


def _check_call(
    call: ToolCall, entry: Entry | None, catalogue: Catalogue
) -> tuple[str | None, dict[str, Any]]:
    """Why this call must not be sent (or ``None``), and its parsed arguments."""
    if entry is None:
        names = list(catalogue.entries)
        shown = ", ".join(names[:_LIST_NAMES]) + (" …" if len(names) > _LIST_NAMES else "")
        return f"unknown tool {call.name!r}; the tools offered are: {shown or 'none'}", {}
    try:
        arguments = json_text.loads(call.arguments, "replace")
    except json.JSONDecodeError as exc:
        return f"the arguments for {call.name!r} are not valid JSON ({exc.msg} at char {exc.pos})", {}
    except ValueError:
        return f"the arguments for {call.name!r} are not valid JSON (nested too deeply)", {}
    if not isinstance(arguments, dict):
        return f"the arguments for {call.name!r} must be a JSON object, got {type(arguments).__name__}", {}
    try:
        invalid = entry.check(arguments)
    except schemas.CheckTooCostly as exc:
        return (f"the arguments for {call.name!r} were not sent: checking them against the inputSchema of "
                f"server {entry.server!r} would cost too much ({exc})"), {}
    if invalid is not None:
        return f"the arguments for {call.name!r} do not match its inputSchema: {invalid}", {}
    return None, arguments


async def run_loop(
    request: RunRequest,
    *,
    pool: ToolPool,
    intel: Intelligence,
    controls: ControlToolRegistry,
    log: EventLog,
    on_usage: UsageHook | None = None,
    observer: ToolObserver | None = None,
    journal: StepJournal | None = None,
) -> RunResult:
    """Run one task to a :class:`RunResult`. Intelligence failures end the run (status
    ``intelligence_failed``, exit 4) with the best result so far; cancellation from outside propagates.
    ``observer`` (optional) sees every tool call's request, start and end; ``journal`` (optional) commits
    every step (see the module docstring); ``request.resume`` starts from a recovered conversation.
    """
    run = _Run(request, pool, intel, controls, log, on_usage, BudgetMeter(request.limits, price=request.price),
               observer=observer, journal=journal)
    system = system_prompt(
        instructions=pool.instructions(), resources=pool.resources(), output_contract=request.output_contract
    )
    run.messages = initial_messages(system, request.instruction, request.seed)
    if request.resume is not None:
        run.restore(request.resume)
    catalogue = run.current_catalogue()
    log.info(
        "loop.start",
        tools=len(catalogue.entries),
        control_tools=[c.name for c in controls],
        resources=len(pool.resources()),
        servers=sorted(pool.connections),
        max_steps=request.limits.max_steps,
        max_tokens=request.limits.max_tokens,
        deadline=request.limits.deadline,
        system_prompt=log.content(system),
        instruction=log.content(request.instruction),
    )
    result: RunResult | None = None
    drain = current_drain()
    operator = current_operator()
    with trio.move_on_after(request.limits.deadline) as deadline, (
        operator.running(request.run_id) if operator is not None else contextlib.nullcontext()
    ) as entry:
        try:
            if request.resume is not None:
                result = await run.recover(request.resume)
            if result is None and request.price is not None:
                result = await run.budget_left()
            while result is None:
                if operator is not None and entry is not None:  # the operator's pause holds the next turn
                    entry.step = run.meter.steps
                    await operator.turn_boundary(entry, drain)
                if drain.requested:
                    # Drain: stop at a step boundary with the best result so far (a clean drain exits 0).
                    reason = f"drained ({drain.reason})"
                    result = run.finish(RunStatus.CANCELLED, run.best_text, error=reason, drained=True)
                    break
                exhausted = run.meter.exhausted()
                if exhausted is not None:
                    _budget_event(log, exhausted.value, run)
                    result = run.finish(exhausted, run.best_text)
                    break
                result = await run.step()
        except IntelligenceError as exc:
            result = run.finish(RunStatus.INTELLIGENCE_FAILED, run.best_text, error=str(exc))
        finally:
            if result is None and drain.requested and not deadline.cancel_called:
                # Cut mid-step by the drain's end: what this run had spent still shows in the final document.
                usage = run.meter.usage
                drain.note_spent(run.meter.steps, usage.prompt_tokens, usage.completion_tokens, usage.estimated_tokens)
    if result is None and entry is not None and entry.scope.cancelled_caught:
        log.warn("run.cancelled", reason=entry.cancel_reason or "cancelled by the operator")
        result = run.finish(RunStatus.CANCELLED, run.best_text, error=entry.cancel_reason or "cancelled")
    if result is None:
        assert deadline.cancelled_caught
        _budget_event(log, RunStatus.DEADLINE.value, run)
        result = run.finish(RunStatus.DEADLINE, run.best_text)
    return result


def _budget_event(log: EventLog, which: str, run: _Run) -> None:
    limits = run.request.limits
    log.warn(
        "loop.budget",
        budget=which,
        steps=run.meter.steps,
        max_steps=limits.max_steps,
        tokens=run.meter.usage.total_tokens,
        max_tokens=limits.max_tokens,
        deadline=limits.deadline,
        **({} if run.meter.usage.cost is None else {"cost_usd": usd(run.meter.usage.cost)}),
    )


__all__: Sequence[str] = ("MAX_CONSECUTIVE_FAULTS", "Resume", "RunRequest", "StepJournal", "ToolObserver", "UsageHook",
                          "run_loop")
