"""The Chat Completions wire: request bodies, reply parsing and stream assembly. No I/O here.

Gateways differ in small ways (content as a list of parts, usage under other names, arguments sent as an
object), so parsing is lenient about shape variations that carry the same meaning and strict about what
the loop depends on: a reply must have a first choice with a message, every tool call needs a name.
Anything else is a :class:`MalformedReply`, which the client turns into an ``IntelligenceError``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from agentd.formats import jsontext as json_text

#: The output-token cap sent with every request (the original agentd's default).
MAX_OUTPUT_TOKENS: Final = 4096

#: Reasoning families (besides ``gpt-5*``) that reject ``max_tokens`` and demand ``max_completion_tokens``.
_COMPLETION_TOKENS_FAMILIES: Final = ("o1", "o3", "o4")


class MalformedReply(ValueError):
    """The gateway answered 2xx with something that is not a usable Chat Completions reply.

    The message describes the structural problem only, never the body (which may echo prompts).
    """


@attrs.frozen
class Usage:
    """Tokens one reply consumed; ``+`` accumulates them over a run. ``estimated_tokens`` of them are an
    estimate (a reply cut before the gateway reported its usage: agentd.intelligence.tally). ``cost`` is what
    they cost in picodollars (agentd.prices), set by the loop when the run is priced (the gateway never does)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated_tokens: int = 0
    cost: int | None = None

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens,
            self.estimated_tokens + other.estimated_tokens,
            self.cost if other.cost is None else (self.cost or 0) + other.cost,
        )


@attrs.frozen
class ToolCall:
    """One tool call the model asked for. ``name`` is the wire name; ``arguments`` the model's raw JSON text."""

    id: str
    name: str
    arguments: str


@attrs.frozen
class ChatTool:
    """A tool offered to the model; ``parameters`` is the JSON Schema (an MCP tool's ``inputSchema``)."""

    name: str
    description: str
    parameters: dict[str, Any]


@attrs.frozen
class ModelReply:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    finish_reason: str | None = None


def uses_max_completion_tokens(model: str) -> bool:
    """True for the families that reject ``max_tokens`` (``gpt-5*``, ``o1``, ``o3``, ``o4``).

    A provider prefix (``openai/o3-mini``) is ignored.
    """
    family = model.rsplit("/", 1)[-1].lower()
    if family.startswith("gpt-5"):
        return True
    return any(family == prefix or family.startswith(prefix + "-") for prefix in _COMPLETION_TOKENS_FAMILIES)


def tool_definition(tool: ChatTool) -> dict[str, Any]:
    parameters = tool.parameters if tool.parameters else {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": parameters},
    }


def request_body(
    model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[ChatTool], *, stream: bool
) -> dict[str, Any]:
    """The JSON body of one ``POST …/chat/completions``."""
    body: dict[str, Any] = {"model": model, "messages": list(messages)}
    if tools:
        body["tools"] = [tool_definition(tool) for tool in tools]
    body.update(_options(model, bool(tools), stream))
    return body


def _options(model: str, has_tools: bool, stream: bool) -> dict[str, Any]:
    """The request fields after ``tools``, in wire order."""
    options: dict[str, Any] = {"tool_choice": "auto"} if has_tools else {}
    cap_key = "max_completion_tokens" if uses_max_completion_tokens(model) else "max_tokens"
    options[cap_key] = MAX_OUTPUT_TOKENS
    if stream:
        options["stream"] = True
        options["stream_options"] = {"include_usage": True}
    return options


def encode_request(
    model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[ChatTool], *, stream: bool
) -> bytes:
    """:func:`request_body` serialised (compact, UTF-8), byte for byte ``json.dumps`` of it.

    The ``tools`` array is most of a short request (every schema) and the same on every step and every
    wake until the catalogue changes, so its JSON text is reused (:func:`tools_json`); only the
    messages and a few scalars are encoded per call.
    """
    head = _compact({"model": model, "messages": list(messages)})
    parts = [head[:-1]]
    if tools:
        parts.append(',"tools":' + tools_json(tools))
    parts.append("," + _compact(_options(model, bool(tools), stream))[1:])
    return json_text.utf8("".join(parts))


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


