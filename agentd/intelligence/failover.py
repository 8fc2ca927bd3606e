"""Several endpoints behind one ``complete``: sticky primary, brief retries, a breaker per endpoint.

Policy (the original agentd's defaults):

* the *active* endpoint is sticky: calls go to the last endpoint that answered, and only a failure there
  moves them on (no flapping back to the first URL while it recovers);
* a transient failure (refused, reset, timeout, 408/409/429/5xx) is retried on the same endpoint twice,
  after 250 ms and 500 ms (each jittered by up to +-20 %, and at least the server's ``Retry-After``), then
  the next endpoint in list order is tried;
* each endpoint has a breaker: 3 consecutive failed attempts open it for a cooldown of 5 s, doubling on
  every re-open up to 60 s; after the cooldown one half-open probe is let through (no retries), whose
  success closes the breaker and resets the cooldown;
* when no endpoint can answer, ``IntelligenceError`` (exit 4). Authentication failures and malformed
  replies raise at once: another attempt would get the same answer.

Both waits are :func:`agentd.backoff.exponential`, the formula every retry loop in agentd uses: retry n
waits ``0.25 * 2**(n-1)`` s (capped at 0.5 s), the n-th opening since the last success ``5 * 2**(n-1)`` s
(capped at 60 s).

All time is ``trio.current_time()``, so tests drive it with a mock clock.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import attrs
import trio

from agentd.backoff import exponential
from agentd.errors import IntelligenceError
from agentd.intelligence.gateway import Gateway, GatewayError, Retryable
from agentd.intelligence.wire import ChatTool, ModelReply, Usage, encode_request
from agentd.telemetry import metrics
from agentd.telemetry.events import EventLog

#: Retries on the same endpoint after a transient failure, the first waiting ``RETRY_BASE`` seconds and each
#: later one twice the previous, up to ``RETRY_CAP`` (agentd.backoff).
RETRIES: Final = 2
RETRY_BASE: Final = 0.25
RETRY_CAP: Final = 0.5
JITTER: Final = 0.2
#: A ``Retry-After`` longer than this is not waited for here: the endpoint counts as down for now.
MAX_RETRY_AFTER: Final = 30.0
BREAKER_THRESHOLD: Final = 3
COOLDOWN_INITIAL: Final = 5.0
COOLDOWN_MAX: Final = 60.0
#: The retry jitter's source, one for the process: a ``random.Random`` holds its generator's whole state (about
#: 2.9 KiB), which a client per run (a cluster member's thousand waiting runs) would otherwise each carry.
_JITTER_RNG: Final = random.Random()


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@attrs.define(eq=False)
class Breaker:
    """A per-endpoint circuit breaker on trio's clock."""

    threshold: int = BREAKER_THRESHOLD
    initial: float = COOLDOWN_INITIAL
    maximum: float = COOLDOWN_MAX
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    #: Openings since the last success: the n-th waits ``exponential(n, initial, maximum)``.
    opens: int = 0
    cooldown: float = 0.0
    open_until: float = 0.0
    _probing: bool = False

    def allow(self) -> bool:
        """May an attempt go out now? Moves OPEN to HALF_OPEN once the cooldown is over (one probe)."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN and trio.current_time() >= self.open_until:
            self.state = BreakerState.HALF_OPEN
            self._probing = False
        if self.state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def success(self) -> bool:
        """Record a success; True if that closed an open or half-open breaker."""
        changed = self.state is not BreakerState.CLOSED
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.opens = 0
        self.cooldown = 0.0
        self._probing = False
        return changed

    def failure(self) -> bool:
        """Record a failed attempt; True if that opened the breaker."""
        self.failures += 1
        if self.state is BreakerState.HALF_OPEN or self.failures >= self.threshold:
            self.opens += 1
            self.cooldown = exponential(self.opens, self.initial, self.maximum)
            self.open_until = trio.current_time() + self.cooldown
            self.state = BreakerState.OPEN
            self._probing = False
            return True
        return False


@attrs.define(eq=False)
class FailoverIntelligence:
    """The gateway client behind ``open_intelligence`` for real endpoints."""

    gateways: Sequence[Gateway]
    model: str
    log: EventLog
    stream: bool = False
    rng: random.Random = _JITTER_RNG
    breakers: list[Breaker] = attrs.field(init=False)
    active: int = 0
    #: Usage summed over every reply this client produced.
    usage: Usage = attrs.field(factory=Usage)
    #: Closes the HTTP client's idle kept-alive connections (``agentd.transport.http_client.Client.release_idle``).
    release: Callable[[], Awaitable[object]] | None = None

    def __attrs_post_init__(self) -> None:
        self.breakers = [Breaker() for _ in self.gateways]

    async def complete(self, messages: list[dict[str, Any]], tools: Sequence[ChatTool]) -> ModelReply:
        payload = encode_request(self.model, messages, tools, stream=self.stream)
        count = len(self.gateways)
        last: Retryable | None = None
        for step in range(count):
            index = (self.active + step) % count
            if step > 0:
                metrics.failover()
                self.log.warn(
                    "intel.failover",
                    endpoint=self.gateways[index].name,
                    previous=self.gateways[(index - 1) % count].name,
                    reason=last.reason if last else "circuit open",
                )
            reply, failure = await self._try_endpoint(index, payload, messages, tools)
            if reply is not None:
                self.active = index
                self.usage += reply.usage
                return reply
            last = failure or last
        reason = last.reason if last else "every circuit breaker is open"
        self.log.error("intel.error", reason=reason, endpoints=count)
        noun = "the intelligence endpoint is" if count == 1 else f"all {count} intelligence endpoints are"
        raise IntelligenceError(f"{noun} unavailable (last failure: {reason})")

    async def release_idle(self) -> None:
        """Let go of the connections kept alive to the gateways, if none is in use (agentd.intelligence.release_idle)."""
        if self.release is not None:
            await self.release()

    async def _try_endpoint(
        self, index: int, payload: bytes, messages: Sequence[Any], tools: Sequence[ChatTool]
    ) -> tuple[ModelReply | None, Retryable | None]:
        gateway, breaker = self.gateways[index], self.breakers[index]
        failure: Retryable | None = None
        refreshed = False  # a 401/403 re-reads the token once; that retry is part of the same attempt
        attempt_again = False
        attempt = 0
        while True:
            if not attempt_again and not breaker.allow():
                if attempt == 0:
                    self.log.info("intel.breaker", endpoint=gateway.name, state="skipped_open")
                return None, failure
            attempt_again = False
            probe = breaker.state is BreakerState.HALF_OPEN
            if probe:
                self.log.info("intel.breaker", endpoint=gateway.name, state="half_open")
                metrics.breaker(gateway.name, "half_open")
            self.log.info(
                "intel.call",
                endpoint=gateway.name,
                model=self.model,
                attempt=attempt + 1,
                messages=len(messages),
                tools=len(tools),
                stream=self.stream,
                body=self.log.content(payload),
            )
            started = trio.current_time()
            try:
                reply = await gateway.attempt(payload, stream=self.stream)
            except Retryable as exc:
                failure = exc
                if breaker.failure():
                    metrics.breaker(gateway.name, "open")
                    self.log.warn(
                        "intel.breaker",
                        endpoint=gateway.name,
                        state="open",
                        cooldown_s=breaker.cooldown,
                        reason=exc.reason,
                    )
                    return None, failure
                if attempt == RETRIES or probe or not exc.here:
                    return None, failure
                delay = self._delay(exponential(attempt + 1, RETRY_BASE, RETRY_CAP), exc.retry_after)
                if delay is None:
                    return None, failure
                self.log.warn(
                    "intel.retry",
                    endpoint=gateway.name,
                    attempt=attempt + 1,
                    delay_s=round(delay, 3),
                    reason=exc.reason,
                    status=exc.status,
                )
                await trio.sleep(delay)
                attempt += 1
                continue
            except GatewayError as exc:
                if exc.status in (401, 403) and not refreshed and gateway.token is not None:
                    refreshed = True
                    if gateway.token.refresh():
                        attempt_again = True
                        # The secret was rotated since it was read: one more try with the new value.
                        self.log.warn(
                            "intel.retry",
                            endpoint=gateway.name,
                            attempt=attempt + 1,
                            delay_s=0.0,
                            reason="credentials rotated",
                            status=exc.status,
                        )
                        continue
                breaker.failure()
                self.log.error("intel.error", endpoint=gateway.name, reason=str(exc))
                raise
            if breaker.success():
                self.log.info("intel.breaker", endpoint=gateway.name, state="closed")
                metrics.breaker(gateway.name, "closed")
            self.log.info(
                "intel.result",
                endpoint=gateway.name,
                finish_reason=reply.finish_reason,
                tool_calls=len(reply.tool_calls),
                content=self.log.content(reply.content or ""),
                prompt_tokens=reply.usage.prompt_tokens,
                completion_tokens=reply.usage.completion_tokens,
                elapsed_ms=round((trio.current_time() - started) * 1000, 1),
            )
            return reply, None

    def _delay(self, base: float, retry_after: float | None) -> float | None:
        jittered = base * (1 + self.rng.uniform(-JITTER, JITTER))
        if retry_after is None:
            return jittered
        if retry_after > MAX_RETRY_AFTER:
            return None
        return max(jittered, retry_after)
