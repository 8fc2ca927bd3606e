"""The A2A client: each declared peer's Agent Card fetched at start, then JSON-RPC over httpx on trio.

:func:`open_a2a_peers` mirrors :func:`agentd.client.pool.open_mcp_pool`: every peer's card is fetched
concurrently; a required peer that is unreachable or whose card is invalid raises :class:`A2aConnectError`
(exit 6, before the run has done anything), an optional one is logged (``a2a.card_failed``) and omitted.

A delegation (:meth:`A2aPeers.delegate`) streams when the card says it can (``SendStreamingMessage``), else
sends with ``returnImmediately`` and polls ``GetTask``; either way the task id is known at once, so a
delegation abandoned by the run (its deadline, a kill, the peer's own ``call_timeout``) is cancelled on the
peer with ``CancelTask``, shielded and bounded, as MCP calls are with ``notifications/cancelled``. Tasks
started with ``async`` and still running when the block ends are cancelled the same way. A stream that is
lost (a disconnect, or it ends before the task does) is followed again with ``SubscribeToTask`` at most
:data:`MAX_RESUBSCRIBES` times, then by ``GetTask`` polling; a card that offers an authenticated extended
card (``GetExtendedAgentCard``) is replaced by it, fetched with the peer's credentials.

Why not the ``a2a-sdk`` client: it runs under trio, but pulls in protobuf, pydantic, google-api-core and
json-rpc, which would more than double agentd's start-up imports for six JSON-RPC methods.
"""

from __future__ import annotations

import json
import secrets as _random
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from typing import Any, Final, TypeVar

import attrs
import httpx
import trio

from agentd.a2a import types as a2a
from agentd.config.model import McpServerConfig
from agentd.errors import A2aConnectError, A2aError, A2aRpcError, AgentdError
from agentd.formats import jsontext as json_text
from agentd.mcp.sse import SseDecoder, SseError
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from agentd.transport.egress import EgressPolicy
from agentd.transport.http_client import (
    DEFAULT_MAX_BODY,
    describe_error,
    display_url,
    new_client,
    tls_context,
)
from agentd.transport.tls import verify_for

_T = TypeVar("_T")

#: The bound on one non-streaming request (card, GetTask, CancelTask, a returnImmediately send).
REQUEST_TIMEOUT: Final = 30.0
#: The bound on the CancelTask sent when a delegation is abandoned (shielded).
CANCEL_TIMEOUT: Final = 5.0
#: Polling a non-streaming peer's task: first and longest interval (seconds).
POLL_FIRST: Final = 0.2
POLL_MAX: Final = 2.0
#: How often one delegation re-follows a lost stream with SubscribeToTask before it falls back to polling.
MAX_RESUBSCRIBES: Final = 3


class _StreamLost(A2aError):
    """The event stream broke off at the transport (not garbage): the task may well go on; follow it again."""


