"""One Chat Completions endpoint over httpx: one attempt, classified.

:meth:`Gateway.attempt` either returns a :class:`ModelReply`, raises :class:`Retryable` (refused, reset,
timeout, 408/409/429/5xx: the failover layer decides whether to retry here or move on), or raises
``IntelligenceError`` (authentication, other 4xx, malformed reply: retrying cannot help). Errors carry the
endpoint's display URL and the status, never headers or bodies that could hold the token or the prompt.
"""

from __future__ import annotations

import email.utils
import math
import ssl
import time
from collections.abc import Mapping
from typing import Final, Protocol, TypeVar

import attrs
import httpx
import trio

from agentd import telemetry
from agentd.errors import ConfigError, IntelligenceError
from agentd.formats import jsontext as json_text
from agentd.intelligence.endpoints import display
from agentd.intelligence.tally import current_tally
from agentd.intelligence.wire import MalformedReply, ModelReply, StreamAssembler, parse_completion
from agentd.mcp.sse import SseDecoder, SseError
from agentd.telemetry.events import EventLog
from agentd.transport.http_client import MetadataRefused
from agentd.transport.tls_errors import gateway_verify_hint

#: A reply larger than this is refused rather than buffered.
MAX_REPLY_BYTES: Final = 16 * 1024 * 1024
_DRAIN_AFTER_DONE: Final = 1.0
#: Seconds between ``intel.delta`` lines of one streamed reply (the text in between is told together).
DELTA_EVERY: Final = 0.1
_RETRYABLE_STATUS: Final = frozenset({408, 409, 425, 429})


