"""A connection's catalogue: paging ``tools/list`` and the resource lists in, re-listing what a
``list_changed`` (or an expired modern ``ttlMs``) made stale, and checking a tool's structured result
against the output schema it declared.

It exists so what a server offers (and when that is stale) has one owner. It asks through the
:class:`~agentd.client.exchange.Exchange` and reads the era and capabilities from its session.
"""

from __future__ import annotations

import math
from typing import Any, Final

import attrs
import trio

from agentd import defaults
from agentd.client.exchange import Exchange, SessionGone
from agentd.client.models import ResourceInfo, ResourceTemplateInfo, ToolInfo
from agentd.config.model import McpServerConfig
from agentd.errors import McpError, McpProtocolError, McpRpcError
from agentd.mcp import schemas, tasks, types
from agentd.mcp.streamable_http import invalid_header_annotation
from agentd.mcp.tool_hash import tool_hash
from agentd.mcp.versions import Era
from agentd.telemetry.events import MAX_FIELD_ITEMS, EventLog

#: A server still returning a cursor after this many pages is broken.
MAX_PAGES: Final = 1024
#: Entries kept per list per server (tools, resources, templates). A model is offered a few dozen tools at most
#: (gateways cap a request's tools far lower); past this a server is hostile or broken, and structuring and
#: offering every entry would cost seconds of CPU on the event loop. The rest are dropped with one event.
MAX_ENTRIES: Final = 4096


def info_hash(tool: ToolInfo) -> str:
    """``tool``'s audit hash (agentd.mcp.tool_hash): what ``agentd check`` prints and a ``pin:`` holds."""
    return tool_hash(tool.description, tool.input_schema, tool.output_schema, tool.annotations, tool.title)


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
    #: When the last re-list started (trio's clock): the next waits ``RELIST_INTERVAL`` after it.
    _relisted: float = -math.inf
    #: Compiled output schemas, per tool, for the current tool list.
    _validators: dict[str, Any] = attrs.field(factory=dict)
    #: The audit hash (agentd.mcp.tool_hash) of every tool of the last listing, refused ones included.
    hashes: dict[str, str] = attrs.field(factory=dict)
    #: Tools a pinned server listed but may not offer: ``{tool: its pinned hash, or None if not pinned}``.
    refused: dict[str, str | None] = attrs.field(factory=dict)
    #: Tools listed that cannot be called at all here, with why (a ``required`` task tool on a server that
    #: cannot run tool calls as tasks): not offered.
    unusable: dict[str, str] = attrs.field(factory=dict)
    _listings: int = 0
    #: The URIs of :attr:`resources`, for the list object they were taken from (a reload replaces the list).
    _resource_uris: tuple[list[ResourceInfo] | None, frozenset[str]] = (None, frozenset())

    def lists(self, uri: str) -> bool:
        """Does the current resource listing hold ``uri``? (Asked on every read and subscribe without a named
        server: a set per listing, not a scan of a listing that may hold thousands.)"""
        listed, uris = self._resource_uris
        if listed is not self.resources:
            listed, uris = self._resource_uris = (self.resources, frozenset(r.uri for r in self.resources))
        return uri in uris

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
        listed = [
            ToolInfo(self.name, t.name, t.description, t.input_schema, t.output_schema, t.annotations, t.title,
                     tasks.task_support(t.extra.get("execution")))
            for t in tools
            if allowed is None or t.name in allowed  # a host allowlist: the rest never reach the catalogue
        ]
        hashes = {t.name: info_hash(t) for t in listed}
        refused = self._pin_check(hashes)
        session = self.exchange.session
        unusable = {t.name: tasks.unusable_reason() for t in listed
                    if tasks.call_mode(session.era, t.task_support, session.capabilities) is tasks.CallMode.UNUSABLE}
        for name, reason in unusable.items():
            if name not in self.unusable:
                self.log.warn("mcp.tool_unusable", server=self.name, tool=name, reason=reason)
        self.unusable = unusable
        self.tools = [t for t in listed if t.name not in refused and t.name not in unusable]
        self._audit(listed, hashes, refused)
        self.hashes, self.refused = hashes, refused
        self._validators = {}

    def _pin_check(self, hashes: dict[str, str]) -> dict[str, str | None]:
        """The tools a pinned server may not offer: ``{tool: pinned hash or None}``; each logged once per change."""
        pin = self.config.pin
        if pin is None:
            return {}
        refused = {name: pin.get(name) for name, digest in hashes.items() if pin.get(name) != digest}
        for name, pinned in refused.items():
            if self.refused.get(name, "") == pinned and self.hashes.get(name) == hashes[name]:
                continue  # the same mismatch as at the last listing: already reported
            self.log.warn("mcp.tool_pin_mismatch", server=self.name, tool=name, pinned=pinned, listed=hashes[name])
        return refused

    def _audit(self, listed: list[ToolInfo], hashes: dict[str, str], refused: dict[str, str | None]) -> None:
        """One ``mcp.catalogue`` event per listing: every tool's name and hash (and, with ``--log-content``, its
        untrusted text), and after the first listing exactly which tools were added, removed or changed."""
        entries: list[dict[str, Any]] = []
        for tool in listed:
            entry: dict[str, Any] = {"name": tool.name, "hash": hashes[tool.name]}
            if tool.name in refused:
                entry["refused"] = True
            if self.log.log_content:
                entry.update(description=tool.description, title=tool.title, inputSchema=tool.input_schema,
                             outputSchema=tool.output_schema, annotations=tool.annotations)
            else:
                entry["description"] = self.log.content(tool.description or "")
            entries.append(entry)
        fields: dict[str, Any] = {"server": self.name, "tools": entries}
        if self._listings:
            before = self.hashes
            fields["changed"] = {
                "added": sorted(set(hashes) - set(before)),
                "removed": sorted(set(before) - set(hashes)),
                "modified": sorted(n for n in hashes.keys() & before.keys() if hashes[n] != before[n]),
            }
        self._listings += 1
        # A line keeps MAX_FIELD_ITEMS items per list: a longer catalogue is logged in parts, none cut.
        parts = [entries[i:i + MAX_FIELD_ITEMS] for i in range(0, len(entries), MAX_FIELD_ITEMS)] or [[]]
        for index, part in enumerate(parts):
            extra = {"part": index + 1, "parts": len(parts)} if len(parts) > 1 else {}
            self.log.info("mcp.catalogue", **{**fields, "tools": part, **extra})

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
        """A ``list_changed`` for ``what`` ("tools" or "resources") arrived; honoured if it was advertised.
        One already waiting for the next re-list adds nothing (not even a log line): a flood is one re-list."""
        if advertised and what in self._refresh:
            return
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
            # At most one re-list per interval: every list_changed until then is coalesced into it.
            await trio.sleep_until(self._relisted + defaults.RELIST_INTERVAL)
            self._relisted = trio.current_time()
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
            if "tools" not in wanted:  # a tools listing has logged its own mcp.catalogue
                self.log.info("mcp.catalogue", server=self.name, resources=len(self.resources))

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
        except schemas.CheckTooCostly as exc:  # the server's own result against its own schema: its business
            self.log.warn("mcp.protocol_error", server=self.name,
                          what=f"{tool}: structuredContent not checked against the outputSchema: {exc}")
            return
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise McpProtocolError(
                f"tools/call {tool}: structuredContent does not match the outputSchema at {where}: {error.message}",
                server=self.name,
            )