@attrs.define(eq=False)
class A2aPeer:
    """One connected peer: its card and a JSON-RPC channel to its interface."""

    config: McpServerConfig
    card: a2a.AgentCard
    client: httpx.AsyncClient
    headers: Mapping[str, str]
    log: EventLog
    max_body: int = DEFAULT_MAX_BODY

    @property
    def name(self) -> str:
        return self.config.name

    def _method(self, op: str) -> str:
        return a2a.METHODS[self.card.version][op]

    def _request_headers(self, accept: str) -> dict[str, str]:
        headers = {**self.headers, "Content-Type": "application/json", "Accept": accept}
        if self.card.version == a2a.V1:
            headers[a2a.VERSION_HEADER] = a2a.V1
        return headers

    def _body(self, op: str, params: Mapping[str, Any]) -> bytes:
        payload = {"jsonrpc": "2.0", "id": _random.token_hex(6), "method": self._method(op), "params": dict(params)}
        return json.dumps(payload, ensure_ascii=False).encode()

    def _check_status(self, response: httpx.Response, op: str) -> None:
        if response.status_code != 200:
            raise A2aError(
                f"A2A peer {self.name!r}: HTTP {response.status_code} for {self._method(op)}", peer=self.name
            )

    def _unwrap(self, message: Any, op: str) -> Any:
        method = self._method(op)
        if not isinstance(message, Mapping) or message.get("jsonrpc") != "2.0":
            raise A2aError(f"A2A peer {self.name!r}: not a JSON-RPC response to {method}", peer=self.name)
        error = message.get("error")
        if error is not None:
            if not isinstance(error, Mapping) or not isinstance(error.get("code"), int):
                raise A2aError(f"A2A peer {self.name!r}: malformed JSON-RPC error to {method}", peer=self.name)
            text = str(error.get("message", ""))[:300]
            raise A2aRpcError(error["code"], text, peer=self.name, method=method)
        if "result" not in message:
            raise A2aError(f"A2A peer {self.name!r}: a JSON-RPC response without result", peer=self.name)
        return message["result"]

    async def call(self, op: str, params: Mapping[str, Any]) -> Any:
        """One JSON-RPC request; the ``result``, or :class:`A2aRpcError`/:class:`A2aError`."""
        try:
            with trio.fail_after(REQUEST_TIMEOUT):
                async with self.client.stream(
                    "POST", self.card.rpc_url, content=self._body(op, params),
                    headers=self._request_headers("application/json"),
                ) as response:  # fmt: skip
                    self._check_status(response, op)
                    data = await _read_capped(response, self.max_body, self.name)
        except trio.TooSlowError:
            raise A2aError(f"A2A peer {self.name!r}: no answer to {self._method(op)} within {REQUEST_TIMEOUT:g}s",
                           peer=self.name) from None  # fmt: skip
        except httpx.HTTPError as exc:
            raise A2aError(f"A2A peer {self.name!r}: {describe_error(exc)}", peer=self.name) from None
        try:
            message = json_text.loads(data, "replace")
        except (ValueError, UnicodeDecodeError):
            raise A2aError(f"A2A peer {self.name!r}: the reply is not JSON", peer=self.name) from None
        return self._unwrap(message, op)

    async def stream(self, op: str, params: Mapping[str, Any]) -> AsyncGenerator[a2a.Event, None]:
        """A streaming request: each SSE ``data`` is one JSON-RPC response carrying an event."""
        try:
            async with self.client.stream(
                "POST", self.card.rpc_url, content=self._body(op, params),
                headers=self._request_headers("text/event-stream"),
            ) as response:  # fmt: skip
                self._check_status(response, op)
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if kind == "application/json":  # an error (or a peer that does not stream after all)
                    data = await _read_capped(response, self.max_body, self.name)
                    try:
                        yield a2a.parse_event(self._unwrap(json_text.loads(data, "replace"), op))
                    except a2a.A2aShapeError as exc:
                        raise A2aError(f"A2A peer {self.name!r}: {exc}", peer=self.name) from None
                    except ValueError:
                        raise A2aError(f"A2A peer {self.name!r}: the reply is not JSON", peer=self.name) from None
                    return
                if kind != "text/event-stream":
                    raise A2aError(f"A2A peer {self.name!r}: unexpected content type {kind[:60]!r}", peer=self.name)
                decoder = SseDecoder(max_event_bytes=self.max_body)
                appended = 0  # artifact bytes this stream added: an endless run of appends is bounded too
                async for chunk in response.aiter_bytes():
                    for event in decoder.feed(chunk):
                        if not event.data:
                            continue
                        try:
                            parsed = a2a.parse_event(self._unwrap(json_text.loads(event.data, "replace"), op))
                        except a2a.A2aShapeError as exc:
                            raise A2aError(f"A2A peer {self.name!r}: {exc}", peer=self.name) from None
                        except ValueError:
                            raise A2aError(f"A2A peer {self.name!r}: an event is not JSON", peer=self.name) from None
                        if isinstance(parsed, a2a.ArtifactUpdate):
                            appended += len(event.data)
                            if appended > self.max_body:
                                raise A2aError(f"A2A peer {self.name!r}: the streamed artifacts exceed "
                                               f"{self.max_body} bytes", peer=self.name)  # fmt: skip
                        yield parsed
        except SseError as exc:
            raise A2aError(f"A2A peer {self.name!r}: broken event stream ({exc})", peer=self.name) from None
        except httpx.HTTPError as exc:
            raise _StreamLost(f"A2A peer {self.name!r}: {describe_error(exc)}", peer=self.name) from None

    async def send(self, text: str, *, context_id: str | None, task_id: str | None = None) -> a2a.Task | a2a.Message:
        """SendMessage with ``returnImmediately``: the task as submitted (or the peer's direct reply)."""
        message = a2a.message_json(self.card.version, _random.token_hex(8), text, context_id=context_id,
                                   task_id=task_id)  # fmt: skip
        result = await self.call("send", a2a.send_params(self.card.version, message, return_immediately=True))
        return self._parsed(a2a.parse_result, result)

    def stream_send(self, text: str, *, context_id: str | None) -> AsyncGenerator[a2a.Event, None]:
        message = a2a.message_json(self.card.version, _random.token_hex(8), text, context_id=context_id)
        return self.stream("stream", a2a.send_params(self.card.version, message, return_immediately=False))

    def subscribe(self, task_id: str) -> AsyncGenerator[a2a.Event, None]:
        """SubscribeToTask: the stream of a task already running (after a lost stream)."""
        return self.stream("subscribe", a2a.task_params(task_id))

    async def extended_card(self) -> a2a.AgentCard:
        """GetExtendedAgentCard (with this peer's credentials), validated like the public card."""
        result = await self.call("extended_card", {})
        return self._parsed(lambda obj: a2a.parse_card(obj, self.config.url), result)

    async def get_task(self, task_id: str) -> a2a.Task:
        return self._parsed(a2a.parse_task_result, await self.call("get", a2a.task_params(task_id)))

    async def cancel_task(self, task_id: str) -> a2a.Task:
        return self._parsed(a2a.parse_task_result, await self.call("cancel", a2a.task_params(task_id)))

    def _parsed(self, parse: Callable[[Any], _T], result: Any) -> _T:
        try:
            return parse(result)
        except a2a.A2aShapeError as exc:
            raise A2aError(f"A2A peer {self.name!r}: {exc}", peer=self.name) from None