class GatewayError(IntelligenceError):
    """A failure retrying cannot fix (auth, refused request, malformed reply); exit 4 like its parent."""

    def __init__(self, message: str, *, endpoint: str, status: int | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status


class Retryable(Exception):
    """A failure of one attempt that another endpoint may not have; ``retry_after`` is the server's hint in
    seconds, if any. ``here=False``: not worth another attempt at *this* endpoint (a certificate that did not
    verify will not verify in a second), only a failover to the next one."""

    def __init__(self, reason: str, *, status: int | None = None, retry_after: float | None = None,
                 here: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after
        self.here = here


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date; ``None`` if absent or garbage."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)


def _error_detail(body: bytes) -> str:
    """The gateway's own short error message (``error.message``), if it sent one."""
    try:
        parsed = json_text.loads(body, "replace")
    except ValueError:
        return ""
    error = parsed.get("error") if isinstance(parsed, Mapping) else None
    message = error.get("message") if isinstance(error, Mapping) else error
    return message[:200] if isinstance(message, str) else ""


class Resolver(Protocol):
    """Anything that expands a secret reference (``agentd.security.secrets.SecretResolver``)."""

    def resolve(self, template: str) -> str: ...


E = TypeVar("E", bound=BaseException)


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Does ``kind`` appear in the cause/context chain (httpx on trio wraps SSL errors twice)?"""
    return cause_in(exc, kind) is not None


def cause_in(exc: BaseException, kind: type[E]) -> E | None:
    """The first ``kind`` in ``exc``'s cause/context chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


@attrs.define(eq=False)
class BearerToken:
    """The resolved ``Authorization`` token and the reference it came from (never in a repr or an event).

    Resolved once at open; :meth:`refresh` re-reads the reference after a 401/403 so a rotated secret
    file or variable is picked up without restarting a long-running daemon.
    """

    template: str = attrs.field(repr=False)
    resolver: Resolver = attrs.field(repr=False)
    value: str = attrs.field(repr=False, default="")

    def __attrs_post_init__(self) -> None:
        if not self.value:
            self.value = self.resolver.resolve(self.template)

    def refresh(self) -> bool:
        """Re-resolve; True if the value changed. A reference that no longer resolves keeps the old value."""
        try:
            value = self.resolver.resolve(self.template)
        except ConfigError:
            return False
        changed = value != self.value
        self.value = value
        return changed


@attrs.define(eq=False)
class Gateway:
    """One endpoint. Shares the run's ``httpx.AsyncClient`` (building one costs ~26 ms)."""

    url: str
    client: httpx.AsyncClient
    log: EventLog
    token: BearerToken | None = None
    timeout: float = 120.0
    #: The parsed URL, the client's default headers and its timeout extension, built once (:meth:`_request`).
    _prepared: tuple[httpx.URL, httpx.Headers, dict[str, object]] | None = attrs.field(default=None, init=False)

    @property
    def name(self) -> str:
        return display(self.url)

    def _request(self, payload: bytes, headers: dict[str, str]) -> httpx.Request:
        """What ``client.build_request`` builds, byte for byte, without parsing the URL and merging the client's
        defaults on every call (half its CPU; it sits on every wake's path). A client holding cookies (a
        gateway's load balancer may set them) takes the general path, which sends them."""
        if self.client.cookies:
            return self.client.build_request("POST", self.url, content=payload, headers=headers)
        if self._prepared is None:
            self._prepared = (httpx.URL(self.url), httpx.Headers(self.client.headers),
                              {"timeout": self.client.timeout.as_dict()})
        url, defaults, extensions = self._prepared
        merged = defaults.copy()
        merged.update(headers)
        return httpx.Request("POST", url, content=payload, headers=merged, extensions=dict(extensions))

    async def attempt(self, payload: bytes, *, stream: bool) -> ModelReply:
        """POST one serialised request body; ``stream`` says whether it asked for SSE."""
        reply: ModelReply | None = None
        with trio.move_on_after(self.timeout):
            reply = await self._exchange(payload, stream)
        if reply is None:
            raise Retryable(f"no reply within {self.timeout:g} s")
        return reply

    async def _exchange(self, payload: bytes, stream: bool) -> ModelReply:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream, application/json" if stream else "application/json",
        }
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token.value}"
        telemetry.inject(headers)
        request = self._request(payload, headers)
        tally = current_tally()
        if tally is not None:
            tally.attempt(len(payload))
        try:
            response = await self.client.send(request, stream=True)
        except httpx.ConnectError as exc:
            refused = cause_in(exc, MetadataRefused)
            if refused is not None:
                raise self._fatal(str(refused)) from None
            failure = cause_in(exc, ssl.SSLCertVerificationError)
            if failure is not None:
                raise Retryable(f"TLS certificate verification failed: {gateway_verify_hint(failure)}",
                                here=False) from None
            if _caused_by(exc, ssl.SSLError):
                raise Retryable("TLS handshake failed", here=False) from None
            raise Retryable("connection refused or unreachable") from None
        except httpx.TimeoutException:
            raise Retryable("timed out") from None
        except httpx.HTTPError as exc:
            raise Retryable(f"transport error ({type(exc).__name__})") from None
        try:
            return await self._read(response)
        except httpx.TimeoutException:
            raise Retryable("timed out reading the reply") from None
        except httpx.HTTPError as exc:
            raise Retryable(f"the reply broke off ({type(exc).__name__})") from None
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await response.aclose()

    async def _read(self, response: httpx.Response) -> ModelReply:
        status = response.status_code
        if status >= 300:
            body = await self._body(response, limit=64 * 1024)
            self._classify_status(status, response.headers, body)
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "text/event-stream":
            return await self._read_stream(response)
        tally = current_tally()
        if tally is not None:
            tally.began()  # the gateway answers: the request is billed, whether or not its body is read
        body = await self._body(response, limit=MAX_REPLY_BYTES)
        try:
            parsed = json_text.loads(body, "replace")
        except ValueError:
            raise self._malformed(
                f"the reply is not JSON ({len(body)} bytes, content-type {content_type or 'none'})"
            )
        if isinstance(parsed, Mapping) and "error" in parsed and "choices" not in parsed:
            raise self._fatal(f"the gateway answered HTTP {status} with an error object")
        try:
            return parse_completion(parsed)
        except MalformedReply as exc:
            raise self._malformed(str(exc))

    async def _read_stream(self, response: httpx.Response) -> ModelReply:
        decoder = SseDecoder(max_event_bytes=MAX_REPLY_BYTES)
        assembler = StreamAssembler()
        tally = current_tally()
        if tally is not None:
            tally.began(assembler)  # a cut stream counts what it had streamed (agentd.intelligence.tally)
        done = False
        chunks = response.aiter_bytes()
        # With --log-content the text is told as it arrives (intel.delta), at most every DELTA_EVERY seconds.
        sent, told = 0, -DELTA_EVERY
        try:
            async for chunk in chunks:
                for event in decoder.feed(chunk):
                    data = event.data.strip()
                    if not data or done:
                        continue
                    if data == "[DONE]":
                        done = True
                        continue
                    try:
                        parsed = json_text.loads(data, "replace")
                    except ValueError:
                        raise self._malformed("a stream event is not JSON")
                    if isinstance(parsed, Mapping) and "error" in parsed and "choices" not in parsed:
                        raise self._fatal("the gateway sent an error object in the stream")
                    assembler.feed(parsed)
                if self.log.log_content and trio.current_time() - told >= DELTA_EVERY:
                    sent, told = self._tell(assembler, sent), trio.current_time()
                if done:
                    break
            if done:
                # Read the stream's end so the connection goes back to the pool instead of being
                # closed (a new connection per call costs more than the rest of the client);
                # a gateway that keeps the stream open after [DONE] is not waited for long.
                with trio.move_on_after(_DRAIN_AFTER_DONE):
                    async for _ in chunks:
                        pass
            if self.log.log_content:
                self._tell(assembler, sent)
            if not done and decoder.pending():
                raise Retryable("the stream was cut off mid-event")
            reply = assembler.reply()
            if not done and reply.finish_reason is None:
                # No [DONE] and no finish_reason: the connection ended mid-reply, not the model.
                raise Retryable("the stream ended before the reply was complete")
            return reply
        except SseError as exc:
            raise self._malformed(f"the event stream is invalid: {exc}")
        except MalformedReply as exc:
            raise self._malformed(str(exc))

    def _tell(self, assembler: StreamAssembler, sent: int) -> int:
        text, upto = assembler.text_since(sent)
        if text:
            self.log.info("intel.delta", endpoint=self.name, text=text)
        return upto

    async def _body(self, response: httpx.Response, *, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise self._malformed(f"the reply exceeds {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def _classify_status(self, status: int, headers: httpx.Headers, body: bytes) -> None:
        if status >= 500 or status in _RETRYABLE_STATUS:
            raise Retryable(
                f"HTTP {status}", status=status, retry_after=parse_retry_after(headers.get("retry-after"))
            )
        if status in (401, 403):
            raise self._fatal(
                f"the gateway rejected the credentials (HTTP {status}); check --intelligence-token",
                status=status,
            )
        detail = self.log.redactor.scrub(_error_detail(body))
        hint = {404: "; is the base URL right?"}.get(status, "")
        if 300 <= status < 400:
            hint = "; redirects are not followed, give the final URL"
        suffix = f": {detail}" if detail else ""
        raise self._fatal(f"the gateway refused the request (HTTP {status}){suffix}{hint}", status=status)

    def _fatal(self, message: str, *, status: int | None = None) -> GatewayError:
        return GatewayError(
            f"intelligence endpoint {self.name}: {message}", endpoint=self.name, status=status
        )

    def _malformed(self, message: str) -> GatewayError:
        return self._fatal(f"malformed reply: {message}")
