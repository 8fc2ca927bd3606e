"""The tool catalogue one step offers: MCP tools and control tools, wire names, compiled validators.

Built once per catalogue load (the pool's tool list changes on ``list_changed``; the control registry
changes when a part registers a tool) and reused across steps, so a step costs no schema compilation.
An MCP tool's ``inputSchema`` is compiled when the catalogue is built (a broken one is audited then); a
control tool's schema is compiled on its first call (:class:`_Deferred`), so a run whose model calls no
control tool never loads jsonschema.
Every wire name maps back to exactly one entry through :class:`~agentd.intelligence.names.ToolNameMap`.

What is reused between builds has an owner: a pool's :class:`Catalogues` (by identity: its tool objects,
schemas, sinks; it lives as long as the pool) and the process's :class:`Validators` (by schema text).
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

import attrs

from agentd.agent.control import ControlTool
from agentd.intelligence.names import ToolNameMap
from agentd.intelligence.wire import ChatTool
from agentd.mcp import schemas
from agentd.telemetry.events import MAX_FIELD_ITEMS, EventLog

_EMPTY_OBJECT: Mapping[str, Any] = {"type": "object", "properties": {}}


class ToolLike(Protocol):
    @property
    def server(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str | None: ...
    @property
    def input_schema(self) -> Mapping[str, Any]: ...


@attrs.frozen
class Entry:
    """One offered tool. ``server`` is ``None`` for a control tool: its handler is the run's own, found by
    ``name`` in the run's registry, so one catalogue serves every run that offers the same tools."""

    wire_name: str
    server: str | None
    name: str
    validator: Any  # a jsonschema validator instance, or None when the schema is not checked locally
    #: Why the tool cannot be called at all (its inputSchema cannot be evaluated), or None.
    unusable: str | None = None
    #: The server's annotations say ``idempotentHint: true``: a call whose outcome was lost may be re-sent.
    idempotent: bool = False

    def check(self, arguments: Any) -> str | None:
        """Why ``arguments`` do not fit the tool's ``inputSchema``, or ``None`` when they do; raises
        :class:`~agentd.mcp.schemas.CheckTooCostly` when checking them ran out of budget."""
        if self.unusable is not None:
            return f"the tool is unusable: its inputSchema {self.unusable}"
        if self.validator is None:
            return None
        try:
            error = schemas.first_error(self.validator, arguments)
        except schemas.SchemaUnusable as exc:
            return f"the tool is unusable: its inputSchema {exc}"
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"{error.message}" + (f" (at /{where})" if where else "")


@attrs.frozen
class Catalogue:
    """The offered tools and how to map a model's tool call back to one of them."""

    entries: Mapping[str, Entry]
    chat_tools: tuple[ChatTool, ...]
    #: What it was built from (:func:`catalogue_key`), to notice a change cheaply.
    key: tuple[Any, ...]
    #: The tools and control schemas the key's ids name (held, so no id in the key is reused while it lives).
    source: tuple[Any, ...]

    def resolve(self, wire_name: str) -> Entry | None:
        return self.entries.get(wire_name)


def catalogue_key(tools: Sequence[ToolLike], controls: Sequence[ControlTool]) -> tuple[Any, ...]:
    """What a catalogue depends on: the MCP tools' identities (the pool hands out the same frozen objects until
    it re-lists) and each control tool's name, description and schema identity (a run registers its control
    tools anew, with module-level schemas)."""
    return tuple(map(id, tools)), tuple((c.name, c.description, id(c.input_schema)) for c in controls)


