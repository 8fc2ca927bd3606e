"""A2A (Agent2Agent) values without I/O: Agent Cards, tasks, parts, and the JSON-RPC method names per version.

A2A 1.0 puts protobuf's JSON mapping on the wire (``supportedInterfaces``, ``TASK_STATE_COMPLETED``,
``ROLE_USER``, parts as ``{"text": …}``/``{"data": …}``/``{"url": …}``); 0.3 used ``kind``-tagged objects,
lower-case states and slash method names. Both are parsed here into the same frozen values, so the client and
the control tools never branch on the version, and built back with :func:`message_json`.

Everything a peer sends is untrusted: parsing is strict about the shape agentd relies on (a card names a
JSON-RPC interface; a task has an id and a state) and lenient about the rest. Bad input raises
:class:`A2aShapeError`, never a ``KeyError`` from deep inside.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

CARD_PATH: Final = "/.well-known/agent-card.json"
VERSION_HEADER: Final = "A2A-Version"
V1: Final = "1.0"
V03: Final = "0.3"

#: The JSON-RPC method of each operation, per protocol version (0.3 only where a card declares it).
METHODS: Final[Mapping[str, Mapping[str, str]]] = {
    V1: {
        "send": "SendMessage", "stream": "SendStreamingMessage", "get": "GetTask", "cancel": "CancelTask",
        "subscribe": "SubscribeToTask", "extended_card": "GetExtendedAgentCard",
    },
    V03: {
        "send": "message/send", "stream": "message/stream", "get": "tasks/get", "cancel": "tasks/cancel",
        "subscribe": "tasks/resubscribe", "extended_card": "agent/getAuthenticatedExtendedCard",
    },
}  # fmt: skip

# A2A error codes (JSON-RPC binding); the standard -326xx ones are in agentd.mcp.jsonrpc.
TASK_NOT_FOUND: Final = -32001
TASK_NOT_CANCELABLE: Final = -32002
PUSH_NOT_SUPPORTED: Final = -32003
UNSUPPORTED_OPERATION: Final = -32004
CONTENT_TYPE_NOT_SUPPORTED: Final = -32005
INVALID_AGENT_RESPONSE: Final = -32006
EXTENDED_CARD_NOT_CONFIGURED: Final = -32007
VERSION_NOT_SUPPORTED: Final = -32009

#: Normalised task states (1.0's ``TASK_STATE_X`` lower-cased; 0.3's ``input-required`` -> ``input_required``).
TERMINAL: Final = frozenset({"completed", "failed", "canceled", "rejected"})
INTERRUPTED: Final = frozenset({"input_required", "auth_required"})
STATES: Final = TERMINAL | INTERRUPTED | frozenset({"submitted", "working", "unspecified"})

#: Caps on what a peer's card may put in front of the model.
MAX_SKILLS: Final = 32
MAX_TEXT: Final = 400


class A2aShapeError(ValueError):
    """A peer's JSON does not have the shape A2A requires (a bad card, task or event)."""


@attrs.frozen
class Skill:
    id: str
    name: str
    description: str
    tags: tuple[str, ...] = ()


@attrs.frozen
class AgentCard:
    """The parts of a peer's Agent Card agentd uses. ``rpc_url``/``version`` are the chosen JSON-RPC interface."""

    name: str
    description: str
    rpc_url: str
    version: str
    streaming: bool
    skills: tuple[Skill, ...]
    agent_version: str = ""
    #: The card says an authenticated extended card is available (``GetExtendedAgentCard``).
    extended: bool = False


@attrs.frozen
class Part:
    """One part: ``kind`` is ``text``, ``data`` or ``file`` (a file by ``url`` or inline ``raw`` base64)."""

    kind: str
    text: str = ""
    data: Any = None
    url: str = ""
    raw_size: int = 0
    filename: str = ""
    media_type: str = ""


@attrs.frozen
class Artifact:
    artifact_id: str
    name: str
    parts: tuple[Part, ...]


@attrs.frozen
class Task:
    id: str
    context_id: str
    state: str
    #: The status message's parts (why it failed, what input is required).
    status_parts: tuple[Part, ...] = ()
    artifacts: tuple[Artifact, ...] = ()
    metadata: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def interrupted(self) -> bool:
        return self.state in INTERRUPTED


