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

The token ceiling is per *run tree*: a root run and everything it spawns. A long-lived supervisor (a
daemon's, shared by its wakes and its served spawns) holds several trees: each root-level spawn is
admitted into the caller's tree (``tree=``, default ``""``, the once-mode run), each served spawn
(``served.N``) is a tree of its own, and a nested spawn belongs to its top-level ancestor's tree.
``tokens_used`` stays the supervisor's total over all trees.

Within a run tree the ceiling is a ledger with reservations (agentd.journal.ledger): each spawn of the
agent's own tree reserves a slice for the child out of what its parent has left (``budget``, default an
even share of it among the child slots the parent has free, so a fan-out within ``max_children`` is never
starved by the slices before it); the child's usage is charged to its slice, a child
past its slice is reported like a tree past its ceiling (its subtree is cancelled), and what a child
did not spend is refunded when it is released. Served trees (``served.N``) keep a plain count.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import attrs

from agentd import defaults
from agentd.journal.ledger import ROOT, Ledger, Overdrawn
from agentd.rule_of_two import check_trifecta

#: Token counts of at most this many run trees are kept (a daemon makes one per wake); the oldest go first.
TREES_KEPT: Final = 1024


@attrs.frozen
class Caps:
    max_depth: int = defaults.MAX_DEPTH
    max_children: int = defaults.MAX_CHILDREN
    max_subagents: int = defaults.MAX_SUBAGENTS
    token_ceiling: int = defaults.TOKEN_CEILING
    spawn_burst: int = defaults.SPAWN_BURST
    spawn_rate: float = defaults.SPAWN_RATE


@attrs.frozen
class Admission:
    handle: str
    depth: int
    scope: frozenset[str]
    #: The token slice reserved for the child (None: a served spawn, counted but not reserved).
    budget: int | None = None


@attrs.frozen
class Refusal:
    """A refused spawn. ``retryable`` caps (rate, live counts) may admit the same request later."""

    message: str
    retryable: bool = False
    retry_after: float = 0.0
    #: Which rule refused (``max_subagents``, ``spawn_rate``, ``draining``, ...): machine-readable, counted
    #: by cap in the served ``agent://status``; "" for a refusal that is no cap (an unknown handle).
    cap: str = ""


def depth_of(handle: str) -> int:
    return handle.count(".")


def parent_of(handle: str) -> str | None:
    head, dot, _ = handle.rpartition(".")
    return head if dot else None


