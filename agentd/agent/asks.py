"""What a run answers when a server it calls asks the client something: elicitation and sampling.

agentd declares no client capabilities by default (``capabilities: {}``, both requests refused with -32601: the
smallest injection surface). A host opts one server in (``--mcp-capabilities NAME=elicitation,sampling``,
``mcp_servers[].capabilities``); then a request that arrives during one of this run's tool calls to that server
is answered here (the MCP client finds :class:`ServerAsks` through agentd.oversight.approvals.current_answerer):

- ``elicitation/create`` (a form: ``message`` and ``requestedSchema``) is queued for a person like an approval
  (``agentd ctl approvals`` shows it, ``agentd ctl answer ID JSON`` answers it, checked against the schema).
  A subagent's queue forwards it up the tree to the root's (agentd.supervisor.asks). Where nobody can be asked
  (a once run with no state directory and no control socket) it is declined at once, so the tool call goes on
  and nothing hangs. A URL-mode request is
  declined: agentd opens no browser. With a journal the question is committed before the wait
  (``elicitation.pending``) and its settling after (``elicitation.decided``, an answer's values included), before
  the server is answered: after a crash the server's request is gone, and the resumed run records the question
  ``cancel`` (agentd.run) while its call is settled like any call whose outcome was lost.
- ``sampling/createMessage`` is one chat request through the run's own gateway and model (the server's system
  prompt and messages), counted in the run's usage and budgets like the run's own model calls; refused once
  the run's token budget is spent. No tool is offered to it unless the server asks and the host allows it: the
  request carries ``tools`` (sampling with tools, 2025-11-25) and the server is opted in to ``sampling.tools``.
  Then the server's tools (never agentd's own, never another server's) are offered to the model, and a call the
  model asks for comes back as ``tool_use`` content (``stopReason: toolUse``) for the *server* to run; its
  ``tool_result`` arrives in the server's next request. ``tools`` from a server not opted in is refused
  (-32602: it did not get the capability), ``toolChoice: none`` offers none.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

import trio

from agentd.agent.ports import Intelligence
from agentd.errors import IntelligenceError
from agentd.intelligence.wire import ChatTool, Usage
from agentd.mcp import jsonrpc
from agentd.oversight.approvals import Refused, current_approvals
from agentd.oversight.drain import current_drain
from agentd.telemetry.events import EventLog

#: The longest question text kept from a server.
MAX_MESSAGE: Final = 4000
#: Why an elicitation is declined without asking.
NOBODY: Final = "nobody can be asked here (run agentd with --state-dir or --ctl-socket)"
#: Why a question was withdrawn while agentd stops.
DRAINING: Final = "agentd is draining"
#: Why a resumed run records a question that waited when its process stopped (agentd.run).
LOST: Final = ("the process that held this question stopped before it was answered; the server's request ended "
               "with it")
#: The most messages one sampling request may carry.
MAX_SAMPLING_MESSAGES: Final = 200
#: The most tools one sampling request may offer.
MAX_SAMPLING_TOOLS: Final = 64
#: What a tool's name becomes on the gateway's wire (OpenAI-compatible function names).
_WIRE_NAME: Final = re.compile(r"[^A-Za-z0-9_-]")

#: Counts a sampling reply's usage in the run (its meter and the tree's ceiling).
Count = Callable[[Usage], Awaitable[None]]


class AskJournal(Protocol):
    """The run's journal, as far as questions go (agentd.journal.recorder.RunRecorder)."""

    async def elicitation_pending(self, step: int, call_id: str, server: str, message: str,
                                  schema: Mapping[str, Any]) -> None: ...

    async def elicitation_decided(self, step: int, call_id: str, action: str, content: Mapping[str, Any] | None,
                                  reason: str | None = None) -> None: ...


