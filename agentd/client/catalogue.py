"""A connection's catalogue: paging ``tools/list`` and the resource lists in, and re-listing what a
``list_changed`` (or an expired modern ``ttlMs``) made stale.

These are methods of :class:`agentd.client.connection.ServerConnection`, kept here so each module stays
readable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from agentd.client._streams import MAX_PAGES, _SessionGone
from agentd.client.models import ResourceInfo, ResourceTemplateInfo, ToolInfo
from agentd.config.model import McpServerConfig
from agentd.errors import McpError, McpProtocolError, McpRpcError
from agentd.events import EventLog
from agentd.mcp import types
from agentd.mcp.client_session import ClientSession
from agentd.mcp.streamable_http import invalid_header_annotation
from agentd.mcp.versions import Era


class CatalogueMixin:
    """Catalogue loading and refresh. Everything it uses is defined by ``ServerConnection``."""

    if TYPE_CHECKING:
        config: McpServerConfig
        log: EventLog
        session: ClientSession
        tools: list[ToolInfo]
        resources: list[ResourceInfo]
        templates: list[ResourceTemplateInfo]
        ttl_ms: dict[str, int | None]
        _refresh: set[str]
        _refresh_wanted: trio.Event
        _validators: dict[str, Any]

        @property
        def name(self) -> str: ...
        @property
        def era(self) -> Era | None: ...
        async def _request_once(
            self, method: str, params: dict[str, Any] | None, headers: dict[str, str] | None = None
        ) -> dict[str, Any]: ...
    async def _load_catalogue(self) -> None:
        if self.session.has("tools") or self.era is Era.MODERN:
            await self._load_tools()
        else:
            self.tools = []
        if self.session.has("resources"):
            await self._load_resources()
        else:
            self.resources, self.templates = [], []

    async def _drain(self, method: str, key: str, cls: type[Any]) -> list[Any]:
        items: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            params = {"cursor": cursor} if cursor is not None else None
            result = await self._request_once(method, params)
            try:
                page = types.structure(result, cls)
            except types.WireError as exc:
                raise McpProtocolError(f"{method}: {exc}", server=self.name) from None
            items.extend(getattr(page, key))
            self.ttl_ms[method] = page.ttl_ms
            cursor = page.next_cursor
            if not cursor:
                return items
        raise McpProtocolError(
            f"{method}: still paging after {MAX_PAGES} pages (the server keeps returning a cursor)", server=self.name
        )

    async def _load_tools(self) -> None:
        tools: list[types.Tool] = await self._drain("tools/list", "tools", types.ListToolsResult)
        if self.era is Era.MODERN:
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

    async def _load_resources(self) -> None:
        resources: list[types.Resource] = await self._drain(
            "resources/list", "resources", types.ListResourcesResult
        )
        self.resources = [
            ResourceInfo(self.name, r.uri, r.name, r.description, r.mime_type, r.size) for r in resources
        ]
        try:
            templates: list[types.ResourceTemplate] = await self._drain(
                "resources/templates/list", "resource_templates", types.ListResourceTemplatesResult
            )
        except McpRpcError as exc:
            self.log.debug("mcp.protocol_error", server=self.name, what=f"resources/templates/list: {exc}")
            templates = []
        self.templates = [
            ResourceTemplateInfo(self.name, t.uri_template, t.name, t.description, t.mime_type) for t in templates
        ]

    async def _refresher(self) -> None:
        """Re-list what a ``list_changed`` (or an expired modern ``ttlMs``) made stale."""
        while True:
            ttl = self.ttl_ms.get("tools/list") if self.era is Era.MODERN else None
            with trio.move_on_after(max(ttl / 1000, 1.0) if ttl else float("inf")) as expiry:
                await self._refresh_wanted.wait()
            if expiry.cancelled_caught:
                self._refresh.update({"tools", "resources"})
            self._refresh_wanted = trio.Event()
            wanted, self._refresh = self._refresh, set()
            try:
                with trio.fail_after(self.config.call_timeout):
                    if "tools" in wanted:
                        await self._load_tools()
                    if "resources" in wanted and self.session.has("resources"):
                        await self._load_resources()
            except (McpError, trio.TooSlowError, _SessionGone) as exc:
                self.log.warn("mcp.protocol_error", server=self.name, what=f"refreshing the catalogue: {exc}")
                continue
            self.log.info(
                "mcp.catalogue", server=self.name, tools=len(self.tools), resources=len(self.resources),
                refreshed=sorted(wanted),
            )  # fmt: skip