class Catalogues:
    """The catalogues built from one pool's tools and what building them prepared, for as long as the pool lives.

    Each table is keyed by the identity of an object its entry holds (so no id is reused while the entry
    lives): the pool's tool objects (the pool hands out the same frozen objects until it re-lists), the
    control tools' schemas (module-level, or a peer's card), an event sink. Its owner is the pool
    (:func:`catalogues_for`): a daemon's wakes all run on its one pool and find their catalogue here, and it
    goes when the pool does. What is keyed by content instead (compiled validators by schema text, name maps
    by tool names) holds for any pool and is the process's (:data:`VALIDATORS`, :func:`_name_map`).
    """

    __slots__ = ("__weakref__", "_audited", "_built", "_control", "_prepared")

    def __init__(self) -> None:
        #: By :func:`catalogue_key`.
        self._built: dict[tuple[Any, ...], _Built] = {}
        #: Per sink (held, so its id cannot be reused): the MCP tool list and wire names last audited there.
        self._audited: dict[int, tuple[Any, tuple[Any, ...], tuple[str, ...]]] = {}
        #: MCP tools' prepared schemas by the schema object's identity: a daemon's per-wake catalogue finds
        #: every schema here without even serialising it. Nothing mutates a tool's schema after listing.
        self._prepared: dict[int, _Prepared] = {}
        #: Control tools' prepared schemas, likewise (their validators are deferred).
        self._control: dict[int, _Prepared] = {}

    def build(self, tools: Sequence[ToolLike], controls: Iterable[ControlTool], *,
              log: EventLog | None = None) -> Catalogue:
        """Name, describe and compile validators for every tool. Logs the offered MCP tools once per load, for
        audit (one ``mcp.catalogue`` event with ``offered``: each tool's wire name, description and schema sizes).

        A load is a new MCP tool list from the pool (connect, ``list_changed``): a daemon builds a catalogue
        per wake from the same list, and re-logging every description per wake would be noise on its hot path.
        A catalogue holds no run's objects (a control entry names its tool; the loop calls the run's own), so
        one is built per distinct :func:`catalogue_key` and shared by every run offering the same tools.
        """
        control_list = list(controls)
        key = catalogue_key(tools, control_list)
        built = self._built.get(key)
        if built is None:
            built = self._build(tools, control_list, key)
            if len(self._built) >= _BUILT_MAX:
                self._built.clear()
            self._built[key] = built
        if log is not None and self._first_load(log, tools, built.wires):
            _audit(log, tools, built)
        return built.catalogue

    def _build(self, tools: Sequence[ToolLike], control_list: Sequence[ControlTool], key: tuple[Any, ...]) -> _Built:
        names = _name_map(tuple((t.server, t.name) for t in tools) + tuple((None, c.name) for c in control_list))
        entries: dict[str, Entry] = {}
        chat: list[ChatTool] = []
        wires: list[str] = []
        prepared_list: list[_Prepared] = []
        budget = [schemas.LISTING_BUDGET]  # what compiling this list's new schemas may still cost, together
        for tool in tools:
            wire = names.to_wire(tool.server, tool.name)
            prepared = self._prepared_tool(tool.input_schema or _EMPTY_OBJECT, budget)
            annotations = getattr(tool, "annotations", None)
            idempotent = isinstance(annotations, Mapping) and annotations.get("idempotentHint") is True
            entries[wire] = Entry(wire, tool.server, tool.name, prepared.validator, unusable=prepared.unusable,
                                  idempotent=idempotent)
            chat.append(ChatTool(wire, tool.description or "", prepared.schema))
            wires.append(wire)
            prepared_list.append(prepared)
        for control in control_list:
            wire = names.to_wire(None, control.name)
            prepared = self._prepared_control(control.input_schema or _EMPTY_OBJECT)
            entries[wire] = Entry(wire, None, control.name, prepared.validator, prepared.unusable)
            chat.append(ChatTool(wire, control.description, prepared.schema))
        source = (tuple(tools), tuple(c.input_schema for c in control_list))
        return _Built(Catalogue(entries, tuple(chat), key, source), tuple(wires), tuple(prepared_list))

    def _first_load(self, log: EventLog, tools: Sequence[ToolLike], wires: tuple[str, ...]) -> bool:
        """Whether this tool list is new to ``log``'s sink: not equal to the list (and wire names) audited last.

        The pool hands out the same frozen tool objects until it re-lists, so the comparison is mostly by
        identity; a re-listed but unchanged catalogue has nothing new to audit.
        """
        key = tuple(tools)
        seen = self._audited.get(id(log.sink))
        if seen is not None and seen[0] is log.sink and seen[1] == key and seen[2] == wires:
            return False
        if len(self._audited) >= _AUDITED_MAX:
            self._audited.clear()
        self._audited[id(log.sink)] = (log.sink, key, wires)
        return True

    def _prepared_tool(self, source: Mapping[str, Any], budget: list[int]) -> _Prepared:
        """``source`` prepared; compiling it (unless cached) is charged to ``budget[0]``, a tool list's."""
        found = self._prepared.get(id(source))
        if found is not None and found.source is source:
            return found
        schema = dict(source)
        compiled = VALIDATORS.get(schema, budget)
        prepared = _Prepared(source, schema, compiled.validator, compiled.error, compiled.unusable,
                             json.dumps(schema, default=str))
        if len(self._prepared) >= _PREPARED_MAX:
            self._prepared.clear()
        self._prepared[id(source)] = prepared
        return prepared

    def _prepared_control(self, source: Mapping[str, Any]) -> _Prepared:
        found = self._control.get(id(source))
        if found is not None and found.source is source:
            return found
        schema = dict(source)
        prepared = _Prepared(source, schema, _Deferred(schema), None, None, "")
        if len(self._control) >= _PREPARED_MAX:
            self._control.clear()
        self._control[id(source)] = prepared
        return prepared