def top_of(handle: str) -> str:
    """The root-level subagent whose subtree holds ``handle`` (``0.3.1`` -> ``0.3``, ``served.2.1`` ->
    ``served.2``); a root handle is its own."""
    return ".".join(handle.split(".")[:2])


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
    #: Rule-of-Two tags by server (None: untagged). A child's scope that brings all three properties is
    #: refused, whatever the root was allowed: ``--allow-trifecta`` is never inherited.
    server_tags: Mapping[str, Sequence[str] | None] = attrs.field(factory=dict)
    _live: dict[str, frozenset[str]] = attrs.field(init=False, factory=dict)
    #: Live children per parent handle (what ``max_children`` counts), kept with ``_live``: counting them by
    #: a scan made each admission O(live subagents), which a tree of hundreds felt.
    _children: dict[str, int] = attrs.field(init=False, factory=dict)
    _minted: dict[str, int] = attrs.field(init=False, factory=dict)
    #: Root-level subagent handle -> its run tree; run tree -> tokens it used (bounded, oldest first out).
    _tree_of: dict[str, str] = attrs.field(init=False, factory=dict)
    _tree_tokens: OrderedDict[str, int] = attrs.field(init=False, factory=OrderedDict)
    #: Run tree -> its reservation books (the agent's own trees; bounded like the counts).
    _books: OrderedDict[str, Ledger] = attrs.field(init=False, factory=OrderedDict)
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

    def tree_of(self, handle: str, tree: str = "") -> str:
        """The run tree ``handle``'s usage counts in; ``tree`` names the root's own run (its caller)."""
        if handle == self.root:
            return tree
        return self._tree_of.get(top_of(handle), tree)

    def tree_tokens(self, tree: str = "") -> int:
        return self._tree_tokens.get(tree, 0)

    def book(self, tree: str) -> Ledger:
        """Run tree ``tree``'s reservation books (opened on first use, with the whole ceiling free)."""
        book = self._books.get(tree)
        if book is None:
            book = self._books[tree] = Ledger(self.caps.token_ceiling)
            while len(self._books) > TREES_KEPT:
                self._books.popitem(last=False)
        else:
            self._books.move_to_end(tree)  # most recently used last: a busy tree is never the one forgotten
        return book

    def adopt(self, tree: str, book: Ledger) -> list[str]:
        """Take over ``tree``'s books as an earlier process saved them: its subagents did not survive, so
        their slices end (spent booked, the rest refunded); returns their handles. The tree's count starts
        from what the books say was spent."""
        ended: list[str] = []
        for handle in book.open_handles():
            if handle != ROOT and handle in book:
                ended.extend(book.end(handle).ended)
        self._books[tree] = book
        self._tree_tokens[tree] = max(self._tree_tokens.get(tree, 0), book.committed())
        return ended

    def existing_book(self, tree: str) -> Ledger | None:
        return self._books.get(tree)

    def _slice(self, handle: str) -> str:
        return ROOT if handle == self.root else handle

    def admit(
        self, caller: str, tool_scope: Iterable[str] | None, now: float, *, served: bool = False, tree: str = "",
        budget: int | None = None,
    ) -> Admission | Refusal:
        """Decide one spawn by ``caller`` in run tree ``tree`` (the root's run; nested callers use their
        ancestor's); on success the child is counted live until :meth:`release`. ``budget`` is the token
        slice asked for (default a share of what the caller has left; ignored for a served spawn)."""
        if self.draining:
            return Refusal("spawn refused: draining, no new subagents are accepted", cap="draining")
        caller_scope = self.scope_of(caller)
        if caller_scope is None:
            return Refusal(f"spawn refused: unknown caller handle {caller}", cap="caller")
        if tool_scope is None:
            scope = caller_scope
        else:
            scope = frozenset(tool_scope)
            extra = sorted(scope - caller_scope)
            if extra:
                return Refusal(
                    f"spawn refused: tool_scope names servers outside the scope of handle {caller}: "
                    + ", ".join(extra),
                    cap="tool_scope",
                )
        # The Rule of Two judges the MCP servers in the scope (server_tags has one entry per MCP server; A2A
        # peers may be in a scope too, as at the root, where they are not tagged).
        trifecta = check_trifecta({name: self.server_tags[name] for name in scope if name in self.server_tags})
        if trifecta.complete:
            return Refusal(
                "spawn refused: the child's tool_scope brings untrusted input, sensitive data and external "
                f"communication (Rule of Two; {trifecta.describe()}); narrow tool_scope",
                cap="rule_of_two",
            )
        depth = depth_of(caller) + 1
        if depth >= self.caps.max_depth:
            return Refusal(f"spawn refused: max_depth={self.caps.max_depth} reached at handle {caller}",
                           cap="max_depth")
        tree = self.tree_of(caller, tree)
        used = 0 if served else self.tree_tokens(tree)
        if used >= self.caps.token_ceiling:
            return Refusal(
                f"spawn refused: token_ceiling={self.caps.token_ceiling} reached "
                f"(the tree used {used} tokens)",
                cap="token_ceiling",
            )
        if len(self._live) >= self.caps.max_subagents:
            return Refusal(
                f"spawn refused: max_subagents={self.caps.max_subagents} reached at handle {caller}",
                retryable=True, cap="max_subagents",
            )
        parent = "served" if served else caller
        children = self._children.get(parent, 0)
        if children >= self.caps.max_children:
            return Refusal(
                f"spawn refused: max_children={self.caps.max_children} reached at handle {caller}",
                retryable=True, cap="max_children",
            )
        slice_of = None
        if not served and not tree.startswith("served."):  # a served tree keeps a plain count
            book = self.book(tree)
            slice_of = self._slice(caller) if self._slice(caller) in book else None
        want = 0
        if slice_of is not None:
            left = self.book(tree).available(slice_of)
            free_slots = max(1, self.caps.max_children - children)
            want = budget if budget is not None else left // free_slots
            if want <= 0 or want > left:
                return Refusal(
                    f"spawn refused: token_budget={want} does not fit: handle {caller} has {max(0, left)} tokens "
                    f"left of token_ceiling={self.caps.token_ceiling}",
                    cap="token_budget",
                )
        wait = self._bucket.take(now)
        if wait > 0:
            return Refusal(
                f"spawn refused: spawn rate limit (burst {self.caps.spawn_burst}, "
                f"{self.caps.spawn_rate:g}/s) at handle {caller}; retry in {wait:.1f} s",
                retryable=True,
                retry_after=wait, cap="spawn_rate",
            )
        n = self._minted.get(parent, 0) + 1
        self._minted[parent] = n
        handle = f"{parent}.{n}"
        self._live[handle] = scope
        self._children[parent] = children + 1
        if handle == top_of(handle):
            self._tree_of[handle] = handle if served else tree
        if slice_of is not None:
            self.book(tree).reserve(handle, want, parent=slice_of)
        return Admission(handle=handle, depth=depth_of(handle), scope=scope, budget=want or None)

    def mint_after(self, parent: str, n: int) -> None:
        """Mint ``parent``'s next handles after ``parent.n`` (a restarted daemon's journaled served handles)."""
        self._minted[parent] = max(self._minted.get(parent, 0), n)

    def release(self, handle: str) -> None:
        """The subagent ended: it and anything still recorded under it stop counting; its slice (and any
        still open under it) is closed: spent booked to its parent, the rest refunded."""
        book = self._books.get(self.tree_of(handle))
        if book is not None and handle in book:
            book.end(handle)
        for h in [h for h in self._live if is_within(h, handle)]:
            del self._live[h]
            parent = parent_of(h)
            if parent is not None:
                left = self._children.get(parent, 0) - 1
                if left > 0:
                    self._children[parent] = left
                else:
                    self._children.pop(parent, None)
        self._tree_of.pop(handle, None)  # a root-level subagent ended: its tree's count stays

    def add_tokens(self, n: int, handle: str | None = None, tree: str = "") -> bool:
        """Count ``n`` more tokens used by ``handle`` (default the root, in run tree ``tree``); True when its
        run tree is now past the ceiling."""
        n = max(0, n)
        self.tokens_used += n
        who = self.root if handle is None else handle
        key = self.tree_of(who, tree)
        total = self._tree_tokens.pop(key, 0) + n
        self._tree_tokens[key] = total  # most recently used last
        while len(self._tree_tokens) > TREES_KEPT:
            self._tree_tokens.popitem(last=False)
        book = None if key.startswith("served.") else self.book(key)
        overdrawn = False
        if book is not None and self._slice(who) in book:
            overdrawn = isinstance(book.charge(self._slice(who), n), Overdrawn) and who != self.root
        return overdrawn or total > self.caps.token_ceiling

    def tree_key(self, handle: str, tree: str = "") -> str:
        """The run tree ``handle`` (default the root, in ``tree``) counts in: what :meth:`book` is keyed by."""
        return self.tree_of(handle, tree)
