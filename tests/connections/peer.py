"""An in-process MCP server (2025-11-25, JSON responses) plus a tiny OAuth authorization server, for tests.

Real HTTP on 127.0.0.1 (hypercorn's trio worker), so the client, the auth flows and virtual time
(``autojump_clock``) all work. It records every request's headers, the ``notifications/cancelled`` it got
and every token request. Behaviour knobs (attributes, changeable mid-test):

* ``bearer``: the exact ``Authorization`` value required on /mcp (401 + ``WWW-Authenticate`` otherwise);
* ``valid_tokens``: for client credentials / oauth: accepted bearer tokens (401 otherwise);
* ``redirect``: answer /mcp with a 307 to /moved (which then serves MCP);
* ``never_answer``: hang every /mcp request (connect timeouts);
* ``echo_header``: a header name whose value every tool result repeats (a server echoing a credential).

Tools: ``search`` and ``read`` (echo their input), ``delete`` (annotated destructive), ``slow``
(sleeps ``seconds``). The AS lives under ``/as`` (issuer ``<origin>/as``) with RFC 9728 metadata at
``/.well-known/oauth-protected-resource/mcp`` and RFC 8414 metadata at
``/.well-known/oauth-authorization-server/as``.
"""

from __future__ import annotations

import base64
import itertools
import json
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from tests.peers.asgi import Receive, Send, lifespan, read_body, send_json, serve_loopback

TOOLS = [
    {
        "name": "search",
        "description": "Search documents.",
        "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "read",
        "description": "Read a document.",
        "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}},
    },
    {
        "name": "delete",
        "description": "Delete a document.",
        "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}},
        "annotations": {"readOnlyHint": True, "destructiveHint": True},
    },  # a lying server: never trusted
    {
        "name": "slow",
        "description": "Sleep, then answer.",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
    },
]


def _verify_jwt(assertion: str, public_key: Any) -> dict[str, Any]:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    head, body, sig = assertion.split(".")
    pad = lambda s: s + "=" * (-len(s) % 4)  # noqa: E731
    raw = base64.urlsafe_b64decode(pad(sig))
    der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    public_key.verify(der, f"{head}.{body}".encode(), ec.ECDSA(hashes.SHA256()))
    return json.loads(base64.urlsafe_b64decode(pad(body)))


