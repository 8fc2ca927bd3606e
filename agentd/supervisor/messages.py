"""The frames of the private control protocol, as typed values.

Every frame is a JSON-RPC 2.0 notification ``{"jsonrpc": "2.0", "method": ..., "params": {...}}``;
the one round trip (a nested child asking the root for spawn admission) correlates ``admit``/``admitted``
by ``ref`` instead of JSON-RPC ids, so both directions stay plain notifications.

Down (parent → child): ``spawn`` (the run payload, first frame, secrets included), ``ping``, ``cancel``,
``inject`` (a warm session's next message), ``admitted``, ``answered``.
Up (child → parent): ``ready``, ``pong``, ``progress``, ``usage`` (token deltas of the child's whole
subtree), ``result``, ``failed``, ``admit``, ``release``, ``metrics`` (a descendant's metric observations,
passed up unchanged to the root when the root has metrics on), ``ask`` (a question for a person, answered by
``answered``: the same ``ref`` round trip as ``admit``).

Decoding is strict about field types and lenient about unknown fields, so either side may grow.
Hand-rolled rather than cattrs because the child imports this on its start-up path.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeAlias

import attrs
from attrs.validators import instance_of, optional


class MessageError(ValueError):
    """A frame that is a JSON object but not a control message we understand."""


_str = instance_of(str)
_int = instance_of(int)
_bool = instance_of(bool)
_dict = instance_of(dict)
_list = instance_of(list)


@attrs.frozen
class RunPayload:
    """Everything a child needs to run: sent once, first, over the channel (never argv or env)."""

    handle: str = attrs.field(validator=_str)
    depth: int = attrs.field(validator=_int)
    instruction: str = attrs.field(validator=_str)
    output_contract: str | None = attrs.field(default=None, validator=optional(_str))
    context: list[Any] = attrs.field(factory=list, validator=_list)
    warm: bool = attrs.field(default=False, validator=_bool)
    tool_scope: list[str] = attrs.field(factory=list, validator=_list)
    #: The run configuration for the child's loop (servers already narrowed to ``tool_scope``).
    config: dict[str, Any] = attrs.field(factory=dict, validator=_dict)
    #: Resolved secret values by name; the child resolves ``{{secret:NAME}}`` from here, not its env.
    secrets: dict[str, str] = attrs.field(factory=dict, validator=_dict, repr=False)
    #: The child's own supervisor settings (caps are enforced at the root; graces and liveness apply).
    supervision: dict[str, Any] = attrs.field(factory=dict, validator=_dict)
    #: Log settings, the trace context of the spawning span and, when tracing, the exporter settings (whose
    #: headers may hold a credential: not in the repr).
    telemetry: dict[str, Any] = attrs.field(factory=dict, validator=_dict, repr=False)
    #: Test-only scripted behaviour; set only through a Python-level Supervisor hook, never MCP or argv.
    test: dict[str, Any] | None = attrs.field(default=None, validator=optional(_dict))
    #: Earlier turns (chat messages) of a warm session re-opened after its parent restarted.
    history: list[Any] = attrs.field(factory=list, validator=_list)
    #: Where the child journals its own run: ``{"state_dir": ..., "run_id": ...}`` (the tree's state directory
    #: and the run id its parent derived; ``"new": true``: no process journaled that run before; ``"parent":
    #: true``: its end goes to the spawning run, which commits it: ``run.ended`` not flushed); None: not journaled.
    journal: dict[str, Any] | None = attrs.field(default=None, validator=optional(_dict))


@attrs.frozen
class Spawn:
    METHOD: ClassVar[str] = "spawn"
    payload: RunPayload


@attrs.frozen
class Ping:
    METHOD: ClassVar[str] = "ping"
    seq: int = attrs.field(validator=_int)


@attrs.frozen
class Cancel:
    METHOD: ClassVar[str] = "cancel"
    reason: str = attrs.field(default="cancelled", validator=_str)


@attrs.frozen
class Inject:
    METHOD: ClassVar[str] = "inject"
    message: str = attrs.field(validator=_str)


@attrs.frozen
class Admitted:
    """The root's answer to :class:`Admit`: a minted handle, or the refusal text."""

    METHOD: ClassVar[str] = "admitted"
    ref: int = attrs.field(validator=_int)
    handle: str | None = attrs.field(default=None, validator=optional(_str))
    depth: int | None = attrs.field(default=None, validator=optional(_int))
    scope: list[str] | None = attrs.field(default=None, validator=optional(_list))
    refusal: str | None = attrs.field(default=None, validator=optional(_str))
    retryable: bool = attrs.field(default=False, validator=_bool)


@attrs.frozen
class Ready:
    METHOD: ClassVar[str] = "ready"
    pid: int = attrs.field(validator=_int)


@attrs.frozen
class Pong:
    METHOD: ClassVar[str] = "pong"
    seq: int = attrs.field(validator=_int)


@attrs.frozen
class Progress:
    METHOD: ClassVar[str] = "progress"
    note: str = attrs.field(default="", validator=_str)


@attrs.frozen
class Usage:
    """Tokens a run in the child's subtree used since the last frame; ``estimated_tokens`` of them are an
    estimate (a reply cut before the gateway reported its usage)."""

    METHOD: ClassVar[str] = "usage"
    prompt_tokens: int = attrs.field(default=0, validator=_int)
    completion_tokens: int = attrs.field(default=0, validator=_int)
    estimated_tokens: int = attrs.field(default=0, validator=_int)
    #: What they cost in picodollars (agentd.prices), each reply priced by its run's model; None: not priced.
    cost: int | None = attrs.field(default=None, validator=optional(_int))

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@attrs.frozen
class Result:
    """A finished turn. ``status`` is the loop's terminal status (completed, cancelled, ...)."""

    METHOD: ClassVar[str] = "result"
    status: str = attrs.field(validator=_str)
    partial: bool = attrs.field(default=False, validator=_bool)
    result: Any = None


