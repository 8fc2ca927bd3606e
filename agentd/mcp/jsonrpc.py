"""JSON-RPC 2.0 messages as MCP uses them, parsed from and serialised to JSON without I/O.

Parsing is strict about the envelope (a request id is a string or integer, never null; a result is an
object) and lenient about everything inside ``params`` and ``result``: unknown fields are kept.
A message that cannot be parsed raises :class:`InvalidMessage` carrying the JSON-RPC code to answer with.
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

import attrs

from agentd.formats import jsontext as text

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
RESOURCE_NOT_FOUND: Final = -32002
URL_ELICITATION_REQUIRED: Final = -32042
HEADER_MISMATCH: Final = -32020
MISSING_CLIENT_CAPABILITY: Final = -32021
UNSUPPORTED_PROTOCOL_VERSION: Final = -32022

RequestId: TypeAlias = int | str


@attrs.frozen
class Request:
    id: RequestId
    method: str
    params: dict[str, Any] | None = None


@attrs.frozen
class Notification:
    method: str
    params: dict[str, Any] | None = None


@attrs.frozen
class Response:
    id: RequestId
    result: dict[str, Any]


@attrs.frozen
class ErrorResponse:
    id: RequestId | None
    code: int
    message: str
    data: Any = None


Message: TypeAlias = Request | Notification | Response | ErrorResponse


class InvalidMessage(ValueError):
    """The bytes or object are not a valid JSON-RPC message; ``code`` is the error to answer with."""

    def __init__(self, message: str, code: int = INVALID_REQUEST, id: RequestId | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.id = id


def _valid_id(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def parse_message(obj: Any) -> Message:
    """Turn one decoded JSON value into a message, or raise :class:`InvalidMessage`."""
    if not isinstance(obj, dict):
        raise InvalidMessage("a JSON-RPC message must be an object")
    if obj.get("jsonrpc") != "2.0":
        raise InvalidMessage('"jsonrpc" must be "2.0"', id=obj.get("id") if _valid_id(obj.get("id")) else None)
    has_id = "id" in obj
    raw_id: Any = obj.get("id")
    if "method" in obj:
        method = obj["method"]
        if not isinstance(method, str) or not method:
            raise InvalidMessage('"method" must be a non-empty string', id=raw_id if _valid_id(raw_id) else None)
        params = obj.get("params")
        if params is not None and not isinstance(params, dict):
            raise InvalidMessage('"params" must be an object', INVALID_PARAMS, raw_id if _valid_id(raw_id) else None)
        if not has_id:
            return Notification(method, params)
        if not _valid_id(raw_id):
            raise InvalidMessage("a request id must be a string or an integer")
        return Request(raw_id, method, params)
    if "error" in obj:
        err = obj["error"]
        if not isinstance(err, dict) or not isinstance(err.get("code"), int) or isinstance(err.get("code"), bool):
            raise InvalidMessage('"error" must be an object with an integer "code"')
        message = err.get("message")
        return ErrorResponse(
            raw_id if _valid_id(raw_id) else None,
            err["code"],
            message if isinstance(message, str) else "",
            err.get("data"),
        )
    if "result" in obj:
        if not _valid_id(raw_id):
            raise InvalidMessage("a response id must be a string or an integer")
        result = obj["result"]
        if not isinstance(result, dict):
            raise InvalidMessage('"result" must be an object')
        return Response(raw_id, result)
    raise InvalidMessage("neither a request, a notification nor a response")


def loads(data: bytes | str, surrogates: text.Policy = "reject") -> Any:
    """Decode JSON, raising :class:`InvalidMessage` (-32700) on garbage.

    ``surrogates`` is :mod:`agentd.formats.jsontext`'s rule: ``"reject"`` a lone UTF-16 surrogate (what agentd
    serves) or ``"replace"`` it with U+FFFD (what agentd reads from a server it called).
    """
    try:
        return text.loads(data, surrogates)
    except text.LoneSurrogate:
        raise InvalidMessage("not JSON: a string holds a lone UTF-16 surrogate", PARSE_ERROR) from None
    except ValueError as exc:
        raise InvalidMessage(f"not JSON: {exc.__class__.__name__}", PARSE_ERROR) from None


def parse_body(data: bytes | str, surrogates: text.Policy = "reject") -> Message | list[Message]:
    """Parse an HTTP body: one message, or (only where the version allows it) a batch."""
    obj = loads(data, surrogates)
    if isinstance(obj, list):
        if not obj:
            raise InvalidMessage("an empty batch")
        return [parse_message(item) for item in obj]
    return parse_message(obj)


#: Error messages may quote what the peer sent (a method, a tool name, a bad value): they are cut here, so a
#: megabyte of bad input never comes back as a megabyte (or, escaped, two) of error.
MAX_ERROR_MESSAGE: Final = 256


def bounded(text: str, limit: int = MAX_ERROR_MESSAGE) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def to_dict(message: Message) -> dict[str, Any]:
    if isinstance(message, Request):
        out: dict[str, Any] = {"jsonrpc": "2.0", "id": message.id, "method": message.method}
        if message.params is not None:
            out["params"] = message.params
        return out
    if isinstance(message, Notification):
        out = {"jsonrpc": "2.0", "method": message.method}
        if message.params is not None:
            out["params"] = message.params
        return out
    if isinstance(message, Response):
        return {"jsonrpc": "2.0", "id": message.id, "result": message.result}
    error: dict[str, Any] = {"code": message.code, "message": bounded(message.message)}
    if message.data is not None:
        error["data"] = message.data
    return {"jsonrpc": "2.0", "id": message.id, "error": error}


def dumps(message: Message | list[Message]) -> bytes:
    if isinstance(message, list):
        return text.compact_utf8([to_dict(m) for m in message])
    return text.compact_utf8(to_dict(message))


def error_for(exc: InvalidMessage) -> ErrorResponse:
    return ErrorResponse(exc.id, exc.code, str(exc))
