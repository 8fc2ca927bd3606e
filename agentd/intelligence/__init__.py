"""The intelligence gateway client: an OpenAI-compatible Chat Completions endpoint, or the offline model.

::

    async with open_intelligence(["https://gw.example/v1"], model="m", token="{{secret:GW_TOKEN}}",
                                 log=log) as intel:
        reply = await intel.complete(messages, tools)

``endpoints`` is a list (or one comma-separated string) of base URLs, or ``["test"]`` for the offline
deterministic model. ``token`` is a secret *reference*, resolved here and registered with the log's
redactor; it is sent as ``Authorization: Bearer`` and never appears in an event or an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from agentd import defaults
from agentd.deferred.lazy import lazy_exports
from agentd.errors import ConfigError
from agentd.intelligence.endpoints import OFFLINE, completions_url, parse_endpoints
from agentd.intelligence.names import WIRE_NAME, ToolNameMap
from agentd.intelligence.offline import MODEL_NAME as OFFLINE_MODEL_NAME
from agentd.intelligence.offline import OfflineIntelligence, example_value
from agentd.intelligence.wire import ChatTool, ModelReply, ToolCall, Usage
from agentd.security.secrets import SecretResolver, has_secret_ref
from agentd.telemetry.events import EventLog, Redactor

if TYPE_CHECKING:
    from agentd.intelligence.failover import Breaker as Breaker
    from agentd.intelligence.failover import BreakerState as BreakerState
    from agentd.intelligence.gateway import GatewayError as GatewayError
    from agentd.transport.egress import EgressPolicy

__all__ = [
    "OFFLINE",
    "OFFLINE_MODEL_NAME",
    "WIRE_NAME",
    "Breaker",
    "BreakerState",
    "ChatTool",
    "GatewayError",
    "Intelligence",
    "ModelReply",
    "ToolCall",
    "ToolNameMap",
    "Usage",
    "completions_url",
    "example_value",
    "open_intelligence",
    "release_idle",
]

#: The gateway client's exports, imported on first use: the offline model (``--intelligence test``) needs no
#: HTTP client at all, so a run with it never loads httpx here.
_LAZY = {
    "Breaker": "agentd.intelligence.failover",
    "BreakerState": "agentd.intelligence.failover",
    "GatewayError": "agentd.intelligence.gateway",
}


__getattr__ = lazy_exports("agentd.intelligence", _LAZY, globals())


#: Per-call (per attempt) timeout, as in the original agentd.
CALL_TIMEOUT = 120.0
#: How long letting go of idle connections may take (:func:`release_idle`; closing a TLS connection writes).
RELEASE_GRACE = 2.0


class Intelligence(Protocol):
    """What the loop talks to: the gateway client and the offline model both fit."""

    model: str
    usage: Usage

    async def complete(self, messages: list[dict[str, Any]], tools: Sequence[ChatTool]) -> ModelReply: ...


class _Registering:
    """Whatever resolver the caller passed, every value it yields is also scrubbed from *this* log. (A plain
    class: an adapter, not a value, built where this module loads at a once run's start-up.)"""

    __slots__ = ("inner", "redactor")

    def __init__(self, inner: SecretResolver, redactor: Redactor) -> None:
        self.inner = inner
        self.redactor = redactor

    def resolve(self, template: str) -> str:
        value = self.inner.resolve(template)
        self.redactor.add(value)
        return value


@asynccontextmanager
async def open_intelligence(
    endpoints: Sequence[str] | str,
    *,
    model: str = defaults.MODEL,
    token: str | None = None,
    stream: bool = False,
    log: EventLog,
    secrets: SecretResolver | None = None,
    timeout: float = CALL_TIMEOUT,
    verify: Any = True,
    egress: EgressPolicy | None = None,
) -> AsyncIterator[Intelligence]:
    """Validate the endpoints, resolve the token, and hold one HTTP client for the block.

    Raises ``ConfigError`` for a bad endpoint or a literal token (before any connection). ``verify`` is
    passed to httpx (an ``ssl.SSLContext`` for a private CA); the default ``True`` uses the process's cached
    public-CA context (:mod:`agentd.transport.tls`), or one without any CA when every endpoint is ``http``.
    """
    urls = parse_endpoints(endpoints)
    log = log.bind(comp="intelligence")
    if urls == [OFFLINE]:
        yield OfflineIntelligence(log=log)
        return
    import httpx

    from agentd.intelligence.failover import FailoverIntelligence
    from agentd.intelligence.gateway import BearerToken, Gateway
    from agentd.transport.http_client import new_client
    from agentd.transport.tls import verify_for

    bearer: BearerToken | None = None
    if token is not None:
        if not has_secret_ref(token):
            raise ConfigError(
                "--intelligence-token must be a reference, '{{secret:NAME}}' or '{{secret-file:PATH}}', "
                "never the token itself"
            )
        resolver = secrets if secrets is not None else SecretResolver(redactor=log.redactor)
        bearer = BearerToken(token, _Registering(resolver, log.redactor))
    limits = httpx.Limits(max_connections=len(urls) * 4, max_keepalive_connections=len(urls) * 2)
    if verify is True:  # the process's cached context; none at all for plain-http endpoints
        verify = verify_for(urls)
    async with new_client(verify, limits=limits, egress=egress) as client:
        gateways = [Gateway(url, client, log, token=bearer, timeout=timeout) for url in urls]
        yield FailoverIntelligence(gateways, model=model, log=log, stream=stream, release=client.release_idle)


async def release_idle(intel: Intelligence) -> None:
    """A long wait between two model calls begins (a tool call the server runs as a task, polled for as long as
    it lasts): ``intel``'s HTTP client lets go of the connections it keeps alive, if none is in use, instead of
    holding them through the wait; the next call connects anew. A client without any (the offline model) has
    nothing to do. Shielded and bounded (:data:`RELEASE_GRACE`)."""
    release = getattr(intel, "release_idle", None)
    if release is None:
        return
    import trio

    with trio.move_on_after(RELEASE_GRACE, shield=True):
        await release()