class ServerAsks:
    """One run's answers to its servers' requests (see the module docstring). (A plain class: one per run.)"""

    __slots__ = ("call_id", "count", "intel", "journal", "log", "run_id", "sampling_tools", "spent", "step")

    def __init__(self, run_id: str, log: EventLog, intel: Intelligence, count: Count,
                 spent: Callable[[], bool], *, journal: AskJournal | None = None, step: int = 0,
                 call_id: str = "", sampling_tools: bool = False) -> None:
        self.run_id = run_id
        self.log = log
        self.intel = intel
        self.count = count
        self.spent = spent
        #: The run's journal (``--state-dir``), and the tool call the questions belong to.
        self.journal = journal
        self.step = step
        self.call_id = call_id
        #: The host opted the server in to ``sampling.tools``: a sampling request's own tools may be offered.
        self.sampling_tools = sampling_tools

    async def __call__(self, server: str, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        if method == "elicitation/create":
            return await self.elicit(server, params)
        if method == "sampling/createMessage":
            return await self.sample(server, params)
        raise Refused(jsonrpc.METHOD_NOT_FOUND, f"method not found: {method[:64]}")

    async def elicit(self, server: str, params: Mapping[str, Any]) -> dict[str, Any]:
        message = str(params.get("message") or "")[:MAX_MESSAGE]
        schema = params.get("requestedSchema")
        fields = {"server": server}
        if params.get("mode", "form") != "form" or not isinstance(schema, dict):
            self.log.warn("elicitation.decided", **fields, action="decline", waited_s=0.0,
                          reason="only form requests (message and requestedSchema) are answered")
            return {"action": "decline"}
        queue = current_approvals()
        if queue is None:
            self.log.warn("elicitation.decided", **fields, action="decline", waited_s=0.0, reason=NOBODY)
            return {"action": "decline"}
        if self.journal is not None:
            await self.journal.elicitation_pending(self.step, self.call_id, server, message, schema)
        item = queue.elicitation(self.run_id, server, message, schema)
        properties = schema.get("properties")
        self.log.warn("elicitation.pending", id=item.id, **fields, message=self.log.content(message),
                      fields=[str(k)[:64] for k in list(properties)[:32]] if isinstance(properties, dict) else [])
        decision = await queue.wait(item, current_drain())
        if decision is None:  # the process is stopping: the question is withdrawn
            self.log.info("elicitation.decided", id=item.id, **fields, action="cancel", waited_s=0.0,
                          reason=DRAINING)
            await self.record("cancel", None, DRAINING)
            return {"action": "cancel"}
        self.log.info("elicitation.decided", id=item.id, **fields, action=decision.action,
                      waited_s=round(time.time() - item.created, 3))
        if decision.action == "accept":
            content = dict(decision.content or {})
            await self.record("accept", content, None)
            return {"action": "accept", "content": content}
        await self.record(decision.action, None, decision.reason)
        return {"action": decision.action}

    async def record(self, action: str, content: Mapping[str, Any] | None, reason: str | None) -> None:
        """Journal how the question was settled, before the server is told (shielded: the answer is sent next,
        and a cancel that interrupts the write must not leave it unrecorded)."""
        if self.journal is not None:
            with trio.CancelScope(shield=True):
                await self.journal.elicitation_decided(self.step, self.call_id, action, content, reason)

    async def sample(self, server: str, params: Mapping[str, Any]) -> dict[str, Any]:
        messages = params.get("messages")
        if not isinstance(messages, list) or not messages or len(messages) > MAX_SAMPLING_MESSAGES:
            raise Refused(jsonrpc.INVALID_PARAMS, f"messages must be a list of 1 to {MAX_SAMPLING_MESSAGES} messages")
        offered: tuple[ChatTool, ...] = ()
        names: dict[str, str] = {}  # wire name -> the server's tool name
        if params.get("tools") is not None:
            if not self.sampling_tools:
                raise Refused(jsonrpc.INVALID_PARAMS, "tools in a sampling request need the sampling.tools client "
                                                      "capability, which agentd did not declare to this server")
            offered, names = _sampling_tools(params.get("tools"))
            choice = params.get("toolChoice")
            if isinstance(choice, dict) and choice.get("mode") == "none":
                offered = ()
        chat: list[dict[str, Any]] = []
        system = params.get("systemPrompt")
        if isinstance(system, str) and system.strip():
            chat.append({"role": "system", "content": system})
        wire = {tool: name for name, tool in names.items()}
        for item in messages:
            if not isinstance(item, dict) or item.get("role") not in ("user", "assistant"):
                raise Refused(jsonrpc.INVALID_PARAMS, "each message needs a role of user or assistant")
            chat.extend(_chat_messages(item["role"], item.get("content"), wire))
        fields: dict[str, Any] = {"server": server, "messages": len(chat), "max_tokens": params.get("maxTokens"),
                                  "tools": len(offered)}
        if self.spent():
            self.log.warn("sampling.request", **fields, outcome="refused", prompt_tokens=0, completion_tokens=0,
                          error="the run's token budget is spent")
            raise Refused(jsonrpc.INTERNAL_ERROR, "the client's token budget for this run is spent")
        try:
            reply = await self.intel.complete(chat, offered)
        except IntelligenceError as exc:
            self.log.warn("sampling.request", **fields, outcome="failed", prompt_tokens=0, completion_tokens=0,
                          error=str(exc))
            raise Refused(jsonrpc.INTERNAL_ERROR, "the client's model call failed") from None
        await self.count(reply.usage)
        uses = [{"type": "tool_use", "id": call.id, "name": names[call.name], "input": _input(call.arguments)}
                for call in reply.tool_calls if call.name in names] if offered else []
        self.log.info("sampling.request", **fields, outcome="ok", prompt_tokens=reply.usage.prompt_tokens,
                      completion_tokens=reply.usage.completion_tokens, tool_uses=len(uses))
        model = str(getattr(self.intel, "model", ""))
        if uses:  # the model asks for the server's tools: the server runs them (the content is a list)
            text = [{"type": "text", "text": reply.content}] if reply.content else []
            return {"role": "assistant", "content": [*text, *uses], "model": model, "stopReason": "toolUse"}
        return {"role": "assistant", "content": {"type": "text", "text": reply.content or ""}, "model": model,
                "stopReason": "maxTokens" if reply.finish_reason == "length" else "endTurn"}


def _sampling_tools(tools: Any) -> tuple[tuple[ChatTool, ...], dict[str, str]]:
    """A sampling request's ``tools`` as the gateway's tools, and their wire names back to the server's names."""
    if not isinstance(tools, list) or len(tools) > MAX_SAMPLING_TOOLS:
        raise Refused(jsonrpc.INVALID_PARAMS, f"tools must be a list of at most {MAX_SAMPLING_TOOLS} tools")
    offered: list[ChatTool] = []
    names: dict[str, str] = {}
    for tool in tools:
        name = tool.get("name") if isinstance(tool, dict) else None
        schema = tool.get("inputSchema") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not name or not isinstance(schema, dict):
            raise Refused(jsonrpc.INVALID_PARAMS, "each tool needs a name and an inputSchema object")
        wire = _WIRE_NAME.sub("_", name)[:64]
        while wire in names:
            wire = f"{wire[:60]}_{len(names)}"
        names[wire] = name
        offered.append(ChatTool(wire, str(tool.get("description") or "")[:MAX_MESSAGE], schema))
    return tuple(offered), names


def _chat_messages(role: str, content: Any, wire: Mapping[str, str]) -> list[dict[str, Any]]:
    """One sampling message as chat messages: an assistant's ``tool_use`` blocks become its tool calls, a user's
    ``tool_result`` blocks tool messages (before the rest of its text)."""
    blocks = content if isinstance(content, list) else [content]
    uses = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
    rest = [b for b in blocks if not (isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result"))]
    out: list[dict[str, Any]] = []
    if role == "assistant" and uses:
        calls = [{"id": str(b.get("id")), "type": "function",
                  "function": {"name": wire.get(str(b.get("name")), _WIRE_NAME.sub("_", str(b.get("name")))[:64]),
                               "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)}} for b in uses]
        out.append({"role": "assistant", "content": _text(rest) if rest else None, "tool_calls": calls})
        return out
    for block in results:
        out.append({"role": "tool", "tool_call_id": str(block.get("toolUseId")), "content": _text(block.get("content"))})
    if rest or not results:
        out.append({"role": role, "content": _text(rest)})
    return out


def _input(arguments: str) -> dict[str, Any]:
    """The model's arguments text as a ``tool_use`` block's ``input`` (not an object: under ``arguments``)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def _text(content: Any) -> str:
    """A sampling message's content (one block or a list of them) as chat text: text verbatim, media labelled."""
    blocks = content if isinstance(content, list) else [content]
    parts: list[str] = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") in ("image", "audio"):
            parts.append(f"[{block['type']}: {block.get('mimeType', 'unknown type')}, not shown]")
        else:
            parts.append(json.dumps(block, ensure_ascii=False, default=str)[:MAX_MESSAGE])
    return "\n".join(parts)


__all__ = ["DRAINING", "LOST", "MAX_MESSAGE", "NOBODY", "AskJournal", "Count", "ServerAsks"]