@attrs.define(eq=False)
class PeerApp:
    origin: str = ""
    bearer: str | None = None
    valid_tokens: set[str] | None = None
    redirect: bool = False
    never_answer: bool = False
    client_id: str = "agent-client"
    client_secret: str = "s3cret-value-xyz"
    public_key: Any = None  # for private_key_jwt
    #: The authorization server the protected-resource metadata names (default: this peer's ``/as``).
    authorization_server: str | None = None
    auth_methods: list[str] = attrs.field(factory=lambda: ["client_secret_basic"])
    expires_in: int = 3600
    echo_header: str | None = None
    headers_seen: list[dict[str, str]] = attrs.field(factory=list)
    methods_seen: list[str] = attrs.field(factory=list)
    cancelled: list[Any] = attrs.field(factory=list)
    token_requests: list[dict[str, Any]] = attrs.field(factory=list)
    metadata_requests: list[str] = attrs.field(factory=list)
    calls: list[dict[str, Any]] = attrs.field(factory=list)
    called: trio.Event = attrs.field(factory=trio.Event)  # set at the first tools/call
    _tokens: itertools.count[int] = attrs.field(factory=itertools.count)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        path = scope["path"]
        if path.startswith("/.well-known/oauth-protected-resource"):
            self.metadata_requests.append(path)
            await send_json(
                send, 200, {"resource": f"{self.origin}/mcp",
                            "authorization_servers": [self.authorization_server or f"{self.origin}/as"]},
            )
        elif path.startswith("/.well-known/oauth-authorization-server"):
            self.metadata_requests.append(path)
            if path != "/.well-known/oauth-authorization-server/as":
                await send_json(send, 404, {"error": "not_found"})
                return
            await send_json(
                send,
                200,
                {
                    "issuer": f"{self.origin}/as",
                    "token_endpoint": f"{self.origin}/as/token",
                    "grant_types_supported": ["client_credentials"],
                    "token_endpoint_auth_methods_supported": self.auth_methods,
                },
            )
        elif path == "/as/token":
            await self._token(send, headers, body)
        elif path == "/mcp" or (path == "/moved" and self.redirect):
            await self._mcp(scope, send, headers, body, moved=path == "/moved")
        else:
            await send_json(send, 404, {"error": "not_found"})

    async def _token(self, send: Send, headers: dict[str, str], body: bytes) -> None:
        form = dict(urllib.parse.parse_qsl(body.decode()))
        record = {"form": form, "authorization": headers.get("authorization")}
        self.token_requests.append(record)
        ok = False
        auth = headers.get("authorization", "")
        if auth.startswith("Basic "):
            ident, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
            ok = (
                urllib.parse.unquote(ident) == self.client_id
                and urllib.parse.unquote(secret) == self.client_secret
            )
            record["method"] = "client_secret_basic"
        elif "client_secret" in form:
            ok = form.get("client_id") == self.client_id and form["client_secret"] == self.client_secret
            record["method"] = "client_secret_post"
        elif "client_assertion" in form:
            record["method"] = "private_key_jwt"
            try:
                claims = _verify_jwt(form["client_assertion"], self.public_key)
                record["claims"] = claims
                ok = claims["iss"] == claims["sub"] == self.client_id and claims["aud"] == f"{self.origin}/as"
            except Exception as exc:  # a bad signature is a refusal
                record["error"] = repr(exc)
        if form.get("grant_type") != "client_credentials" or not ok:
            await send_json(send, 401, {"error": "invalid_client"})
            return
        token = f"tok-{next(self._tokens)}"
        if self.valid_tokens is not None:
            self.valid_tokens.add(token)
        await send_json(send, 200, {"access_token": token, "token_type": "Bearer", "expires_in": self.expires_in})

    async def _mcp(
        self, scope: dict[str, Any], send: Send, headers: dict[str, str], body: bytes, *, moved: bool = False
    ) -> None:
        self.headers_seen.append(headers)
        if self.never_answer:
            await trio.sleep_forever()
        if self.redirect and not moved:
            await send(
                {
                    "type": "http.response.start",
                    "status": 307,
                    "headers": [(b"location", f"{self.origin}/moved".encode())],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        authorization = headers.get("authorization")
        if (self.bearer is not None and authorization != self.bearer) or (
            self.valid_tokens is not None
            and (authorization is None or authorization.removeprefix("Bearer ") not in self.valid_tokens)
        ):
            challenge = f'Bearer resource_metadata="{self.origin}/.well-known/oauth-protected-resource/mcp"'
            await send_json(send, 401, {"error": "invalid_token"}, [(b"www-authenticate", challenge.encode())])
            return
        if scope["method"] == "GET":
            await send_json(send, 405, {})
            return
        if scope["method"] == "DELETE":
            await send_json(send, 200, {})
            return
        message = json.loads(body)
        method = message.get("method")
        self.methods_seen.append(method)
        if "id" not in message:
            if method == "notifications/cancelled":
                self.cancelled.append(message.get("params"))
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        result: dict[str, Any]
        if method == "initialize":
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "peer", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            params = message["params"]
            self.calls.append({"name": params["name"], "arguments": params.get("arguments")})
            self.called.set()
            if params["name"] == "slow":
                # real time: the peer's slow tool, a call in flight for a real client
                await trio.sleep(float(params["arguments"].get("seconds", 1)))
            text = f"{params['name']}: {json.dumps(params.get('arguments'), sort_keys=True)}"
            if self.echo_header is not None:
                text += f" (you sent {self.echo_header}: {headers.get(self.echo_header.lower())})"
            result = {"content": [{"type": "text", "text": text}], "isError": False}
        elif method == "ping":
            result = {}
        else:
            await send_json(
                send,
                200,
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "error": {"code": -32601, "message": "no such method"},
                },
            )
            return
        extra = [(b"mcp-session-id", b"sess-1")] if method == "initialize" else []
        await send_json(send, 200, {"jsonrpc": "2.0", "id": message["id"], "result": result}, extra)




@asynccontextmanager
async def mcp_peer(**knobs: Any) -> AsyncIterator[PeerApp]:
    app = PeerApp(**knobs)
    async with serve_loopback(app) as origin:
        app.origin = origin
        yield app
