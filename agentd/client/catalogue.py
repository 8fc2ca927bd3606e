"""A connection's catalogue: paging ``tools/list`` and the resource lists in, re-listing what a
``list_changed`` (or an expired modern ``ttlMs``) made stale, and checking a tool's structured result
against the output schema it declared.

It exists so what a server offers (and when that is stale) has one owner. It asks through the
:class:`~agentd.client.exchange.Exchange` and reads the era and capabilities from its session.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import trio

from agentd.client.exchange import Exchange, SessionGone
from agentd.client.models import ResourceInfo, ResourceTemplateInfo, ToolInfo
from agentd.config.model import McpServerConfig
from agentd.errors import McpError, McpProtocolError, McpRpcError
from agentd.events import EventLog
from agentd.mcp import schemas, types
from agentd.mcp.streamable_http import invalid_header_annotation
from agentd.mcp.versions import Era

#: A server still returning a cursor after this many pages is broken.
MAX_PAGES: Final = 1024
#: Entries kept per list per server (tools, resources, templates). A model is offered a few dozen tools at most
#: (gateways cap a request's tools far lower); past this a server is hostile or broken, and structuring and
#: offering every entry would cost seconds of CPU on the event loop. The rest are dropped with one event.
MAX_ENTRIES: Final = 4096


@attrs.define(eq=False)
class Catalogue:
    """The tools, resources and templates of one server, kept current."""

    config: McpServerConfig
    exchange: Exchange
    log: EventLog
    tools: list[ToolInfo] = attrs.field(factory=list)
    resources: list[ResourceInfo] = attrs.field(factory=list)
    templates: list[ResourceTemplateInfo] = attrs.field(factory=list)
    #: The modern ``ttlMs`` of each list method's last page.
    ttl_ms: dict[str, int | None] = attrs.field(factory=dict)
    _refresh: set[str] = attrs.field(factory=set)
    _refresh_wanted: trio.Event = attrs.field(factory=trio.Event)
    #: Compiled output schemas, per tool, for the current tool list.
    _validators: dict[str, Any] = attrs.field(factory=dict)

    @property
    def name(self) -> str:
        return self.config.name

    def tool(self, name: str) -> ToolInfo | None:
        return next((t for t in self.tools if t.name == name), None)

    async def load(self) -> None:
        session = self.exchange.session
        if session.has("tools") or session.era is Era.MODERN:
            await self.load_tools()
        else:
            self.tools = []
        if session.has("resources"):
            await self.load_resources()
        else:
            self.resources, self.templates = [], []

    async def _drain(self, method: str, key: str, cls: type[Any], wire_key: str | None = None) -> list[Any]:
        items: list[Any] = []
        cursor: str | None = None
        wire_key = wire_key or key
        for _ in range(MAX_PAGES):
            params = {"cursor": cursor} if cursor is not None else None
            result = await self.exchange.request_once(method, params)
            room = MAX_ENTRIES - len(items)
            listed = result.get(wire_key) if isinstance(result, dict) else None
            over = False
            if isinstance(result, dict) and isinstance(listed, list) and len(listed) > room:
                over = True  # cut before structuring: a hostile page of 100,000 entries costs nothing more
                result = {**result, wire_key: listed[:room]}
            try:
                page = types.structure(result, cls)
            except types.WireError as exc:
                raise McpProtocolError(f"{method}: {exc}", server=self.name) from None
            items.extend(getattr(page, key))
            self.ttl_ms[method] = page.ttl_ms
            cursor = page.next_cursor
            if over:
                self.log.warn("mcp.protocol_error", server=self.name,
                              what=f"{method}: more than {MAX_ENTRIES} entries; the first {MAX_ENTRIES} are kept")
                return items
            if not cursor:
                return items
        raise McpProtocolError(
            f"{method}: still paging after {MAX_PAGES} pages (the server keeps returning a cursor)", server=self.name
        )

    async def load_tools(self) -> None:
        tools: list[types.Tool] = await self._drain("tools/list", "tools", types.ListToolsResult)
        if self.exchange.session.era is Era.MODERN:
            # 2026-07-28: a tool whose x-mcp-header annotations are invalid MUST be dropped.
            kept = []
            for tool in tools:
                reason = invalid_header_annotation(tool.input_schema)
                if reason is None:
                    kept.append(tool)
                else:
                    self.log.warn("mcp.protocol_error", server=self.name, what=f"tool {tool.name!r} dropped: {reason}")
            tools = kept
        allowed = self.config.tools
        self.tools = [
            ToolInfo(self.name, t.name, t.description, t.input_schema, t.output_schema, t.annotations, t.title)
            for t in tools
            if allowed is None or t.name in allowed  # a host allowlist: the rest never reach the catalogue
        ]
        # The audit record of each (untrusted) description is the loop's mcp.tool_description event.
        self._validators = {}

    async def load_resources(self) -> None:
        resources: list[types.Resource] = await self._drain(
            "resources/list", "resources", types.ListResourcesResult
        )
        self.resources = [
            ResourceInfo(self.name, r.uri, r.name, r.description, r.mime_type, r.size) for r in resources
        ]
        try:
            templates: list[types.ResourceTemplate] = await self._drain(
                "resources/templates/list", "resource_templates", types.ListResourceTemplatesResult,
                wire_key="resourceTemplates",
            )
        except McpRpcError as exc:
            self.log.debug("mcp.protocol_error", server=self.name, what=f"resources/templates/list: {exc}")
            templates = []
        self.templates = [
            ResourceTemplateInfo(self.name, t.uri_template, t.name, t.description, t.mime_type) for t in templates
        ]

    def want_refresh(self, what: str, *, advertised: bool) -> None:
        """A ``list_changed`` for ``what`` ("tools" or "resources") arrived; honoured if it was advertised."""
        self.log.info("mcp.list_changed", server=self.name, list=what, advertised=advertised)
        if advertised:
            self._refresh.add(what)
            self._refresh_wanted.set()

    async def refresher(self) -> None:
        """Re-list what a ``list_changed`` (or an expired modern ``ttlMs``) made stale."""
        session = self.exchange.session
        while True:
            ttl = self.ttl_ms.get("tools/list") if session.era is Era.MODERN else None
            with trio.move_on_after(max(ttl / 1000, 1.0) if ttl else float("inf")) as expiry:
                await self._refresh_wanted.wait()
            if expiry.cancelled_caught:
                self._refresh.update({"tools", "resources"})
            self._refresh_wanted = trio.Event()
            wanted, self._refresh = self._refresh, set()
            try:
                with trio.fail_after(self.config.call_timeout):
                    if "tools" in wanted:
                        await self.load_tools()
                    if "resources" in wanted and session.has("resources"):
                        await self.load_resources()
            except (McpError, trio.TooSlowError, SessionGone) as exc:
                self.log.warn("mcp.protocol_error", server=self.name, what=f"refreshing the catalogue: {exc}")
                continue
            self.log.info(
                "mcp.catalogue", server=self.name, tools=len(self.tools), resources=len(self.resources),
                refreshed=sorted(wanted),
            )  # fmt: skip

    def check_structured(self, tool: str, structured: dict[str, Any] | None) -> None:
        """Check a tool's ``structuredContent`` against its declared ``outputSchema`` (if any)."""
        info = self.tool(tool)
        if info is None or info.output_schema is None:
            return
        if structured is None:
            raise McpProtocolError(
                f"tools/call {tool}: the tool declares an outputSchema but returned no structuredContent",
                server=self.name,
            )
        validator = self._validators.get(tool)
        if validator is None:
            compiled = schemas.compile_schema(info.output_schema)
            if compiled.validator is None:
                why = compiled.error or compiled.unusable
                self.log.warn("mcp.protocol_error", server=self.name, what=f"{tool}: invalid outputSchema: {why}")
                return
            validator = self._validators[tool] = compiled.validator
        try:
            error = schemas.first_error(validator, structured)
        except schemas.SchemaUnusable as exc:
            self.log.warn("mcp.protocol_error", server=self.name, what=f"{tool}: invalid outputSchema: {exc}")
            return
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise McpProtocolError(
                f"tools/call {tool}: structuredContent does not match the outputSchema at {where}: {error.message}",
                server=self.name,
            )