async def _read_capped(response: httpx.Response, limit: int, peer: str) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            raise A2aError(f"A2A peer {peer!r}: the reply exceeds {limit} bytes", peer=peer)
    return bytes(body)


def apply_event(task: a2a.Task | None, event: a2a.Event) -> a2a.Task | a2a.Message:
    """Fold one streamed event into the task seen so far (a Message ends the exchange on its own)."""
    if isinstance(event, a2a.Task | a2a.Message):
        return event
    if task is None:
        task = a2a.Task(id=event.task_id, context_id=event.context_id, state="submitted")
    if isinstance(event, a2a.StatusUpdate):
        return attrs.evolve(task, state=event.state, status_parts=event.status_parts or task.status_parts)
    artifacts = list(task.artifacts)
    for index, existing in enumerate(artifacts):
        if existing.artifact_id and existing.artifact_id == event.artifact.artifact_id:
            parts = existing.parts + event.artifact.parts if event.append else event.artifact.parts
            artifacts[index] = attrs.evolve(existing, parts=parts)
            break
    else:
        artifacts.append(event.artifact)
    return attrs.evolve(task, artifacts=tuple(artifacts))


@attrs.define(eq=False)
class A2aPeers:
    """The run's connected peers, and the tasks it started on them (cancelled if still open at the end)."""

    log: EventLog
    peers: dict[str, A2aPeer] = attrs.field(factory=dict)
    failed: dict[str, AgentdError] = attrs.field(factory=dict)
    #: task id -> peer name, for tasks not yet seen terminal.
    open_tasks: dict[str, str] = attrs.field(factory=dict)
    #: Tasks already reported ended (``a2a.task_end`` once per task, however often it is polled).
    ended: set[str] = attrs.field(factory=set)

    def peer(self, name: str) -> A2aPeer:
        peer = self.peers.get(name)
        if peer is None:
            known = ", ".join(self.peers) or "none"
            raise A2aError(f"no A2A peer named {name!r} (connected: {known})", peer=name)
        return peer

    def _seen(self, peer: A2aPeer, result: a2a.Task | a2a.Message) -> None:
        if isinstance(result, a2a.Message):
            return
        if result.terminal:
            self.open_tasks.pop(result.id, None)
            if result.id in self.ended:
                return
            self.ended.add(result.id)
            usage = a2a.reported_usage(result)  # the peer's tokens, not this run's: recorded, not counted
            self.log.emit(
                "a2a.task_end", "info" if result.state == "completed" else "warn", peer=peer.name,
                task_id=result.id, state=result.state, **({"usage": usage} if usage else {}),
            )  # fmt: skip
        else:
            self.open_tasks[result.id] = peer.name

    async def start(self, name: str, text: str, *, context_id: str | None) -> a2a.Task | a2a.Message:
        """Start a task and return at once (``a2a.delegate`` with ``async``)."""
        peer = self.peer(name)
        result = await peer.send(text, context_id=context_id)
        self.log.info("a2a.delegate", peer=name, mode="async", **_ids(result))
        self._seen(peer, result)
        return result

    async def status(self, name: str, task_id: str) -> a2a.Task:
        peer = self.peer(name)
        task = await peer.get_task(task_id)
        self._seen(peer, task)
        return task

    async def cancel(self, name: str, task_id: str, *, reason: str) -> a2a.Task:
        peer = self.peer(name)
        self.log.info("a2a.cancel", peer=name, task_id=task_id, reason=reason)
        task = await peer.cancel_task(task_id)
        self._seen(peer, task)
        return task

    async def delegate(self, name: str, text: str, *, context_id: str | None) -> a2a.Task | a2a.Message:
        """Send and wait for the task to end (or to need input), within the peer's ``call_timeout``.

        Raises:
            A2aError: a protocol or transport fault; :class:`trio.TooSlowError` past ``call_timeout``.
        """
        peer = self.peer(name)
        seen = _Seen()
        finished = False
        try:
            with trio.fail_after(peer.config.call_timeout):
                if peer.card.streaming:
                    events = peer.stream_send(text, context_id=context_id)
                    for attempt in range(MAX_RESUBSCRIBES + 1):
                        try:
                            await self._follow(peer, events, seen)
                        except _StreamLost:
                            if not isinstance(seen.current, a2a.Task):
                                raise  # lost before the task was known: nothing to follow
                        except A2aRpcError as exc:  # SubscribeToTask of a task that ended meanwhile: ask
                            if attempt == 0 or exc.code not in (a2a.UNSUPPORTED_OPERATION, a2a.TASK_NOT_FOUND):
                                raise
                            break
                        task = seen.current
                        if not isinstance(task, a2a.Task) or _settled(task) or attempt == MAX_RESUBSCRIBES:
                            break
                        self.log.info("a2a.resubscribe", peer=name, task_id=task.id, attempt=attempt + 1)
                        events = peer.subscribe(task.id)
                else:
                    seen.current = await peer.send(text, context_id=context_id)
                    self.log.info("a2a.delegate", peer=name, mode="poll", **_ids(seen.current))
                interval = POLL_FIRST  # no stream, or the streams gave out: poll
                while isinstance(seen.current, a2a.Task) and not _settled(seen.current):
                    self.open_tasks.setdefault(seen.current.id, name)
                    await trio.sleep(interval)
                    interval = min(interval * 2, POLL_MAX)
                    seen.current = await peer.get_task(seen.current.id)
            current = seen.current
            if current is None:
                raise A2aError(f"A2A peer {name!r}: the stream ended without a task or reply", peer=name)
            finished = True
            self._seen(peer, current)
            return current
        finally:
            last = seen.current
            if not finished and isinstance(last, a2a.Task) and not last.terminal:
                await self._abandon(peer, last.id, "the delegation was abandoned")

    async def _follow(self, peer: A2aPeer, stream: AsyncGenerator[a2a.Event, None], seen: _Seen) -> None:
        """Fold one stream's events into ``seen`` until the task settles or the stream ends (``seen`` is kept
        current event by event, so a delegation abandoned mid-stream knows which task to cancel)."""
        # aclosing: leaving the stream early (a terminal event) closes it here, not in the GC
        async with aclosing(stream) as events:
            async for event in events:
                first = seen.current is None
                current = apply_event(seen.current if isinstance(seen.current, a2a.Task) else None, event)
                seen.current = current
                if first:
                    self.log.info("a2a.delegate", peer=peer.name, mode="stream", **_ids(current))
                if isinstance(current, a2a.Task):
                    self.open_tasks.setdefault(current.id, peer.name)
                if isinstance(current, a2a.Message) or _settled(current):
                    return

    async def _abandon(self, peer: A2aPeer, task_id: str, reason: str) -> None:
        """CancelTask, shielded and bounded: the run is going away, the peer's work should too."""
        self.open_tasks.pop(task_id, None)
        self.log.info("a2a.cancel", peer=peer.name, task_id=task_id, reason=reason)
        with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_TIMEOUT):
            try:
                await peer.cancel_task(task_id)
            except A2aError as exc:
                self.log.warn("a2a.cancel_failed", peer=peer.name, task_id=task_id, error=str(exc))

    async def abandon_open(self) -> None:
        for task_id, name in list(self.open_tasks.items()):
            peer = self.peers.get(name)
            if peer is not None:
                await self._abandon(peer, task_id, "the run ended")


