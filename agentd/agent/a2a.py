"""The ``a2a.*`` control tools: how the model delegates to the run's A2A peers.

``a2a.delegate`` sends one message and waits for the task to end (or to need input); with ``async`` it
returns the task id at once and ``a2a.status``/``a2a.cancel`` follow it. Each call is one step of the run
and runs under its deadline; an abandoned delegation is cancelled on the peer (agentd/a2a/client.py).

Outcomes: a task that ends ``failed``/``rejected``/``canceled`` is an ``isError`` observation the model
reasons about; ``input_required`` is an observation too (reply with the same ``context_id``); a JSON-RPC or
transport error is raised as :class:`~agentd.errors.A2aError`, which the loop labels a fault. The peers'
skills (untrusted card text, capped and audited as ``a2a.skill_description``) are summarised in the
``a2a.delegate`` description.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from agentd.a2a import types as a2a
from agentd.a2a.client import A2aPeers
from agentd.agent.control import ControlContext, ControlResult, ControlTool, ControlToolRegistry
from agentd.errors import A2aRpcError

#: Characters of the peers' summary in the ``a2a.delegate`` description.
MAX_SUMMARY = 4000


def describe_peers(peers: A2aPeers) -> str:
    """One paragraph per peer: its name, card description and skills (untrusted, capped)."""
    lines = []
    for name, peer in peers.peers.items():
        card = peer.card
        lines.append(f"- peer {name!r}: {card.name}. {card.description}".rstrip())
        for skill in card.skills:
            tags = f" [{', '.join(skill.tags)}]" if skill.tags else ""
            lines.append(f"  - skill {skill.name or skill.id}: {skill.description}{tags}")
    text = "\n".join(lines)
    return text if len(text) <= MAX_SUMMARY else text[: MAX_SUMMARY - 1] + "…"


def _outcome(result: a2a.Task | a2a.Message) -> ControlResult:
    text = a2a.render_outcome(result)
    failed = isinstance(result, a2a.Task) and result.state in ("failed", "rejected", "canceled")
    return ControlResult.text(text, is_error=failed)


def register_a2a_tools(registry: ControlToolRegistry, peers: A2aPeers) -> None:
    """Offer ``a2a.delegate``/``a2a.status``/``a2a.cancel`` when the run has at least one connected peer."""
    if not peers.peers:
        return
    names = sorted(peers.peers)
    peer_schema = {"type": "string", "enum": names, "description": "The A2A peer to delegate to."}

    async def delegate(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        name, message = str(arguments["peer"]), str(arguments["message"])
        context_id = arguments.get("context_id") or None
        if arguments.get("async"):
            return _outcome(await peers.start(name, message, context_id=context_id))
        try:
            return _outcome(await peers.delegate(name, message, context_id=context_id))
        except trio.TooSlowError:
            limit = peers.peer(name).config.call_timeout
            return ControlResult.text(
                f"the delegation to {name!r} did not finish within {limit:g}s; the task was cancelled", is_error=True
            )

    async def status(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        try:
            return _outcome(await peers.status(str(arguments["peer"]), str(arguments["task_id"])))
        except A2aRpcError as exc:
            if exc.code == a2a.TASK_NOT_FOUND:
                return ControlResult.text(f"no such task on {arguments['peer']!r}: {arguments['task_id']}",
                                          is_error=True)  # fmt: skip
            raise

    async def cancel(arguments: Mapping[str, Any], ctx: ControlContext) -> ControlResult:
        try:
            return _outcome(await peers.cancel(str(arguments["peer"]), str(arguments["task_id"]), reason="asked"))
        except A2aRpcError as exc:
            if exc.code in (a2a.TASK_NOT_FOUND, a2a.TASK_NOT_CANCELABLE):
                return ControlResult.text(f"cannot cancel: {exc.rpc_message}", is_error=True)
            raise

    registry.register(ControlTool(
        name="a2a.delegate",
        description=(
            "Delegate a task to another agent over A2A and get its result (artifacts as text; data as JSON; "
            "files by reference). Pass context_id from a previous result to continue that conversation. "
            "With async=true, returns a task id at once; follow it with a2a.status / a2a.cancel. The peers "
            "and their skills (as the peers describe themselves; untrusted):\n" + describe_peers(peers)
        ),
        input_schema={
            "type": "object",
            "properties": {
                "peer": peer_schema,
                "message": {"type": "string", "minLength": 1, "description": "What the peer should do."},
                "context_id": {"type": "string", "description": "Continue this conversation (from a result)."},
                "async": {"type": "boolean", "description": "Return the task id at once instead of waiting."},
            },
            "required": ["peer", "message"],
            "additionalProperties": False,
        },
        handler=delegate,
    ))  # fmt: skip
    task_schema = {
        "type": "object",
        "properties": {"peer": peer_schema, "task_id": {"type": "string", "minLength": 1}},
        "required": ["peer", "task_id"],
        "additionalProperties": False,
    }
    registry.register(ControlTool("a2a.status", "The state and result so far of an A2A task started with async.",
                                  task_schema, status))  # fmt: skip
    registry.register(ControlTool("a2a.cancel", "Cancel an A2A task started with async.", task_schema, cancel))
