"""The journal's record types: what a run and the daemon commit, as frozen, JSON-serialisable values.

Why one module: the record vocabulary is the journal's file format. Each record is a frozen attrs value with a
``KIND`` (its tag on disk); :func:`encode` turns it into a JSON object ``{"v": 1, "kind": ..., fields...}``
and :func:`decode` turns that back, refusing a kind it does not know or a newer ``v`` with a
:class:`JournalFormatError` instead of guessing. Adding a field with a default is compatible; renaming or
removing one needs a new ``RECORD_VERSION``.

Payloads that come from the model or a tool (``message``, ``arguments``, ``result``) are kept as the JSON
values the loop already holds: the journal never re-interprets them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import attrs

from agentd.journal.errors import JournalFormatError
from agentd.telemetry.events import Redactor

#: The version every encoded record carries as ``v``. A reader refuses anything newer.
RECORD_VERSION: Final = 1


def _run_ids(value: Any) -> tuple[str, ...] | None:
    """Run ids as a tuple (a decoded record holds a JSON list)."""
    return None if value is None else tuple(str(v) for v in value)


# --- one run ---------------------------------------------------------------------------------------------


@attrs.frozen
class RunStarted:
    """The first record of a run: what it was asked and under which configuration."""

    KIND: ClassVar[str] = "run.started"
    config_digest: str
    instruction: str
    contract: Any = None  # the output contract (JSON schema or None)
    parent: str | None = None  # the parent's handle for a subagent's run; None for a root run
    #: A ``--continue`` session's turn: the run ids of the session's earlier turns it starts from, oldest first
    #: (references: each turn's message and answer are its own run's records); None for any other run.
    seed_runs: tuple[str, ...] | None = attrs.field(default=None, converter=_run_ids)
    #: The random part of the run's tool-call idempotency keys (agentd.formats.ids.call_key), so a resumed run re-sends a
    #: call under the key it was first sent with; None in a journal written before agentd sent keys.
    key_nonce: str | None = None


@attrs.frozen
class ModelReply:
    KIND: ClassVar[str] = "model.reply"
    step: int
    message: Any  # the assistant message as the loop holds it (text and tool calls)


@attrs.frozen
class ToolCallRequested:
    KIND: ClassVar[str] = "tool.requested"
    step: int
    call_id: str
    name: str
    arguments: Any


@attrs.frozen
class ToolCallOutcome:
    KIND: ClassVar[str] = "tool.outcome"
    step: int
    call_id: str
    ok: bool
    result: Any  # the observation the model will see (or the error text)


@attrs.frozen
class ToolTaskStarted:
    """A tool call the server runs as a task (agentd.mcp.tasks): its task id, committed before the first poll,
    so a resumed run polls that task instead of calling the tool again."""

    KIND: ClassVar[str] = "tool.task"
    step: int
    call_id: str
    task_id: str


@attrs.frozen
class ApprovalPending:
    """A tool call marked ``approve`` waits for a person (agentd.oversight.approvals), committed before the wait: a resumed
    run asks again for a call with no ``approval.decided``, and never sends it unasked."""

    KIND: ClassVar[str] = "approval.pending"
    step: int
    call_id: str
    server: str
    tool: str
    arguments: Any = None  # the summary a person was shown (short values whole, secrets redacted)


@attrs.frozen
class ApprovalDecided:
    """A person's decision on a pending approval: ``approve`` (the call is sent next) or ``deny`` (never sent)."""

    KIND: ClassVar[str] = "approval.decided"
    step: int
    call_id: str
    action: str  # approve | deny
    reason: str | None = None


@attrs.frozen
class ElicitationPending:
    """A server's question (``elicitation/create``) during the tool call ``call_id`` waits for a person, committed
    before the wait. The question lives on the server's open request: after a crash that request is gone, so a
    resumed run records it ``cancel`` (:class:`ElicitationDecided`) and settles the call like any call whose
    outcome was lost."""

    KIND: ClassVar[str] = "elicitation.pending"
    step: int
    call_id: str
    server: str
    message: str
    schema: Any = None  # the form the server asked for (``requestedSchema``)


@attrs.frozen
class ElicitationDecided:
    """How a question was settled: ``accept`` (with ``content``, the form's values as sent to the server),
    ``decline`` or ``cancel`` (``reason``: why, when agentd settled it: nobody could be asked, a drain, a
    restart)."""

    KIND: ClassVar[str] = "elicitation.decided"
    step: int
    call_id: str
    action: str  # accept | decline | cancel
    content: Any = None
    reason: str | None = None


@attrs.frozen
class Spawned:
    KIND: ClassVar[str] = "spawn"
    step: int
    handle: str
    instruction: str
    budget: int | None = None  # the token slice reserved for the child
    run: str | None = None  # the run id the child journals its own steps under (None: not journaled)
    warm: bool = False  # a warm session (a resumed parent cannot re-open it: it ends ``interrupted``)


@attrs.frozen
class ChildResult:
    KIND: ClassVar[str] = "child.result"
    handle: str
    status: str
    result: Any = None
    tokens: int = 0


@attrs.frozen
class Usage:
    KIND: ClassVar[str] = "usage"
    step: int
    input_tokens: int
    output_tokens: int


