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

Within a run tree the ceiling is a ledger with reservations (agentd.journal.ledger): each spawn reserves a
slice for the child out of what its parent has left (``budget``, default :func:`default_slice`); the
child's usage is charged to its slice, a child past its slice is reported like a tree past its ceiling (its
subtree is cancelled), and what a child did not spend is refunded when it is released.

The money budget (``--budget-usd``, in picodollars: agentd.prices) is a second set of books beside the
tokens', the same :class:`~agentd.journal.ledger.Ledger` with the same rules: each spawn reserves a money
slice out of what its caller has left (an even share of it, like the default token slice), a reply's cost
is charged to the slice of the run that made it (the child prices it with its own model), a child past its
money slice is cancelled, what it did not spend is refunded at its release, and the run tree's books are
saved and restored with the tokens' (agentd.supervisor.authority). A caller with no money left cannot spawn
(``budget_usd``). A reply's tokens and its cost are charged in one pass (:meth:`TreeLedger.charge_reply`).

A served spawn (``served.N``) opens a run tree of its own whose books have ``served.N`` as their root: their
ceiling is the spawn's ``budget`` (at most ``token_ceiling``; default the whole ceiling), its children
(``served.N.1`` ...) reserve slices from it like the agent's own. A served warm session re-opened after a
restart is admitted into its earlier tree (``tree="served.N"``): the new handle is that tree's root again, so
the session's spend across the crash stays within the one ceiling.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import attrs

from agentd import defaults
from agentd.prices import BUDGET_USD
from agentd.security.rule_of_two import check_trifecta

if TYPE_CHECKING:  # the books load with the first admission or usage report (a once run's first reply)
    from agentd.journal.ledger import Charged, Ledger, Overdrawn

#: The books' root slice (agentd.journal.ledger.ROOT, which the ledger tests hold equal): the slice name a usage
#: report charges for the root, spelled here so the hot path imports nothing per call.
ROOT_SLICE: Final = "root"

#: Token counts of at most this many run trees are kept (a daemon makes one per wake); the oldest go first.
TREES_KEPT: Final = 1024


@attrs.frozen
class Caps:
    max_depth: int = defaults.MAX_DEPTH
    max_children: int = defaults.MAX_CHILDREN
    max_subagents: int = defaults.MAX_SUBAGENTS
    token_ceiling: int = defaults.TOKEN_CEILING
    #: The money budget of each run tree, in picodollars (agentd.prices); None: no money budget.
    budget_usd: int | None = None
    spawn_burst: int = defaults.SPAWN_BURST
    spawn_rate: float = defaults.SPAWN_RATE


@attrs.frozen
class Admission:
    handle: str
    depth: int
    scope: frozenset[str]
    #: The token slice reserved for the child (a served spawn: its tree's ceiling, or what a re-opened
    #: session's tree has left).
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


def is_served_root(handle: str) -> bool:
    """``served.N``: the root of a served run tree (its books' ``ROOT``)."""
    return handle.startswith("served.") and depth_of(handle) == 1


