"""The self-MCP listener's served surface: a table of small mounted apps, each in its own module.

| path | app | gate |
|---|---|---|
| ``/healthz``, ``/readyz`` (GET, HEAD) | :mod:`agentd.transport.probes_app` | none: ok or not ok |
| ``/ui``, ``/ui/…`` | :mod:`agentd.transport.ui_app` | the listener's; a login with a static bearer |
| ``/.well-known/oauth-protected-resource[/path]`` | :mod:`agentd.transport.resource_metadata_app` | Host/Origin |
| the ``--serve-mcp`` path and ``/mcp`` (``/`` s after them too) | :mod:`agentd.transport.mcp_app` | the listener's |
| ``/events`` (WebSocket only) | :mod:`agentd.transport.events_app` | the listener's; the ``/ui/`` cookie |
| ``/_agentd/webhooks/events/…`` (TLS, events by webhook) | :mod:`agentd.transport.webhook_app` | the signature |
| anything else | 404 | |

The gate (:mod:`agentd.transport.gate`) is one value every app shares: Host/Origin against DNS rebinding, then
the static bearer or an OAuth access token. ``--serve-a2a`` mounts its paths in front (agentd.selfmcp.a2a).
``drain()`` ends the open streams (final listen frames, ``/events`` closed with 1001).
"""

from __future__ import annotations

import attrs
import trio

from agentd import defaults
from agentd.mcp.server_session import ServerCore
from agentd.telemetry.events import EventLog, null_log
from agentd.telemetry.health import PROBES
from agentd.telemetry.stream import EVENTS_PATH
from agentd.transport import resource_metadata_app
from agentd.transport.events_app import EventsApp
from agentd.transport.gate import LOOPBACK_HOSTS, Gate
from agentd.transport.mcp_app import EndpointLimits, McpEndpoint
from agentd.transport.mcp_handler import CallContext, ListenTicket, McpHandler, NotificationStream
from agentd.transport.mounts import Mount, Mounts
from agentd.transport.probes_app import probes
from agentd.transport.resource_server import ResourceServer
from agentd.transport.tenancy import Owners
from agentd.transport.ui_app import UI_PATH, UiApp


@attrs.frozen
class AsgiOptions:
    paths: frozenset[str] = frozenset({"/mcp"})
    bearer: str | None = attrs.field(default=None, repr=False)
    #: Host names accepted in ``Host``/``Origin``; ``None`` accepts any Host and same-host Origins.
    allowed_hosts: frozenset[str] | None = LOOPBACK_HOSTS
    max_body: int = defaults.SERVE_MAX_BODY
    body_timeout: float = 30.0
    keepalive: float = defaults.SERVE_KEEPALIVE
    max_sessions: int = defaults.SERVE_MAX_SESSIONS
    #: OAuth access tokens (``--serve-oauth-issuer``); None: no tokens accepted beyond ``bearer``.
    oauth: ResourceServer | None = attrs.field(default=None, eq=False, repr=False)
    #: ``--serve-oauth-operator-scope``: a token carrying it is an operator (sees every principal's state).
    operator_scope: str | None = None
    #: ``--serve-accept-cancel``: a legacy ``notifications/cancelled`` ends the run the named request started
    #: (``McpHandler.cancel_request``); off, it is ignored.
    accept_cancel: bool = False


class McpAsgiApp(Mounts):
    """The listener's ASGI app: the table above over one handler (agentd's self-MCP surface, or any other)."""

    def __init__(self, handler: McpHandler, options: AsgiOptions | None = None, *, log: EventLog | None = None,
                 core: ServerCore | None = None, owners: Owners | None = None) -> None:
        self.handler = handler
        self.options = options = options or AsgiOptions()
        self.log = log = log or null_log()
        self.core = core or ServerCore(handler.identity, max_sessions=options.max_sessions)
        #: The served handles' owners (shared with the handler), for ``/events``.
        self.owners = owners if owners is not None else Owners()
        self.draining = trio.Event()
        self.gate = gate = Gate(options.bearer, options.allowed_hosts, options.oauth, options.operator_scope, log)
        limits = EndpointLimits(options.max_body, options.body_timeout, options.keepalive, options.max_sessions,
                                options.accept_cancel)
        self.mcp = McpEndpoint(handler, self.core, gate, limits, log=log, draining=self.draining)
        metadata = [] if options.oauth is None else [Mount(
            resource_metadata_app.PATH, resource_metadata_app.ResourceMetadataApp(options.oauth, gate), under=True)]
        super().__init__(http=[
            *(Mount(path, probes) for path in sorted(PROBES)),
            Mount(UI_PATH, UiApp(gate), under=True),
            *metadata,
            *(Mount(path, self.mcp, slashes=True) for path in sorted(options.paths)),
        ], websocket=[Mount(EVENTS_PATH, EventsApp(gate, self.owners, self.draining))])

    def drain(self) -> None:
        self.draining.set()


__all__ = ["AsgiOptions", "CallContext", "ListenTicket", "McpAsgiApp", "McpHandler", "NotificationStream"]