@attrs.frozen
class Message:
    """A direct reply (no task): the peer answered at once."""

    message_id: str
    context_id: str
    parts: tuple[Part, ...]
    task_id: str = ""


@attrs.frozen
class StatusUpdate:
    task_id: str
    context_id: str
    state: str
    status_parts: tuple[Part, ...] = ()


@attrs.frozen
class ArtifactUpdate:
    task_id: str
    context_id: str
    artifact: Artifact
    append: bool = False


Event = Task | Message | StatusUpdate | ArtifactUpdate


# -- parsing ------------------------------------------------------------------------------------------------


def _obj(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise A2aShapeError(f"{what} is not an object")
    return value


def _str(obj: Mapping[str, Any], key: str, what: str, *, required: bool = False) -> str:
    value = obj.get(key)
    if value is None:
        if required:
            raise A2aShapeError(f"{what} has no {key!r}")
        return ""
    if not isinstance(value, str):
        raise A2aShapeError(f"{what}.{key} is not a string")
    return value


def _list(obj: Mapping[str, Any], key: str, what: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise A2aShapeError(f"{what}.{key} is not a list")
    return value


def _clip(text: str, limit: int = MAX_TEXT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _same_origin(a: str, b: str) -> bool:
    pa, pb = urllib.parse.urlsplit(a), urllib.parse.urlsplit(b)
    return (pa.scheme.lower(), pa.hostname, pa.port or _port(pa.scheme)) == (
        pb.scheme.lower(), pb.hostname, pb.port or _port(pb.scheme),
    )  # fmt: skip


def _port(scheme: str) -> int:
    return 443 if scheme.lower() == "https" else 80


def parse_card(obj: Any, base_url: str) -> AgentCard:
    """Validate an Agent Card fetched from ``base_url`` and pick its JSON-RPC interface (1.0 before 0.3).

    The interface URL must be on the configured peer's origin: a card cannot send agentd's credentials to
    another host (endpoints are configuration, never peer-supplied text).
    """
    card = _obj(obj, "the agent card")
    name = _str(card, "name", "the agent card", required=True).strip()
    if not name:
        raise A2aShapeError("the agent card has an empty name")
    candidates: list[tuple[str, str]] = []  # (version, url)
    for raw in _list(card, "supportedInterfaces", "the agent card"):
        iface = _obj(raw, "an agent interface")
        binding = _str(iface, "protocolBinding", "an agent interface").upper()
        if binding == "JSONRPC":
            version = _str(iface, "protocolVersion", "an agent interface") or V1
            candidates.append((version, _str(iface, "url", "an agent interface", required=True)))
    if not candidates and isinstance(card.get("url"), str):  # a 0.3 card: url + preferredTransport
        if str(card.get("preferredTransport") or "JSONRPC").upper() == "JSONRPC":
            candidates.append((str(card.get("protocolVersion") or V03), card["url"]))
        for raw in _list(card, "additionalInterfaces", "the agent card"):
            iface = _obj(raw, "an agent interface")
            if _str(iface, "transport", "an agent interface").upper() == "JSONRPC":
                candidates.append((V03, _str(iface, "url", "an agent interface", required=True)))
    usable = [(_major(v), url) for v, url in candidates if _major(v) in (V1, V03)]
    if not usable:
        offered = (", ".join(sorted({v[:20] for v, _ in candidates})) or "none")[:200]  # a peer's strings, cut
        raise A2aShapeError(f"the agent card offers no JSON-RPC interface of protocol 1.0 or 0.3 (offered: {offered})")
    usable.sort(key=lambda item: item[0] != V1)
    version, url = usable[0]
    url = urllib.parse.urljoin(base_url, url)
    if not _same_origin(url, base_url):
        raise A2aShapeError("the agent card's JSON-RPC interface is on another origin than the configured peer")
    caps = card.get("capabilities")
    streaming = bool(isinstance(caps, Mapping) and caps.get("streaming") is True)
    extended = bool(isinstance(caps, Mapping) and caps.get("extendedAgentCard") is True) or (
        card.get("supportsAuthenticatedExtendedCard") is True  # 0.3
    )
    skills: list[Skill] = []
    for raw in _list(card, "skills", "the agent card")[:MAX_SKILLS]:
        skill = _obj(raw, "a skill")
        tags = tuple(_clip(t, 40) for t in _list(skill, "tags", "a skill")[:8] if isinstance(t, str))
        skills.append(Skill(
            _clip(_str(skill, "id", "a skill"), 64), _clip(_str(skill, "name", "a skill"), 80),
            _clip(_str(skill, "description", "a skill")), tags,
        ))  # fmt: skip
    return AgentCard(
        name=_clip(name, 80), description=_clip(_str(card, "description", "the agent card")), rpc_url=url,
        version=version, streaming=streaming, skills=tuple(skills),
        agent_version=_clip(_str(card, "version", "the agent card"), 40), extended=extended,
    )  # fmt: skip


def _major(version: str) -> str:
    parts = version.strip().split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else version.strip()


def _state(value: Any) -> str:
    if not isinstance(value, str):
        raise A2aShapeError("a task state is not a string")
    state = value.removeprefix("TASK_STATE_").lower().replace("-", "_")
    if state == "unknown":
        state = "unspecified"
    if state not in STATES:
        raise A2aShapeError(f"unknown task state {value[:40]!r}")
    return state


def parse_part(raw: Any) -> Part:
    obj = _obj(raw, "a part")
    if "text" in obj:
        return Part("text", text=_str(obj, "text", "a part"))
    if "data" in obj:
        return Part("data", data=obj["data"])
    if "url" in obj or "raw" in obj:  # 1.0
        raw_b64 = obj.get("raw")
        return Part(
            "file", url=_str(obj, "url", "a part"), raw_size=len(raw_b64) * 3 // 4 if isinstance(raw_b64, str) else 0,
            filename=_str(obj, "filename", "a part"), media_type=_str(obj, "mediaType", "a part"),
        )  # fmt: skip
    if "file" in obj:  # 0.3
        file = _obj(obj["file"], "a file part")
        inline = file.get("bytes")
        return Part(
            "file", url=_str(file, "uri", "a file part"), raw_size=len(inline) * 3 // 4 if isinstance(inline, str) else 0,
            filename=_str(file, "name", "a file part"), media_type=_str(file, "mimeType", "a file part"),
        )  # fmt: skip
    raise A2aShapeError("a part has none of text, data, url, raw or file")


def _parts(obj: Mapping[str, Any], what: str) -> tuple[Part, ...]:
    return tuple(parse_part(p) for p in _list(obj, "parts", what))


def parse_artifact(raw: Any) -> Artifact:
    obj = _obj(raw, "an artifact")
    return Artifact(_str(obj, "artifactId", "an artifact"), _str(obj, "name", "an artifact"), _parts(obj, "an artifact"))


def _status(obj: Mapping[str, Any], what: str) -> tuple[str, tuple[Part, ...]]:
    status = _obj(obj.get("status"), f"{what}.status")
    message = status.get("message")
    parts = _parts(_obj(message, "a status message"), "a status message") if message is not None else ()
    return _state(status.get("state")), parts


def parse_task(raw: Any) -> Task:
    obj = _obj(raw, "a task")
    state, parts = _status(obj, "a task")
    metadata = obj.get("metadata")
    return Task(
        id=_str(obj, "id", "a task", required=True), context_id=_str(obj, "contextId", "a task"), state=state,
        status_parts=parts, artifacts=tuple(parse_artifact(a) for a in _list(obj, "artifacts", "a task")),
        metadata=dict(metadata) if isinstance(metadata, Mapping) else {},
    )  # fmt: skip


def parse_message(raw: Any) -> Message:
    obj = _obj(raw, "a message")
    return Message(
        _str(obj, "messageId", "a message"), _str(obj, "contextId", "a message"), _parts(obj, "a message"),
        _str(obj, "taskId", "a message"),
    )  # fmt: skip


def parse_result(raw: Any) -> Task | Message:
    """The result of SendMessage (1.0: ``{"task"|"message": …}``; 0.3: a ``kind``-tagged task or message)."""
    obj = _obj(raw, "the result")
    if "task" in obj:
        return parse_task(obj["task"])
    if "message" in obj:
        return parse_message(obj["message"])
    if obj.get("kind") == "task":
        return parse_task(obj)
    if obj.get("kind") == "message":
        return parse_message(obj)
    raise A2aShapeError("the result is neither a task nor a message")


def parse_event(raw: Any) -> Event:
    """One streamed event (1.0: ``task``/``message``/``statusUpdate``/``artifactUpdate``; 0.3: ``kind``-tagged)."""
    obj = _obj(raw, "a stream event")
    kind = obj.get("kind")
    if "statusUpdate" in obj or kind == "status-update":
        body = _obj(obj.get("statusUpdate", obj), "a status update")
        state, parts = _status(body, "a status update")
        return StatusUpdate(
            _str(body, "taskId", "a status update"), _str(body, "contextId", "a status update"), state, parts
        )
    if "artifactUpdate" in obj or kind == "artifact-update":
        body = _obj(obj.get("artifactUpdate", obj), "an artifact update")
        return ArtifactUpdate(
            _str(body, "taskId", "an artifact update"), _str(body, "contextId", "an artifact update"),
            parse_artifact(body.get("artifact")), body.get("append") is True,
        )  # fmt: skip
    return parse_result(obj)


def parse_task_result(raw: Any) -> Task:
    """GetTask/CancelTask results: the task itself (both versions)."""
    obj = _obj(raw, "the result")
    return parse_task(obj["task"] if "task" in obj and "id" not in obj else obj)


# -- building -----------------------------------------------------------------------------------------------


def message_json(
    version: str, message_id: str, text: str, *, context_id: str | None = None, task_id: str | None = None
) -> dict[str, Any]:
    """A user message with one text part, in the wire form of ``version``."""
    if version == V03:
        message: dict[str, Any] = {
            "kind": "message", "messageId": message_id, "role": "user", "parts": [{"kind": "text", "text": text}],
        }  # fmt: skip
    else:
        message = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}
    if context_id:
        message["contextId"] = context_id
    if task_id:
        message["taskId"] = task_id
    return message


def send_params(version: str, message: Mapping[str, Any], *, return_immediately: bool) -> dict[str, Any]:
    if version == V03:
        return {"message": dict(message), "configuration": {"blocking": not return_immediately}}
    return {"message": dict(message), "configuration": {"returnImmediately": return_immediately}}


def task_params(task_id: str) -> dict[str, Any]:
    return {"id": task_id}


# -- observations -------------------------------------------------------------------------------------------


def render_parts(parts: Sequence[Part]) -> list[str]:
    """Text parts as text, data parts as JSON, files by reference (never fetched)."""
    out: list[str] = []
    for part in parts:
        if part.kind == "text":
            out.append(part.text)
        elif part.kind == "data":
            out.append(json.dumps(part.data, ensure_ascii=False, sort_keys=True))
        else:
            label = part.filename or "file"
            kind = f" ({part.media_type})" if part.media_type else ""
            where = f" at {part.url}" if part.url else f", {part.raw_size} bytes inline (not shown)"
            out.append(f"[file {label}{kind}{where}; not fetched]")
    return out


def render_outcome(result: Task | Message) -> str:
    """What the model reads: the task's state and context, then its artifacts' parts (or the reply's)."""
    if isinstance(result, Message):
        head = f"[reply; context_id={result.context_id}]" if result.context_id else "[reply]"
        return "\n".join([head, *render_parts(result.parts)])
    lines = [f"[task {result.id}: {result.state}; context_id={result.context_id}]"]
    if result.status_parts:
        lines.extend(render_parts(result.status_parts))
    for artifact in result.artifacts:
        if artifact.name:
            lines.append(f"## {artifact.name}")
        lines.extend(render_parts(artifact.parts))
    return "\n".join(lines)


def reported_usage(task: Task) -> dict[str, int]:
    """Token counts a peer reports in the task's metadata (``usage`` with integer counts), else empty."""
    usage = task.metadata.get("usage")
    if not isinstance(usage, Mapping):
        return {}
    return {str(k): v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}