#: Finds a pool's :class:`Catalogues`; holds neither weakly-held side strongly (the pool owns its Catalogues).
_BY_POOL: weakref.WeakKeyDictionary[Any, Catalogues] = weakref.WeakKeyDictionary()


def catalogues_for(pool: object) -> Catalogues:
    """The :class:`Catalogues` of ``pool``'s tools: one per pool, gone with it. A pool that cannot be weakly
    referenced gets a new one per call (its caller, a run, then owns it)."""
    try:
        found = _BY_POOL.get(pool)
        if found is None:
            found = _BY_POOL[pool] = Catalogues()
    except TypeError:  # not weakly referenceable, or not hashable
        return Catalogues()
    return found


def build_catalogue(
    tools: Sequence[ToolLike], controls: Iterable[ControlTool], *, log: EventLog | None = None,
    catalogues: Catalogues | None = None,
) -> Catalogue:
    """:meth:`Catalogues.build` on ``catalogues`` (which keeps what can be reused), or once, keeping nothing."""
    return (catalogues if catalogues is not None else Catalogues()).build(tools, controls, log=log)


@attrs.frozen
class _Built:
    """A catalogue and what its audit needs."""

    catalogue: Catalogue
    wires: tuple[str, ...]  # the MCP tools' wire names, in order
    prepared: tuple[_Prepared, ...]  # the MCP tools' schemas


#: Bounds of a :class:`Catalogues`' tables (each is cleared when full: a pool re-listing without end).
_BUILT_MAX = 64
_AUDITED_MAX = 256
_PREPARED_MAX = 4096


def _audit(audit: EventLog, tools: Sequence[ToolLike], built: _Built) -> None:
    """The audit of a catalogue load: ``mcp.tool_unusable`` per unusable tool, then ``mcp.catalogue``."""
    offered: list[dict[str, Any]] = []
    warn = False
    for tool, wire, prepared in zip(tools, built.wires, built.prepared, strict=True):
        # Untrusted server text: recorded once per catalogue load for operator audit, never acted on.
        # A broken schema does not hide the tool: the server judges the arguments instead.
        item: dict[str, Any] = {
            "server": tool.server, "tool": tool.name, "wire_name": wire,
            "description": audit.content(tool.description or ""), "input_schema": audit.content(prepared.text),
        }  # fmt: skip
        if prepared.error:
            item["schema_error"] = prepared.error
            warn = True
        offered.append(item)
        if prepared.unusable is not None:
            audit.emit("mcp.tool_unusable", "warn", server=tool.server, tool=tool.name, wire_name=wire,
                       reason=prepared.unusable)
    if offered:
        # One event per catalogue load (in parts past MAX_FIELD_ITEMS tools, none cut); warn if a schema is broken.
        parts = [offered[i:i + MAX_FIELD_ITEMS] for i in range(0, len(offered), MAX_FIELD_ITEMS)]
        for index, part in enumerate(parts):
            extra = {"part": index + 1, "parts": len(parts)} if len(parts) > 1 else {}
            audit.emit("mcp.catalogue", "warn" if warn else "info", offered=part, **extra)