def default_slice(left: int, free_slots: int, child_depth: int, max_depth: int, ceiling: int,
                  live_children: int = 0) -> int:
    """The slice a spawn without ``budget`` reserves, out of the ``left`` tokens its caller has.

    An even share among the caller itself and its ``free_slots`` free child slots, so a fan-out as wide as
    ``max_children`` is never starved by the slices before it and the caller keeps a share for its own
    turns. When that share is too thin to run a turn (below ``SLICE_MIN``, or 1/``SLICE_MIN_PARTS`` of a
    smaller ceiling: a wide ``--max-children``, or deep in the tree), the child may instead get enough for a
    turn at each level it may still spawn below (``SLICE_MIN`` doubled per level), but never more than an even
    share among the caller, its ``live_children`` and the new child: a deep chain keeps a usable slice at
    every level instead of dividing by ``max_children`` per level, and a fan-out wider than the budget funds
    gets smaller slices as it grows, never a refusal while tokens are left.
    """
    share = left // (max(0, free_slots) + 1)
    least = max(1, min(defaults.SLICE_MIN, ceiling // defaults.SLICE_MIN_PARTS))
    if share >= least:
        return share
    levels = min(max(0, max_depth - 1 - child_depth), 32)
    return max(share, min(least << levels, left // (max(0, live_children) + 2)))


def is_within(handle: str, ancestor: str) -> bool:
    """``handle`` is ``ancestor`` or one of its descendants (path prefix on whole components)."""
    return handle == ancestor or handle.startswith(ancestor + ".")


class TokenBucket:
    """Spawn-rate limiter: ``burst`` tokens, refilled at ``rate`` per second of the given clock. (A plain class,
    like the authorities: the supervisor modules load at a once run's start-up.)"""

    __slots__ = ("_stamp", "_tokens", "burst", "rate")

    def __init__(self, burst: int, rate: float) -> None:
        self.burst = burst
        self.rate = rate
        self._tokens = float(burst)
        self._stamp: float | None = None

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


class TreeLedger:
    """Who is alive in the tree, with which scope, and how many tokens the tree has used. (A plain class, like
    the token bucket.)"""

    __slots__ = ("_books", "_bucket", "_children", "_live", "_minted", "_money", "_tree_of", "_tree_tokens", "caps",
                 "draining", "root", "root_scope", "server_tags", "tokens_used")

    def __init__(self, caps: Caps, root_scope: frozenset[str], root: str = "0", tokens_used: int = 0,
                 draining: bool = False, server_tags: Mapping[str, Sequence[str] | None] | None = None) -> None:
        self.caps = caps
        self.root_scope = root_scope
        self.root = root
        self.tokens_used = tokens_used
        self.draining = draining
        #: Rule-of-Two tags by server (None: untagged). A child's scope that brings all three properties is
        #: refused, whatever the root was allowed: ``--allow-trifecta`` is never inherited.
        self.server_tags: Mapping[str, Sequence[str] | None] = {} if server_tags is None else server_tags
        self._live: dict[str, frozenset[str]] = {}
        #: Live children per parent handle (what ``max_children`` counts), kept with ``_live``: counting them
        #: by a scan made each admission O(live subagents), which a tree of hundreds felt.
        self._children: dict[str, int] = {}
        self._minted: dict[str, int] = {}
        #: Root-level subagent handle -> its run tree; run tree -> tokens it used (bounded, oldest first out).
        self._tree_of: dict[str, str] = {}
        self._tree_tokens: OrderedDict[str, int] = OrderedDict()
        #: Run tree -> its reservation books (the agent's own trees; bounded like the counts).
        self._books: OrderedDict[str, Ledger] = OrderedDict()
        #: Run tree -> its money books (``caps.budget_usd``), kept like the token books.
        self._money: OrderedDict[str, Ledger] = OrderedDict()
        self._bucket = TokenBucket(caps.spawn_burst, caps.spawn_rate)

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

    def book(self, tree: str, ceiling: int | None = None) -> Ledger:
        """Run tree ``tree``'s reservation books (opened on first use with ``ceiling``, default the whole
        token ceiling, free)."""
        book = self._books.get(tree)
        if book is None:
            from agentd.journal.ledger import Ledger

            book = self._books[tree] = Ledger(self.caps.token_ceiling if ceiling is None else ceiling)
            while len(self._books) > TREES_KEPT:
                self._books.popitem(last=False)
        else:
            self._books.move_to_end(tree)  # most recently used last: a busy tree is never the one forgotten
        return book

    def money(self, tree: str) -> Ledger | None:
        """Run tree ``tree``'s money books (opened on first use with the whole ``budget_usd``, free), or None
        when there is no money budget."""
        if self.caps.budget_usd is None:
            return None
        book = self._money.get(tree)
        if book is None:
            from agentd.journal.ledger import Ledger

            book = self._money[tree] = Ledger(self.caps.budget_usd)
            while len(self._money) > TREES_KEPT:
                self._money.popitem(last=False)
        else:
            self._money.move_to_end(tree)
        return book

    def existing_money(self, tree: str) -> Ledger | None:
        return self._money.get(tree)

    def adopt(self, tree: str, book: Ledger, money: Ledger | None = None) -> list[str]:
        """Take over ``tree``'s books (its token books and, when saved, its money books) as an earlier process
        saved them: its subagents did not survive, so their slices end (spent booked, the rest refunded);
        returns their handles. The tree's count starts from what the books say was spent."""
        from agentd.journal.ledger import ROOT

        ended: list[str] = []
        for handle in book.open_handles():
            if handle != ROOT and handle in book:
                ended.extend(book.end(handle).ended)
        if money is not None and self.caps.budget_usd is not None:
            for handle in money.open_handles():
                if handle != ROOT and handle in money:
                    money.end(handle)
            self._money[tree] = money
        self._books[tree] = book
        self._tree_tokens[tree] = max(self._tree_tokens.get(tree, 0), book.committed() + book.overdrawn())
        return ended

    def existing_book(self, tree: str) -> Ledger | None:
        return self._books.get(tree)

    def ceiling_of(self, tree: str) -> int:
        """Run tree ``tree``'s ceiling: its books' (a served tree's may be a slice of ``token_ceiling``)."""
        book = self._books.get(tree)
        return self.caps.token_ceiling if book is None else min(book.ceiling, self.caps.token_ceiling)

    def _slice(self, handle: str) -> str:
        """The slice ``handle`` spends from (the root's and a served root's: the books' root slice). On every
        usage report: the books' root name is :data:`ROOT_SLICE`, not imported here per call."""
        return ROOT_SLICE if handle == self.root or is_served_root(handle) else handle

    def admit(
        self, caller: str, tool_scope: Iterable[str] | None, now: float, *, served: bool = False, tree: str = "",
        budget: int | None = None, handle: str | None = None,
    ) -> Admission | Refusal:
        """Decide one spawn by ``caller`` in run tree ``tree`` (the root's run; nested callers use their
        ancestor's; a served spawn opens its own, or names a re-opened session's earlier one); on success the
        child is counted live until :meth:`release`. ``budget`` is the token slice asked for (default
        :func:`default_slice` of what the caller has left; a served spawn's: its tree's ceiling).

        ``handle`` resumes a child an earlier process of the caller's (resumed) run spawned under that handle
        (its async child, whose handle the model holds): the child is admitted under it again (it must be the
        caller's own child and not live), past the spawn rate (it is not new work), within every other cap."""
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
        # The Rule of Two judges the MCP servers and A2A peers in the scope (server_tags has one entry for each,
        # an untagged peer already counted as untrusted input and external communication).
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
        parent = "served" if served else caller
        n = self._minted.get(parent, 0) + 1
        if handle is not None:
            number = handle.rpartition(".")[2]
            if served or parent_of(handle) != caller or not number.isdigit() or handle in self._live:
                return Refusal(f"spawn refused: {handle} cannot be resumed by handle {caller}", cap="caller")
            n = int(number)
        # A served spawn is a run tree of its own, or continues a re-opened session's earlier one (``tree``).
        tree = (tree or f"{parent}.{n}") if served else self.tree_of(caller, tree)
        used = self.tree_tokens(tree)
        ceiling = self.ceiling_of(tree)
        if used >= ceiling:
            return Refusal(
                f"spawn refused: token_ceiling={ceiling} reached "
                f"(the tree used {used} tokens)",
                cap="token_ceiling",
            )
        if len(self._live) >= self.caps.max_subagents:
            return Refusal(
                f"spawn refused: max_subagents={self.caps.max_subagents} reached at handle {caller}",
                retryable=True, cap="max_subagents",
            )
        children = self._children.get(parent, 0)
        if children >= self.caps.max_children:
            return Refusal(
                f"spawn refused: max_children={self.caps.max_children} reached at handle {caller}",
                retryable=True, cap="max_children",
            )
        fresh = served and tree not in self._books
        slice_of: str | None = None
        if fresh:  # the served tree's root: its slice is the books' ceiling
            want = self.caps.token_ceiling if budget is None else budget
            if want <= 0 or want > self.caps.token_ceiling:
                return Refusal(
                    f"spawn refused: token_budget={want} does not fit: a served run has at most "
                    f"token_ceiling={self.caps.token_ceiling} tokens",
                    cap="token_budget",
                )
        elif served:  # a re-opened session: the root of its earlier tree again, with what that has left
            from agentd.journal.ledger import ROOT

            want = self.book(tree).available(ROOT)
            if want <= 0:
                return Refusal(f"spawn refused: token_ceiling={ceiling} reached (the tree holds all of it)",
                               cap="token_ceiling")
        else:
            book = self.book(tree)
            slice_of = self._slice(caller) if self._slice(caller) in book else None
            want = 0
        if slice_of is not None:
            left = self.book(tree).available(slice_of)
            if budget is None:
                want = default_slice(left, self.caps.max_children - children, depth, self.caps.max_depth, ceiling,
                                     children)
            else:
                want = budget
            if want <= 0 or want > left:
                return Refusal(
                    f"spawn refused: token_budget={want} does not fit: handle {caller} has {max(0, left)} tokens "
                    f"left of token_ceiling={ceiling}",
                    cap="token_budget",
                )
        money = self.money(tree) if slice_of is not None else None
        money_want = 0
        if money is not None and slice_of is not None and slice_of in money:
            from agentd.prices import usd_text

            money_left = money.available(slice_of)
            money_want = default_slice(money_left, self.caps.max_children - children, depth, self.caps.max_depth,
                                       money.ceiling, children)
            if money_want <= 0:
                return Refusal(
                    f"spawn refused: budget_usd={usd_text(money.ceiling)} reached: handle {caller} has no money "
                    "left for a subagent", cap="budget_usd")
        wait = self._bucket.take(now) if handle is None else 0.0
        if wait > 0:
            return Refusal(
                f"spawn refused: spawn rate limit (burst {self.caps.spawn_burst}, "
                f"{self.caps.spawn_rate:g}/s) at handle {caller}; retry in {wait:.1f} s",
                retryable=True,
                retry_after=wait, cap="spawn_rate",
            )
        self._minted[parent] = max(n, self._minted.get(parent, 0))
        handle = f"{parent}.{n}"
        self._live[handle] = scope
        self._children[parent] = children + 1
        if handle == top_of(handle):
            self._tree_of[handle] = tree
        if fresh:
            self.book(tree, ceiling=want)
        elif slice_of is not None:
            self.book(tree).reserve(handle, want, parent=slice_of)
            if money is not None and money_want > 0:
                money.reserve(handle, money_want, parent=slice_of)
        return Admission(handle=handle, depth=depth_of(handle), scope=scope, budget=want or None)

    def mint_after(self, parent: str, n: int) -> None:
        """Mint ``parent``'s next handles after ``parent.n`` (a restarted daemon's journaled served handles)."""
        self._minted[parent] = max(self._minted.get(parent, 0), n)

    def release(self, handle: str) -> str | None:
        """The subagent ended: it and anything still recorded under it stop counting; its slice (and any
        still open under it) is closed: spent booked to its parent, the rest refunded. A served tree's root
        ending ends the tree: its books are forgotten and its name returned (not while draining: a warm
        session the drain cancelled may be re-opened after a restart, agentd.selfmcp.journaled)."""
        tree = self.tree_of(handle)
        book = self._books.get(tree)
        if book is not None and handle in book:
            book.end(handle)
        money = self._money.get(tree)
        if money is not None and handle in money:
            money.end(handle)
        over = tree if is_served_root(handle) and not self.draining else None
        if over is not None:
            self._books.pop(over, None)  # its count stays (``tree_tokens``), like a wake's
            self._money.pop(over, None)
        # Children end before their parents (the nursery tree), so an ending subagent has none live, and a wide
        # tree's hundreds of endings each cost O(1); a subtree still recorded under it is swept as one.
        under = [handle] if self._children.get(handle, 0) == 0 else [h for h in self._live if is_within(h, handle)]
        for h in under:
            if h not in self._live:
                continue
            del self._live[h]
            parent = parent_of(h)
            if parent is not None:
                left = self._children.get(parent, 0) - 1
                if left > 0:
                    self._children[parent] = left
                else:
                    self._children.pop(parent, None)
        self._tree_of.pop(handle, None)  # a root-level subagent ended: its tree's count stays
        return over

    def _count(self, key: str, n: int) -> int:
        """Count ``n`` (≥ 0) more tokens of run tree ``key``: its total now (the trees kept most recently used
        last, at most :data:`TREES_KEPT`)."""
        self.tokens_used += n
        total = self._tree_tokens.pop(key, 0) + n
        self._tree_tokens[key] = total
        while len(self._tree_tokens) > TREES_KEPT:
            self._tree_tokens.popitem(last=False)
        return total

    def add_tokens(self, n: int, handle: str | None = None, tree: str = "") -> bool:
        """Count ``n`` more tokens used by ``handle`` (default the root, in run tree ``tree``); True when its
        run tree is now past the ceiling, or ``handle`` past its slice (the root's slice is what the tree has
        left for the root's own turns: the ceiling less what its live children hold)."""
        n = max(0, n)
        who = self.root if handle is None else handle
        key = self.tree_of(who, tree)
        total = self._count(key, n)
        book = self.book(key)
        overdrawn = False
        if self._slice(who) in book:
            from agentd.journal.ledger import Overdrawn

            overdrawn = isinstance(book.charge(self._slice(who), n), Overdrawn)
        return overdrawn or total > self.ceiling_of(key)

    def add_cost(self, cost: int, handle: str | None = None, tree: str = "") -> Charged | Overdrawn | None:
        """Charge ``cost`` picodollars spent by ``handle`` (default the root, in run tree ``tree``) to its money
        slice: the ledger's decision (``Charged`` with what is left, or ``Overdrawn``: the money budget is spent
        there), or None without a money budget (or a slice to charge)."""
        if self.caps.budget_usd is None:
            return None
        who = self.root if handle is None else handle
        money = self.money(self.tree_of(who, tree))
        where = self._slice(who)
        if money is None or where not in money:
            return None
        return money.charge(where, max(0, cost))

    def charge_reply(self, tokens: int, cost: int | None, handle: str | None = None,
                     tree: str = "") -> tuple[bool, bool | str]:
        """One reply's usage, charged in one pass: ``tokens`` to the token books and ``cost`` picodollars (None:
        the reply is not priced) to the money books, both to the slice of ``handle`` (default the root, in run
        tree ``tree``). What :meth:`add_tokens`, :meth:`add_cost` and then :meth:`spent_out` decide one by one,
        as a pair ``(over, stop)``: ``over`` when its run tree is past the token ceiling or ``handle`` past its
        slice of either budget (a subagent is then cancelled); ``stop`` what the run of ``handle`` is told:
        ``"budget_usd"`` (agentd.prices.BUDGET_USD) when its money is spent (overdrawn or nothing left), else
        true when its tokens are (past, or nothing left for another turn), else false.

        Every reply of the tree comes here (the root's usage reports): the tree key and the slice are found once
        for both books, each book answers with one number (:meth:`Ledger.spend`) and the decision is a tuple,
        not an attrs value; building those per reply cost more than the bookkeeping."""
        n = tokens if tokens > 0 else 0
        who = self.root if handle is None else handle
        key = self.tree_of(who, tree)
        total = self._count(key, n)
        book = self.book(key)
        ceiling = min(book.ceiling, self.caps.token_ceiling)  # ceiling_of(key), the books at hand
        where = self._slice(who)
        left = book.spend(where, n)
        if left is None:  # no slice of its own (a handle the books do not know): the tree's count alone
            over = total > ceiling
            stop: bool | str = total >= ceiling
        else:
            over = left < 0 or total > ceiling
            stop = left <= 0 or total >= ceiling
        if cost is not None and self.caps.budget_usd is not None:
            money = self.money(key)
            left = None if money is None else money.spend(where, cost if cost > 0 else 0)
            if left is not None and left <= 0:
                over = over or left < 0
                stop = BUDGET_USD
        return over, stop

    def money_spent_out(self, handle: str | None = None, tree: str = "") -> bool:
        """Has ``handle`` (default the root, in ``tree``) no money left (its slice of ``budget_usd`` spent)?"""
        who = self.root if handle is None else handle
        money = self._money.get(self.tree_of(who, tree))
        return money is not None and self._slice(who) in money and money.available(self._slice(who)) <= 0

    def spent_out(self, handle: str | None = None, tree: str = "") -> bool:
        """Has ``handle`` (default the root, in run tree ``tree``) nothing left to spend: its slice used up, or
        its run tree at the ceiling? Then another model call of its own could only overdraw."""
        who = self.root if handle is None else handle
        key = self.tree_of(who, tree)
        if self.tree_tokens(key) >= self.ceiling_of(key):
            return True
        book = self._books.get(key)
        return book is not None and self._slice(who) in book and book.available(self._slice(who)) <= 0

    def tree_key(self, handle: str, tree: str = "") -> str:
        """The run tree ``handle`` (default the root, in ``tree``) counts in: what :meth:`book` is keyed by."""
        return self.tree_of(handle, tree)