@attrs.frozen
class Failed:
    METHOD: ClassVar[str] = "failed"
    reason: str = attrs.field(validator=_str)


@attrs.frozen
class Admit:
    """A nested child's spawn request, forwarded up to the one chokepoint at the root."""

    METHOD: ClassVar[str] = "admit"
    ref: int = attrs.field(validator=_int)
    caller: str = attrs.field(validator=_str)
    tool_scope: list[str] | None = attrs.field(default=None, validator=optional(_list))
    #: The token slice asked for (``token_budget``); None: the default share.
    budget: int | None = attrs.field(default=None, validator=optional(_int))
    #: The handle a resumed run's child is admitted under again (its earlier process's); None: a new one.
    handle: str | None = attrs.field(default=None, validator=optional(_str))


@attrs.frozen
class Release:
    """A nested child's subagent ended; the root stops counting it."""

    METHOD: ClassVar[str] = "release"
    handle: str = attrs.field(validator=_str)


@attrs.frozen
class MetricsDelta:
    """Observations of one subagent process (agentd.telemetry.metrics.Deltas) since its last frame; the
    root replays them with ``depth`` (the reporting child's own, kept as the frame travels up)."""

    METHOD: ClassVar[str] = "metrics"
    depth: int = attrs.field(validator=_int)
    observations: list[Any] = attrs.field(factory=list, validator=_list)


@attrs.frozen
class Ask:
    """A question for a person from a run in the child's subtree (agentd.oversight.approvals): a tool call to approve, or a
    server's elicitation, forwarded up to the root's queue; the parent answers with :class:`Answered`."""

    METHOD: ClassVar[str] = "ask"
    ref: int = attrs.field(validator=_int)
    kind: str = attrs.field(validator=_str)  # approval | elicitation
    run_id: str = attrs.field(validator=_str)
    server: str = attrs.field(validator=_str)
    tool: str | None = attrs.field(default=None, validator=optional(_str))
    summary: dict[str, Any] | None = attrs.field(default=None, validator=optional(_dict))
    message: str | None = attrs.field(default=None, validator=optional(_str))
    schema: dict[str, Any] | None = attrs.field(default=None, validator=optional(_dict))


@attrs.frozen
class Answered:
    """A person's answer to :class:`Ask` (or the refusal when nobody can be asked)."""

    METHOD: ClassVar[str] = "answered"
    ref: int = attrs.field(validator=_int)
    action: str = attrs.field(validator=_str)
    reason: str | None = attrs.field(default=None, validator=optional(_str))
    content: dict[str, Any] | None = attrs.field(default=None, validator=optional(_dict))


Down: TypeAlias = Spawn | Ping | Cancel | Inject | Admitted | Answered
Up: TypeAlias = Ready | Pong | Progress | Usage | Result | Failed | Admit | Release | MetricsDelta | Ask
Message: TypeAlias = Down | Up

_TYPES: dict[str, type[Any]] = {
    cls.METHOD: cls
    for cls in (Spawn, Ping, Cancel, Inject, Admitted, Ready, Pong, Progress, Usage, Result, Failed, Admit, Release,
                MetricsDelta, Ask, Answered)
}


#: Each message class's field names (and the run payload's), in ``attrs.asdict`` order.
_FIELDS: dict[type[Any], tuple[str, ...]] = {
    cls: tuple(field.name for field in attrs.fields(cls)) for cls in (*_TYPES.values(), RunPayload)
}


def to_frame(message: Message, *, deep: bool = False) -> dict[str, Any]:
    """The frame of ``message``. Its fields are taken as they are (the run payload's too), not copied by
    ``attrs.asdict``: the same JSON for JSON-shaped values, ~5x less work for a spawn's payload. ``deep``
    converts like ``attrs.asdict`` (an attrs value nested in a field), for a frame that JSON refused."""
    params = attrs.asdict(message, recurse=True) if deep else _fields_of(message)
    return {"jsonrpc": "2.0", "method": message.METHOD, "params": params}


def _fields_of(value: Any) -> dict[str, Any]:
    params = {}
    for name in _FIELDS[type(value)]:
        field = getattr(value, name)
        params[name] = _fields_of(field) if type(field) in _FIELDS else field
    return params


def from_frame(frame: dict[str, Any]) -> Message:
    method = frame.get("method")
    cls = _TYPES.get(method) if isinstance(method, str) else None
    if cls is None:
        raise MessageError(f"unknown control method {method!r}"[:120])
    params = frame.get("params", {})
    if not isinstance(params, dict):
        raise MessageError(f"{method}: params is not an object")
    try:
        if cls is Spawn:
            payload = params.get("payload")
            if not isinstance(payload, dict):
                raise MessageError("spawn: payload is not an object")
            return Spawn(_build(RunPayload, payload))
        return _build(cls, params)  # type: ignore[no-any-return]
    except (TypeError, ValueError) as exc:
        raise MessageError(f"{method}: {type(exc).__name__} in params") from None


def _build(cls: type[Any], params: dict[str, Any]) -> Any:
    names = {f.name for f in attrs.fields(cls)}
    return cls(**{k: v for k, v in params.items() if k in names})