@attrs.define
class _Seen:
    """The task (or direct reply) a delegation has seen so far."""

    current: a2a.Task | a2a.Message | None = None


def _settled(task: a2a.Task) -> bool:
    return task.terminal or task.interrupted


def _ids(result: a2a.Task | a2a.Message) -> dict[str, str]:
    if isinstance(result, a2a.Message):
        return {"context_id": result.context_id}
    return {"task_id": result.id, "context_id": result.context_id, "state": result.state}


async def fetch_card(
    config: McpServerConfig, client: httpx.AsyncClient, headers: Mapping[str, str], max_body: int
) -> a2a.AgentCard:
    """GET the peer's ``/.well-known/agent-card.json`` (under the configured URL's path) and validate it."""
    url = config.url.rstrip("/") + a2a.CARD_PATH
    try:
        with trio.fail_after(config.connect_timeout):
            async with client.stream("GET", url, headers={**headers, "Accept": "application/json"}) as response:
                if response.status_code != 200:
                    raise A2aConnectError(
                        f"A2A peer {config.name!r}: HTTP {response.status_code} for the agent card", peer=config.name
                    )
                body = await _read_capped(response, max_body, config.name)
    except trio.TooSlowError:
        raise A2aConnectError(
            f"A2A peer {config.name!r}: no agent card within {config.connect_timeout:g}s", peer=config.name
        ) from None
    except httpx.HTTPError as exc:
        raise A2aConnectError(f"A2A peer {config.name!r}: unreachable ({describe_error(exc)})",
                              peer=config.name) from None
    except A2aConnectError:
        raise
    except A2aError as exc:
        raise A2aConnectError(str(exc), peer=config.name) from None
    try:
        return a2a.parse_card(json_text.loads(body, "replace"), config.url)
    except (ValueError, UnicodeDecodeError) as exc:
        reason = str(exc) if isinstance(exc, a2a.A2aShapeError) else "not JSON"
        raise A2aConnectError(f"A2A peer {config.name!r}: invalid agent card ({reason})", peer=config.name) from None