@attrs.frozen
class RunEnded:
    """The terminal record: after it the run is finished and retention may remove it."""

    KIND: ClassVar[str] = "run.ended"
    status: str  # completed | failed | cancelled | budget | ...
    result: Any = None
    error: str | None = None


@attrs.frozen
class ClaimTaken:
    """A cluster member took the run (a work item) with a lease and fencing token (agentd.cluster.work)."""

    KIND: ClassVar[str] = "claim.taken"
    owner: str
    token: int
    attempt: int = 1


# --- the daemon's durable state --------------------------------------------------------------------------


@attrs.frozen
class SubscriptionAdded:
    KIND: ClassVar[str] = "subscription.added"
    server: str
    uri: str
    origin: str = "declared"  # declared | self (added by the agent at run time)


@attrs.frozen
class SubscriptionRemoved:
    KIND: ClassVar[str] = "subscription.removed"
    server: str
    uri: str


@attrs.frozen
class ScheduleAdded:
    KIND: ClassVar[str] = "schedule.added"
    schedule_id: str
    at: float  # wall-clock seconds since the epoch
    instruction: str


@attrs.frozen
class ScheduleFired:
    KIND: ClassVar[str] = "schedule.fired"
    schedule_id: str
    run_id: str


@attrs.frozen
class HandleState:
    """A served handle (self-MCP) and, once finished, its result, kept until evicted."""

    KIND: ClassVar[str] = "handle.state"
    handle: str
    status: str
    result: Any = None


@attrs.frozen
class BudgetReserved:
    KIND: ClassVar[str] = "budget.reserved"
    handle: str
    parent: str
    amount: int


@attrs.frozen
class BudgetCharged:
    KIND: ClassVar[str] = "budget.charged"
    handle: str
    tokens: int


@attrs.frozen
class BudgetRefunded:
    KIND: ClassVar[str] = "budget.refunded"
    handle: str
    amount: int


Record = (
    RunStarted | ModelReply | ToolCallRequested | ToolCallOutcome | ToolTaskStarted | Spawned | ChildResult | Usage
    | RunEnded | ClaimTaken | ApprovalPending | ApprovalDecided | ElicitationPending | ElicitationDecided
    | SubscriptionAdded | SubscriptionRemoved | ScheduleAdded | ScheduleFired | HandleState
    | BudgetReserved | BudgetCharged | BudgetRefunded
)  # fmt: skip

KINDS: Final[Mapping[str, type[Any]]] = {
    cls.KIND: cls
    for cls in (
        RunStarted, ModelReply, ToolCallRequested, ToolCallOutcome, ToolTaskStarted, Spawned, ChildResult, Usage,
        RunEnded,
        ClaimTaken, SubscriptionAdded, SubscriptionRemoved, ScheduleAdded, ScheduleFired, HandleState,
        BudgetReserved, BudgetCharged, BudgetRefunded, ApprovalPending, ApprovalDecided, ElicitationPending,
        ElicitationDecided,
    )
}  # fmt: skip


def redacted(record: Record, redactor: Redactor | None) -> Record:
    """``record`` with every known secret value (``redactor``'s) in its fields replaced by ``***``: a secret an
    instruction, a model reply or a tool result quotes is never journaled (a replay sees ``***``)."""
    if redactor is None:
        return record
    changes = {}
    for field in attrs.fields(type(record)):
        value = getattr(record, field.name)
        clean = redactor.scrub_value(value)
        if isinstance(value, tuple):
            clean = tuple(clean)
        if clean != value:
            changes[field.alias or field.name] = clean
    return attrs.evolve(record, **changes) if changes else record


#: Each record type's field names, in order (what ``attrs.asdict(recurse=False)`` would walk for every record).
_FIELDS: Final[Mapping[type[Any], tuple[str, ...]]] = {
    cls: tuple(field.name for field in attrs.fields(cls)) for cls in KINDS.values()
}


def encode(record: Record) -> dict[str, Any]:
    """The record as a JSON-ready object (its payloads are not copied: do not mutate them afterwards)."""
    out: dict[str, Any] = {"v": RECORD_VERSION, "kind": record.KIND}
    for name in _FIELDS[type(record)]:
        out[name] = getattr(record, name)
    return out


#: One encoder for every record (``json.dumps`` with options builds a new encoder per call).
_JSON: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def encode_json(record: Record) -> str:
    """:func:`encode`'s object as the compact JSON text a store writes."""
    return _JSON(encode(record))


def decode(data: Mapping[str, Any]) -> Record:
    """A record back from :func:`encode`'s object; a clear :class:`JournalFormatError` if it cannot be."""
    version, kind = data.get("v"), data.get("kind")
    if not isinstance(version, int) or version > RECORD_VERSION:
        raise JournalFormatError(
            f"journal record version {version!r} is newer than this agentd reads ({RECORD_VERSION})"
        )
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise JournalFormatError(f"unknown journal record kind {kind!r}")
    fields = {k: v for k, v in data.items() if k not in ("v", "kind")}
    try:
        record: Record = cls(**fields)
    except TypeError as exc:
        raise JournalFormatError(f"malformed {kind} record: {exc}") from None
    return record
