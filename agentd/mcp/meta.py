"""The ``_meta`` keys MCP reserves, and the 2026-07-28 request envelope built from them.

One definition for both roles: the client writes the envelope into every modern request and reads
``serverInfo`` and ``subscriptionId`` back; the server checks the envelope and writes those keys. The keys agentd
adds to every ``tools/call`` (the run id, the call's idempotency key) are written here too (:func:`tool_call_params`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

META_PREFIX: Final = "io.modelcontextprotocol/"
PROTOCOL_VERSION: Final = META_PREFIX + "protocolVersion"
CLIENT_CAPABILITIES: Final = META_PREFIX + "clientCapabilities"
CLIENT_INFO: Final = META_PREFIX + "clientInfo"
SERVER_INFO: Final = META_PREFIX + "serverInfo"
SUBSCRIPTION_ID: Final = META_PREFIX + "subscriptionId"
#: The run id key the design document names (a reserved prefix; see docs/mcp-client.md).
RUN_ID: Final = META_PREFIX + "run-id"
#: The key naming one logical ``tools/call``, the same on every re-send of it (docs/mcp-client.md).
IDEMPOTENCY_KEY: Final = META_PREFIX + "idempotency-key"
#: The params field of the proposed standard (SEP-3182, not merged): sent too when the server declares
#: ``capabilities.tools.idempotency``.
IDEMPOTENCY_FIELD: Final = "idempotencyKey"
#: The tasks extension (SEP-2663), declared in the client capabilities of the requests in :data:`TASK_METHODS`
#: (``subscriptions/listen``: its filter may ask for ``notifications/tasks``).
TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
TASK_METHODS: Final = frozenset({"tools/call", "tasks/get", "tasks/update", "tasks/cancel", "subscriptions/listen"})
#: The events extension (SEP-3415), declared in the client capabilities of the requests in :data:`EVENT_METHODS`.
EVENTS_EXTENSION: Final = "io.modelcontextprotocol/events"
EVENT_METHODS: Final = frozenset({"events/list", "events/poll", "events/stream", "events/subscribe",
                                  "events/unsubscribe"})


def tool_call_params(name: str, arguments: Mapping[str, Any], *, run_id: str, key: str,
                     standard_field: bool) -> dict[str, Any]:
    """A ``tools/call``'s params: the run id and the call's idempotency key in ``_meta``; the key in the proposed
    standard field as well when the server declared it (``standard_field``)."""
    params: dict[str, Any] = {"name": name, "arguments": arguments, "_meta": {RUN_ID: run_id, IDEMPOTENCY_KEY: key}}
    if standard_field:
        params[IDEMPOTENCY_FIELD] = key
    return params


def client_capabilities(method: str | None, declared: tuple[str, ...] = ()) -> dict[str, Any]:
    """agentd's per-request client capabilities on the 2026-07-28 wire: the tasks extension on ``tools/call``
    and ``tasks/*`` (agentd.mcp.tasks), the events extension on ``events/*`` (agentd.mcp.events), and what the
    host opted this server in to (``declared``: elicitation, sampling), nothing else."""
    out: dict[str, Any] = {}
    if method in TASK_METHODS:
        out["extensions"] = {TASKS_EXTENSION: {}}
    elif method in EVENT_METHODS:
        out["extensions"] = {EVENTS_EXTENSION: {}}
    out.update(declared_object(declared))
    return out


def declared_object(declared: tuple[str, ...]) -> dict[str, Any]:
    """The capabilities object of what the host opted a server in to: ``elicitation`` -> ``{"elicitation": {}}``,
    a dotted one as a sub-capability (``sampling.tools`` -> ``{"sampling": {"tools": {}}}``)."""
    out: dict[str, Any] = {}
    for name in declared:
        head, _, sub = name.partition(".")
        entry = out.setdefault(head, {})
        if sub:
            entry[sub] = {}
    return out


def with_envelope(params: dict[str, Any], version: str, client_info: Mapping[str, Any],
                  method: str | None = None, declared: tuple[str, ...] = ()) -> dict[str, Any]:
    """``params`` with the modern envelope merged into its ``_meta`` (capabilities: :func:`client_capabilities`)."""
    meta = dict(params.get("_meta") or {})
    meta[PROTOCOL_VERSION] = version
    meta[CLIENT_CAPABILITIES] = client_capabilities(method, declared)
    meta[CLIENT_INFO] = dict(client_info)
    params["_meta"] = meta
    return params


def envelope_version(params: Mapping[str, Any]) -> str | None:
    """The version a modern request's envelope names, or None when the envelope is missing or malformed
    (it must carry a string protocolVersion and an object clientCapabilities)."""
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        return None
    version = meta.get(PROTOCOL_VERSION)
    if not isinstance(version, str) or not isinstance(meta.get(CLIENT_CAPABILITIES), dict):
        return None
    return version


def subscription_meta(subscription_id: Any) -> dict[str, Any]:
    """The ``_meta`` every frame of a ``subscriptions/listen`` stream carries."""
    return {SUBSCRIPTION_ID: subscription_id}


def subscription_of(params: Mapping[str, Any]) -> Any:
    """The listen stream a frame belongs to (None when it names none)."""
    meta = params.get("_meta")
    return meta.get(SUBSCRIPTION_ID) if isinstance(meta, dict) else None
