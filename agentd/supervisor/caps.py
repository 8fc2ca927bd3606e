"""The spawn chokepoint's rules, as pure bookkeeping: caps, depth minting, scope narrowing, the rate bucket.

A :class:`TreeLedger` lives in the root agent process only; nested children ask it through their channel
(see :mod:`agentd.supervisor.authority`), so there is exactly one place where a spawn is admitted.
Every decision returns data: an :class:`Admission` or a :class:`Refusal` whose text goes to the model as
an ``isError`` tool result so it can adapt.

Depth: a handle names its tree path (``0`` is the root, ``0.2.1`` the root's second child's first child,
``served.N`` a spawn made through the served self-MCP). ``depth(h)`` is the number of dots, so the root is
depth 0, and a caller at depth ``d`` may spawn only while ``d + 1 < max_depth``: with the default 4 the
tree holds at most four levels of agents, and the refusal reads ``max_depth=4 reached at handle 0.2.1.3``.
The depth is always computed from the caller's handle, never taken from a request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs


@attrs.frozen
class Caps:
    max_depth: int = 4
    max_children: int = 8
    max_subagents: int = 64
    token_ceiling: int = 2_000_000
    spawn_burst: int = 8
    spawn_rate: float = 2.0


@attrs.frozen
class Admission:
    handle: str
    depth: int
    scope: frozenset[str]


@attrs.frozen
class Refusal:
    """A refused spawn. ``retryable`` caps (rate, live counts) may admit the same request later."""

    message: str
    retryable: bool = False
    retry_after: float = 0.0


def depth_of(handle: str) -> int:
    return handle.count(".")


def parent_of(handle: str) -> str | None:
    head, dot, _ = handle.rpartition(".")
    return head if dot else None


def is_within(handle: str, ancestor: str) -> bool:
    """``handle`` is ``ancestor`` or one of its descendants (path prefix on whole components)."""
    return handle == ancestor or handle.startswith(ancestor + ".")


@attrs.define(eq=False)
class TokenBucket:
    """Spawn-rate limiter: ``burst`` tokens, refilled at ``rate`` per second of the given clock."""

    burst: int
    rate: float
    _tokens: float = attrs.field(init=False)
    _stamp: float | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._tokens = float(self.burst)

    def take(self, now: float) -> float:
        """Take one token: 0.0 on success, else the seconds until one will be available."""
        if self._stamp is not None and self.rate > 0:
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        if self.rate <= 0:
            return math.inf
        return (1.0 - self._tokens) / self.rate


@attrs.define(eq=False)
class TreeLedger:
    """Who is alive in the tree, with which scope, and how many tokens the tree has used."""

    caps: Caps
    root_scope: frozenset[str]
    root: str = "0"
    tokens_used: int = 0
    draining: bool = False
    _live: dict[str, frozenset[str]] = attrs.field(init=False, factory=dict)
    _minted: dict[str, int] = attrs.field(init=False, factory=dict)
    _bucket: TokenBucket = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._bucket = TokenBucket(self.caps.spawn_burst, self.caps.spawn_rate)

    @property
    def live(self) -> frozenset[str]:
        return frozenset(self._live)

    def scope_of(self, handle: str) -> frozenset[str] | None:
        if handle == self.root:
            return self.root_scope
        return self._live.get(handle)

    def admit(
        self, caller: str, tool_scope: Iterable[str] | None, now: float, *, served: bool = False
    ) -> Admission | Refusal:
        """Decide one spawn by ``caller``; on success the child is counted live until :meth:`release`."""
        if self.draining:
            return Refusal("spawn refused: draining, no new subagents are accepted")
        caller_scope = self.scope_of(caller)
        if caller_scope is None:
            return Refusal(f"spawn refused: unknown caller handle {caller}")
        if tool_scope is None:
            scope = caller_scope
        else:
            scope = frozenset(tool_scope)
            extra = sorted(scope - caller_scope)
            if extra:
                return Refusal(
                    f"spawn refused: tool_scope names servers outside the scope of handle {caller}: "
                    + ", ".join(extra)
                )
        depth = depth_of(caller) + 1
        if depth >= self.caps.max_depth:
            return Refusal(f"spawn refused: max_depth={self.caps.max_depth} reached at handle {caller}")
        if self.tokens_used >= self.caps.token_ceiling:
            return Refusal(
                f"spawn refused: token_ceiling={self.caps.token_ceiling} reached "
                f"(the tree used {self.tokens_used} tokens)"
            )
        if len(self._live) >= self.caps.max_subagents:
            return Refusal(
                f"spawn refused: max_subagents={self.caps.max_subagents} reached at handle {caller}",
                retryable=True,
            )
        parent = "served" if served else caller
        children = sum(1 for h in self._live if parent_of(h) == parent)
        if children >= self.caps.max_children:
            return Refusal(
                f"spawn refused: max_children={self.caps.max_children} reached at handle {caller}",
                retryable=True,
            )
        wait = self._bucket.take(now)
        if wait > 0:
            return Refusal(
                f"spawn refused: spawn rate limit (burst {self.caps.spawn_burst}, "
                f"{self.caps.spawn_rate:g}/s) at handle {caller}; retry in {wait:.1f} s",
                retryable=True,
                retry_after=wait,
            )
        n = self._minted.get(parent, 0) + 1
        self._minted[parent] = n
        handle = f"{parent}.{n}"
        self._live[handle] = scope
        return Admission(handle=handle, depth=depth_of(handle), scope=scope)

    def release(self, handle: str) -> None:
        """The subagent ended: it and anything still recorded under it stop counting."""
        for h in [h for h in self._live if is_within(h, handle)]:
            del self._live[h]

    def add_tokens(self, n: int) -> bool:
        """Count ``n`` more tokens used by the tree; True when the tree is now past the ceiling."""
        self.tokens_used += max(0, n)
        return self.tokens_used > self.caps.token_ceiling