@functools.lru_cache(maxsize=64)
def _name_map(keys: tuple[tuple[str | None, str], ...]) -> ToolNameMap:
    """The name map for this exact key list; a daemon builds a catalogue per wake from the same tools.

    ``ToolNameMap`` is never mutated after construction, so sharing one between runs is safe.
    """
    return ToolNameMap(keys)


@attrs.frozen
class _Prepared:
    """What a catalogue needs from one ``inputSchema``: its plain copy, validator and audit text."""

    source: Mapping[str, Any]  # held so its id() cannot be reused while the entry lives
    schema: dict[str, Any]
    validator: Any
    error: str | None
    unusable: str | None
    text: str


class _Deferred:
    """A control tool's validator, compiled (through the shared cache) on the first check.

    The schemas are agentd's own or an A2A card's; checking one the same way later changes nothing a
    caller sees: an unusable schema still makes every call of the tool fail with the same reason.
    """

    __slots__ = ("_compiled", "_schema")

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self._schema = schema
        self._compiled: schemas.Compiled | None = None

    @property
    def schema(self) -> Mapping[str, Any]:
        return self._schema

    def iter_errors(self, instance: Any) -> Iterable[Any]:
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = VALIDATORS.get(self._schema)
        if compiled.unusable is not None:
            raise schemas.SchemaUnusable(compiled.unusable)
        if compiled.validator is None:
            return ()
        errors: Iterable[Any] = compiled.validator.iter_errors(instance)
        return errors


class Validators:
    """Compiled validators by canonical schema text. ``check_schema`` costs milliseconds per tool, and daemon
    modes build a catalogue per run (each wake): the same schemas must not be checked again every time.

    Keyed by content, so one table holds for every pool of the process; the process owns it
    (:data:`VALIDATORS`), and the fork server fills it once before it forks (:func:`precompile`).
    """

    __slots__ = ("_compiled",)

    def __init__(self) -> None:
        self._compiled: dict[str, schemas.Compiled] = {}

    def clear(self) -> None:
        self._compiled.clear()

    def get(self, schema: Mapping[str, Any], budget: list[int] | None = None) -> schemas.Compiled:
        """A compiled validator for ``schema`` (its ``$schema`` dialect, else 2020-12), or why there is none.
        A compile is charged to ``budget[0]`` (a tool list's); with nothing left the schema is unusable (and not
        cached: a later list may have the budget for it)."""
        try:
            key = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):
            return _compile(schema, budget)
        cached = self._compiled.get(key)
        if cached is None:
            if budget is not None and budget[0] <= 0:
                return schemas.Compiled(None, unusable=_OVER_LISTING)
            cached = _compile(schema, budget)
            if budget is not None and cached.unusable is not None and budget[0] <= 0:
                return cached  # cut short by this list's budget: not this schema's verdict
            if len(self._compiled) >= _VALIDATORS_MAX:
                self._compiled.clear()
            self._compiled[key] = cached
        return cached


_VALIDATORS_MAX = 4096
#: The process's validators.
VALIDATORS: Final = Validators()


def precompile(schemas_: Iterable[Mapping[str, Any]]) -> None:
    """Compile these control-tool schemas' validators now, into :data:`VALIDATORS`: the fork server does it once
    so that no forked child pays jsonschema's import and the compile on its first tool call."""
    for schema in schemas_:
        VALIDATORS.get(schema)


_OVER_LISTING = "cannot be checked: the tool list's schemas together exceed agentd's budget for compiling them"


def _compile(schema: Mapping[str, Any], budget: list[int] | None) -> schemas.Compiled:
    if budget is None:
        return schemas.compile_schema(schema)
    if budget[0] <= 0:
        return schemas.Compiled(None, unusable=_OVER_LISTING)
    compiled = schemas.compile_schema(schema, budget=min(budget[0], schemas.COMPILE_BUDGET))
    budget[0] -= compiled.cost
    if compiled.unusable is not None and budget[0] <= 0:
        return schemas.Compiled(None, unusable=_OVER_LISTING, cost=compiled.cost)
    return compiled