@asynccontextmanager
async def open_a2a_peers(
    declared: Iterable[McpServerConfig],
    *,
    log: EventLog,
    secrets: SecretResolver | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    egress: EgressPolicy | None = None,
) -> AsyncIterator[A2aPeers]:
    """Fetch every peer's card concurrently; yield the connected peers; cancel their open tasks at the end.

    Raises:
        A2aConnectError: a required peer is unreachable or its card is invalid (before anything is sent).
    """
    configs: Sequence[McpServerConfig] = list(declared)
    peers = A2aPeers(log.bind(comp="a2a"))
    async with AsyncExitStack() as stack:
        shared = None
        if configs:
            shared = await stack.enter_async_context(new_client(verify=verify_for(c.url for c in configs), egress=egress))

        async def connect(config: McpServerConfig) -> None:
            try:
                headers = secrets.resolve_headers(config.headers) if secrets is not None else dict(config.headers)
                client = shared
                if config.tls is not None and (config.tls.ca or config.tls.cert):
                    try:
                        own = new_client(verify=tls_context(config.tls.ca, config.tls.cert, config.tls.key), egress=egress)
                    except (OSError, ssl.SSLError) as exc:
                        raise A2aConnectError(f"A2A peer {config.name!r}: TLS material cannot be loaded "
                                              f"({type(exc).__name__})", peer=config.name) from None  # fmt: skip
                    client = await stack.enter_async_context(own)
                assert client is not None
                peer = A2aPeer(config, await fetch_card(config, client, headers, max_body), client, headers,
                               peers.log, max_body)  # fmt: skip
            except AgentdError as exc:
                failure = exc if isinstance(exc, A2aConnectError) else A2aConnectError(
                    f"A2A peer {config.name!r}: {exc}", peer=config.name)  # fmt: skip
                peers.failed[config.name] = failure
                peers.log.emit("a2a.card_failed", "error" if config.required else "warn", peer=config.name,
                               url=display_url(config.url), required=config.required, error=str(failure))  # fmt: skip
                return
            extended = False
            if peer.card.extended:  # the authenticated extended card replaces the public one
                try:
                    with trio.fail_after(config.connect_timeout):
                        peer.card, extended = await peer.extended_card(), True
                except (A2aError, trio.TooSlowError) as exc:
                    reason = str(exc) or f"no answer within {config.connect_timeout:g}s"
                    peers.log.warn("a2a.extended_card_failed", peer=config.name, error=reason)
            card = peer.card
            peers.peers[config.name] = peer
            peers.log.info(
                "a2a.card", peer=config.name, url=display_url(config.url), name=card.name, protocol=card.version,
                streaming=card.streaming, extended=extended, skills=[s.id for s in card.skills],
            )  # fmt: skip
            for skill in card.skills:  # untrusted peer text, recorded for audit like MCP tool descriptions
                peers.log.info("a2a.skill_description", peer=config.name, skill=skill.id,
                               description=peers.log.content(skill.description))  # fmt: skip

        async with trio.open_nursery() as nursery:
            for config in configs:
                nursery.start_soon(connect, config)
        peers.peers = {c.name: peers.peers[c.name] for c in configs if c.name in peers.peers}
        for config in configs:
            if config.required and config.name in peers.failed:
                raise peers.failed[config.name]
        try:
            yield peers
        finally:
            await peers.abandon_open()
