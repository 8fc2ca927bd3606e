"""Streamable HTTP rules (2025-11-25 and 2026-07-28), pure: headers, statuses, content types, session ids.

Both roles use these: the client builds its request headers here and classifies responses; the server
(:mod:`agentd.mcp.server_session`) checks the same header names, media types, ``Mcp-Name`` rule and
session-id grammar. Names are spelled as on the wire; HTTP names are case-insensitive, so the server
matches their ``.lower()`` against the lower-case names ASGI hands it. No I/O.
"""

from __future__ import annotations

import base64
import enum
import functools
import re
from collections.abc import Mapping
from typing import Any, Final

from agentd.mcp import jsonrpc
from agentd.mcp.sse import encode_event
from agentd.mcp.versions import Era

ACCEPT_POST: Final = "application/json, text/event-stream"
ACCEPT_GET: Final = "text/event-stream"
JSON: Final = "application/json"
EVENT_STREAM: Final = "text/event-stream"

SESSION_ID: Final = "Mcp-Session-Id"
PROTOCOL_VERSION: Final = "MCP-Protocol-Version"
METHOD: Final = "Mcp-Method"
NAME: Final = "Mcp-Name"
PARAM_PREFIX: Final = "Mcp-Param-"
X_MCP_HEADER: Final = "x-mcp-header"
LAST_EVENT_ID: Final = "Last-Event-ID"
#: The MCP headers the transport sets itself (a configured header must not override them).
MCP_HEADERS: Final = (SESSION_ID, PROTOCOL_VERSION, METHOD, NAME, LAST_EVENT_ID)

#: Methods whose ``Mcp-Name`` header carries a parameter (2026-07-28, SEP-2243).
NAME_PARAM: Final = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
                     # the tasks extension (SEP-2663) routes by task: Mcp-Name is the taskId
                     "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}

#: 2026-07-28 has no resumability: a request whose response stream breaks before its answer is re-issued
#: under a new id. Only requests without side effects may be: discovery, the lists, reads and listen.
#: ``tools/call`` is deliberately absent (a tool may not be idempotent; it may already have run).
REISSUE_SAFE: Final = frozenset({
    "server/discover", "tools/list", "resources/list", "resources/templates/list", "prompts/list",
    "resources/read", "subscriptions/listen", "tasks/get",
})


def reissue_safe(method: str) -> bool:
    """May a modern request whose response stream broke be sent again under a new id?"""
    return method in REISSUE_SAFE


class Body(enum.Enum):
    """What a response to a POST (or GET) holds, decided from its status and content type."""

    JSON = "json"  # one JSON-RPC message (or a batch) in the body
    SSE = "sse"  # an event stream of JSON-RPC messages
    ACCEPTED = "accepted"  # 202: a notification or response was taken, nothing to read
    SESSION_GONE = "session-gone"  # 404 while a session id was sent: re-initialize
    NO_STREAM = "no-stream"  # 405 on GET: the server offers no standing stream
    REDIRECT = "redirect"  # 3xx: never followed
    HTTP_ERROR = "http-error"  # any other status; the body may still hold a JSON-RPC error
    BAD_CONTENT_TYPE = "bad-content-type"  # 200 with neither JSON nor an event stream


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


@functools.lru_cache(maxsize=64)
def _media_kinds(accept: str) -> frozenset[str]:
    return frozenset(media_type(part) for part in accept.split(","))


def accepts(accept: str | None, media: str) -> bool:
    """Does an ``Accept`` header value admit ``media``? A missing or empty one admits anything."""
    if not accept:
        return True
    kinds = _media_kinds(accept)
    return media in kinds or "*/*" in kinds or f"{media.split('/')[0]}/*" in kinds


def classify(status: int, content_type: str | None, *, method: str = "POST", had_session: bool = False) -> Body:
    if 300 <= status < 400:
        return Body.REDIRECT
    if status == 202 or (status == 204 and method != "GET"):
        return Body.ACCEPTED
    if status == 404 and had_session:
        return Body.SESSION_GONE
    if status == 405 and method == "GET":
        return Body.NO_STREAM
    if not 200 <= status < 300:
        return Body.HTTP_ERROR
    kind = media_type(content_type)
    if kind == EVENT_STREAM:
        return Body.SSE
    if kind == JSON and method == "POST":
        return Body.JSON
    return Body.BAD_CONTENT_TYPE


#: The usual causes of a 404/405 on the first POST: the URL is not a Streamable HTTP endpoint.
WRONG_ENDPOINT_HINT = (
    "is the path right? MCP servers usually serve at /mcp; an SSE-only (2024-11-05) server, whose endpoint "
    "often ends in /sse, is not supported"
)


def endpoint_hint(status: int, *, had_session: bool) -> str | None:
    """A hint for an HTTP error on a POST made before any session existed, or None."""
    if had_session or status not in (404, 405):
        return None
    return WRONG_ENDPOINT_HINT


def sse_message(message: jsonrpc.Message, *, id: str | None = None) -> bytes:
    """One JSON-RPC message as one SSE event, as POST answer streams and the GET stream carry them."""
    return encode_event(jsonrpc.dumps(message).decode(), id=id)


def priming_event(id: str, retry_ms: int) -> bytes:
    """The 2025-11-25 priming event: an id (to resume from) and a retry hint over empty data, which the
    receiving side must not parse as a message."""
    return encode_event("", id=id, retry=retry_ms)


def valid_session_id(value: str) -> bool:
    """A session id is 1+ visible ASCII characters (0x21-0x7E), per 2025-11-25 § Session Management."""
    return bool(value) and all(0x21 <= ord(c) <= 0x7E for c in value)