#: JSON text of a ``tools`` array, by each tool's name, description and the identity of its schema
#: object (held in the value, so an id cannot be reused while cached). Schemas are never mutated once
#: offered: the loop's catalogue hands out one prepared copy per schema (agentd.agent.catalogue).
_TOOLS_JSON: dict[tuple[tuple[str, str, int], ...], tuple[tuple[ChatTool, ...], str]] = {}
_TOOLS_JSON_MAX = 64
#: The last tuple of tools encoded and its text (held): a catalogue hands out one tuple until it changes.
_LAST_TOOLS: list[tuple[tuple[ChatTool, ...], str] | None] = [None]


def tools_json(tools: Sequence[ChatTool]) -> str:
    """The ``tools`` array of a request as compact JSON, encoded once per distinct catalogue."""
    last = _LAST_TOOLS[0]
    if last is not None and last[0] is tools:  # the same catalogue's tuple again (every wake of a daemon)
        return last[1]
    key = tuple((t.name, t.description, id(t.parameters)) for t in tools)
    cached = _TOOLS_JSON.get(key)
    if cached is None:
        cached = (tuple(tools), _compact([tool_definition(tool) for tool in tools]))
        if len(_TOOLS_JSON) >= _TOOLS_JSON_MAX:
            _TOOLS_JSON.clear()
        _TOOLS_JSON[key] = cached
    if isinstance(tools, tuple):  # immutable: the same object is the same tools
        _LAST_TOOLS[0] = (tools, cached[1])
    return cached[1]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_usage(raw: Any) -> Usage:
    """Usage from a reply; absent or odd fields count as 0 (``input_tokens``/``output_tokens`` accepted)."""
    if not isinstance(raw, Mapping):
        return Usage()
    prompt = raw.get("prompt_tokens", raw.get("input_tokens"))
    completion = raw.get("completion_tokens", raw.get("output_tokens"))
    return Usage(_int(prompt), _int(completion))


