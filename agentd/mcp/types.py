"""MCP wire types the client reads, as attrs values with one cattrs converter.

Wire names are camelCase; attribute names are snake_case. Every type keeps the fields it does not
know in ``extra`` (a newer server's additions survive a round trip instead of being rejected), and
structuring is strict about the types of the fields it does know: a ``name`` that is a number is a
:class:`WireError`, not silently ``str(42)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

T = TypeVar("T")


class WireError(ValueError):
    """A result object does not have the shape its method promises."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@attrs.frozen
class Implementation:
    name: str
    version: str = ""
    title: str | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Tool:
    name: str
    input_schema: dict[str, Any] = attrs.field(factory=dict)
    description: str | None = None
    title: str | None = None
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Resource:
    uri: str
    name: str = ""
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ResourceTemplate:
    uri_template: str
    name: str = ""
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class InitializeResult:
    protocol_version: str
    capabilities: dict[str, Any] = attrs.field(factory=dict)
    server_info: Implementation = attrs.field(factory=lambda: Implementation(name=""))
    instructions: str | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class DiscoverResult:
    """``server/discover`` (2026-07-28): what a handshake-less server supports."""

    supported_versions: list[str]
    capabilities: dict[str, Any] = attrs.field(factory=dict)
    instructions: str | None = None
    ttl_ms: int | None = None
    cache_scope: str | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ListToolsResult:
    tools: list[Tool]
    next_cursor: str | None = None
    ttl_ms: int | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ListResourcesResult:
    resources: list[Resource]
    next_cursor: str | None = None
    ttl_ms: int | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ListResourceTemplatesResult:
    resource_templates: list[ResourceTemplate]
    next_cursor: str | None = None
    ttl_ms: int | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class CallToolResult:
    content: list[dict[str, Any]] = attrs.field(factory=list)
    is_error: bool = False
    structured_content: dict[str, Any] | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ReadResourceResult:
    contents: list[dict[str, Any]]
    ttl_ms: int | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


#: The converter for every type above. Use :func:`structure` / :func:`unstructure`.
converter: Final = cattrs.Converter()


def _strict(kind: type[T]) -> Callable[[Any, type[T]], T]:
    def check(value: Any, _: type[T]) -> T:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise WireError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return check


converter.register_structure_hook(str, _strict(str))
converter.register_structure_hook(bool, _strict(bool))
converter.register_structure_hook(int, _strict(int))


def _dict_hook(value: Any, _: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WireError(f"expected an object, got {type(value).__name__}")
    return value


converter.register_structure_hook_func(lambda t: t == dict[str, Any], _dict_hook)


def _register(cls: type[Any]) -> None:
    names = [f.name for f in attrs.fields(cls) if f.name != "extra"]
    wire = {name: _camel(name) for name in names}
    known = frozenset(wire.values())
    structure_overrides: dict[str, Any] = {name: override(rename=wire[name]) for name in names}
    structure_overrides["extra"] = override(omit=True)
    base_structure = make_dict_structure_fn(cls, converter, **structure_overrides)

    def structure_fn(obj: Any, _: Any) -> Any:
        if not isinstance(obj, dict):
            raise WireError(f"{cls.__name__}: expected an object, got {type(obj).__name__}")
        value = base_structure(obj, cls)
        extra = {k: v for k, v in obj.items() if k not in known}
        return attrs.evolve(value, extra=extra) if extra else value

    unstructure_overrides: dict[str, Any] = {
        name: override(rename=wire[name], omit_if_default=True) for name in names
    }
    unstructure_overrides["extra"] = override(omit=True)
    base_unstructure = make_dict_unstructure_fn(cls, converter, **unstructure_overrides)

    def unstructure_fn(value: Any) -> dict[str, Any]:
        out: dict[str, Any] = base_unstructure(value)
        out.update(value.extra)
        return out

    converter.register_structure_hook(cls, structure_fn)
    converter.register_unstructure_hook(cls, unstructure_fn)


for _cls in (
    Implementation, Tool, Resource, ResourceTemplate, InitializeResult, DiscoverResult,
    ListToolsResult, ListResourcesResult, ListResourceTemplatesResult, CallToolResult, ReadResourceResult,
):  # fmt: skip
    _register(_cls)


def structure(obj: Any, cls: type[T]) -> T:
    """Build ``cls`` from a decoded wire object, or raise :class:`WireError` naming the bad field."""
    try:
        return converter.structure(obj, cls)
    except WireError:
        raise
    except (cattrs.BaseValidationError, KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            detail = "; ".join(cattrs.transform_error(exc))
        else:
            detail = f"{exc.__class__.__name__}: {exc}"
        raise WireError(f"{cls.__name__}: {detail}") from None


def unstructure(value: Any) -> dict[str, Any]:
    out: dict[str, Any] = converter.unstructure(value)
    return out