def encode_header_value(value: str) -> str:
    """A header-safe form of a name, URI or argument: as is when plain printable ASCII without edge
    whitespace, else ``=?base64?...?=`` (SEP-2243; also when the value itself looks like that wrapper)."""
    looks_wrapped = value.startswith("=?base64?") and value.endswith("?=")
    if value == value.strip() and not looks_wrapped and all(0x20 <= ord(c) <= 0x7E for c in value):
        return value
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


def decode_header_value(value: str) -> str:
    """The inverse of :func:`encode_header_value`; a malformed wrapper stays as it is (and so mismatches)."""
    if value.startswith("=?base64?") and value.endswith("?="):
        try:
            return base64.b64decode(value[len("=?base64?") : -2], validate=True).decode("utf-8")
        except ValueError:  # binascii.Error, UnicodeDecodeError, and non-ASCII text (a header read as latin-1)
            return value
    return value


def named_value(method: str, params: Mapping[str, Any] | None) -> str | None:
    """What ``Mcp-Name`` must carry (decoded) for this request, or None when the method names nothing
    or the parameter is not a string."""
    key = NAME_PARAM.get(method)
    value = (params or {}).get(key) if key else None
    return value if isinstance(value, str) else None


def request_headers(
    *,
    era: Era | None,
    protocol_version: str | None,
    session_id: str | None,
    method: str | None = None,
    params: Mapping[str, Any] | None = None,
    get: bool = False,
) -> dict[str, str]:
    """The MCP headers for one request.

    Legacy: ``Mcp-Session-Id`` once issued and ``MCP-Protocol-Version`` once negotiated (the
    ``initialize`` POST carries neither). Modern: the version on every POST plus ``Mcp-Method`` and,
    where the method names something, ``Mcp-Name``; never a session id.
    """
    headers = {"Accept": ACCEPT_GET if get else ACCEPT_POST}
    if not get:
        headers["Content-Type"] = JSON
    if era is Era.MODERN:
        if protocol_version:
            headers[PROTOCOL_VERSION] = protocol_version
        if method is not None:
            headers[METHOD] = method
            value = named_value(method, params)
            if value is not None:
                headers[NAME] = encode_header_value(value)
        return headers
    if session_id is not None:
        headers[SESSION_ID] = session_id
    if protocol_version is not None:
        headers[PROTOCOL_VERSION] = protocol_version
    return headers


# -- x-mcp-header (2026-07-28, SEP-2243): tool arguments mirrored into Mcp-Param-* headers -----------------------

#: An RFC 9110 token; used with ``fullmatch`` (``$`` would also accept a trailing newline).
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_TYPES: Final = frozenset({"string", "integer", "boolean"})
_SUB_ONE: Final = frozenset({"items", "contains", "unevaluatedItems", "additionalProperties", "propertyNames",
                             "unevaluatedProperties", "not", "if", "then", "else", "contentSchema"})
_SUB_LIST: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SUB_MAP: Final = frozenset({"patternProperties", "dependentSchemas", "$defs", "definitions"})


def _positions(root: Any) -> list[tuple[tuple[str, ...] | None, dict[str, Any]]]:
    """Every schema position with its pure ``properties`` path (None once another applicator is crossed)."""
    out: list[tuple[tuple[str, ...] | None, dict[str, Any]]] = []
    stack: list[tuple[tuple[str, ...] | None, Any]] = [((), root)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        out.append((path, node))
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                stack.extend(((*path, name) if path is not None else None, sub) for name, sub in value.items())
            elif key in _SUB_ONE:
                stack.append((None, value))
            elif key in _SUB_LIST and isinstance(value, list):
                stack.extend((None, sub) for sub in value)
            elif key in _SUB_MAP and isinstance(value, dict):
                stack.extend((None, sub) for sub in value.values())
    return out


def invalid_header_annotation(input_schema: Any) -> str | None:
    """Why a tool's ``x-mcp-header`` annotations are invalid (the client must drop such a tool), or None.

    Valid: on a property reachable through ``properties`` only, an RFC 9110 token, on a string, integer or
    boolean property, unique case-insensitively.
    """
    seen: dict[str, str] = {}
    for path, schema in _positions(input_schema):
        if X_MCP_HEADER not in schema:
            continue
        if not path:
            return f"{X_MCP_HEADER} outside a plain properties chain"
        where = ".".join(path)
        token = schema[X_MCP_HEADER]
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            return f"property {where!r}: {X_MCP_HEADER} is not an HTTP token"
        if schema.get("type") not in _HEADER_TYPES:
            return f"property {where!r}: {X_MCP_HEADER} is only allowed on string, integer or boolean properties"
        if token.lower() in seen:
            return f"property {where!r}: {X_MCP_HEADER} {token!r} duplicates property {seen[token.lower()]!r}"
        seen[token.lower()] = where
    return None


def param_headers(input_schema: Any, arguments: Mapping[str, Any]) -> dict[str, str]:
    """The ``Mcp-Param-<token>`` headers for a call: each annotated argument that is present, rendered
    (booleans as true/false) and encoded like any header value. Call only on a valid schema."""
    headers: dict[str, str] = {}
    for path, schema in _positions(input_schema):
        token = schema.get(X_MCP_HEADER)
        if not path or not isinstance(token, str):
            continue
        value: Any = arguments
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, bool):
            rendered = "true" if value else "false"
        elif isinstance(value, str | int | float):
            rendered = str(value)
        else:
            continue
        headers[PARAM_PREFIX + token] = encode_header_value(rendered)
    return headers