def _text(content: Any) -> str | None:
    """Message content as text: a string, or the ``text`` parts of a list of parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        ]
        return "".join(parts)
    raise MalformedReply("message content is neither text nor a list of parts")


def _arguments(raw: Any) -> str:
    if raw is None or raw == "":
        # Models often send nothing for a tool without parameters; "{}" is what they mean.
        return "{}"
    if isinstance(raw, str):
        return raw
    if isinstance(raw, Mapping):
        return json.dumps(raw, separators=(",", ":"))
    raise MalformedReply("tool call arguments are neither JSON text nor an object")


def _tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MalformedReply("message.tool_calls is not a list")
    calls: list[ToolCall] = []
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping) or not isinstance(item.get("function"), Mapping):
            raise MalformedReply(f"tool call {index} has no function object")
        function = item["function"]
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise MalformedReply(f"tool call {index} has no function name")
        call_id = item.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{index}"
        calls.append(ToolCall(call_id, name, _arguments(function.get("arguments"))))
    return tuple(calls)


def parse_completion(body: Any) -> ModelReply:
    """A non-streaming reply (already JSON-decoded) as a :class:`ModelReply`."""
    if not isinstance(body, Mapping):
        raise MalformedReply("the reply is not a JSON object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedReply("the reply has no choices")
    choice = choices[0]
    if not isinstance(choice, Mapping) or not isinstance(choice.get("message"), Mapping):
        raise MalformedReply("the first choice has no message")
    message = choice["message"]
    finish = choice.get("finish_reason")
    content = _text(message.get("content"))
    if content is None and isinstance(message.get("refusal"), str):
        content = message["refusal"]  # a safety refusal is the model's answer, not an empty one
    return ModelReply(
        content=content,
        tool_calls=_tool_calls(message.get("tool_calls")),
        usage=parse_usage(body.get("usage")),
        finish_reason=finish if isinstance(finish, str) else None,
    )


class _PartialCall:
    __slots__ = ("arguments", "id", "name")

    def __init__(self, id: str = "", name: str = "", arguments: list[str] | None = None) -> None:
        self.id = id
        self.name = name
        self.arguments: list[str] = [] if arguments is None else arguments


class StreamAssembler:
    """Folds ``chat.completion.chunk`` objects into one :class:`ModelReply`.

    Content and tool-call argument fragments are concatenated; tool calls are keyed by their ``index``;
    the usage chunk (``choices: []``, requested with ``stream_options.include_usage``) may come last.
    (Plain classes, like the other mutable holders a once run builds at start-up.)
    """

    __slots__ = ("_calls", "_content", "_finish", "_usage", "chunks", "reported", "streamed_chars")

    def __init__(self) -> None:
        self._content: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._usage = Usage()
        self._finish: str | None = None
        self.chunks = 0
        #: Characters of text, tool names and arguments streamed so far (a cut reply's estimate).
        self.streamed_chars = 0
        #: The latest usage the stream reported (None: none yet).
        self.reported: Usage | None = None

    def feed(self, chunk: Any) -> None:
        if not isinstance(chunk, Mapping):
            raise MalformedReply("a stream chunk is not a JSON object")
        self.chunks += 1
        if chunk.get("usage") is not None:
            self._usage = self.reported = parse_usage(chunk["usage"])
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise MalformedReply("a stream chunk's choices is not a list")
        for choice in choices:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            if isinstance(choice.get("finish_reason"), str):
                self._finish = choice["finish_reason"]
            delta = choice.get("delta") or {}
            if not isinstance(delta, Mapping):
                raise MalformedReply("a stream chunk's delta is not an object")
            text = _text(delta.get("content"))
            if text:
                self._content.append(text)
                self.streamed_chars += len(text)
            for position, fragment in enumerate(delta.get("tool_calls") or []):
                self._tool_fragment(position, fragment)

    def text_since(self, start: int) -> tuple[str, int]:
        """The reply text fed since piece ``start`` and the index to ask from next time (a live view)."""
        return "".join(self._content[start:]), len(self._content)

    def _tool_fragment(self, position: int, fragment: Any) -> None:
        if not isinstance(fragment, Mapping):
            raise MalformedReply("a streamed tool call fragment is not an object")
        index = fragment.get("index", position)
        if not isinstance(index, int):
            raise MalformedReply("a streamed tool call fragment has no integer index")
        partial = self._calls.setdefault(index, _PartialCall())
        if isinstance(fragment.get("id"), str) and fragment["id"]:
            partial.id = fragment["id"]
        function = fragment.get("function") or {}
        if isinstance(function, Mapping):
            name = function.get("name")
            # OpenAI sends the name once; some servers repeat it in every fragment. Never double it.
            if isinstance(name, str) and name and name != partial.name:
                partial.name += name
                self.streamed_chars += len(name)
            arguments = function.get("arguments")
            if isinstance(arguments, Mapping):
                arguments = json.dumps(arguments, separators=(",", ":"))
            if isinstance(arguments, str):
                partial.arguments.append(arguments)
                self.streamed_chars += len(arguments)

    def reply(self) -> ModelReply:
        if self.chunks == 0:
            raise MalformedReply("the stream ended without any chunk")
        calls: list[ToolCall] = []
        for index in sorted(self._calls):
            partial = self._calls[index]
            if not partial.name:
                raise MalformedReply(f"streamed tool call {index} has no function name")
            calls.append(
                ToolCall(partial.id or f"call_{index}", partial.name, _arguments("".join(partial.arguments)))
            )
        return ModelReply(
            # Streams open with ``content: ""`` even for pure tool-call replies; empty means none.
            content="".join(self._content) or None,
            tool_calls=tuple(calls),
            usage=self._usage,
            finish_reason=self._finish,
        )
