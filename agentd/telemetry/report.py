"""``--report-file``: what a daemon's run trees did, gathered from its own event lines, written at exit.

The recorder sits on the root's event sink. Every run in the tree reports through it: the root's own
lines directly, each subagent's as ``subagent.stderr`` lines that its parent relays (nested ones relayed
again at every level), which the recorder unwraps. From ``run.start``/``run.end`` it builds one node per
run (handle, status, steps, tokens, its own replies' cost when priced, duration, children), from ``tool.result`` each server's call and
error counts, and from ``subagent.refused``/``budget.exhausted`` the budget ledger.

The file holds one JSON document per run tree (JSON Lines): the root run, each daemon wake, each served
spawn. ``agentd report FILE`` renders it as a table for a person (:func:`render`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from agentd.telemetry.private_files import open_private

#: Bounds: a daemon that runs for weeks keeps at most this many trees (oldest dropped, counted).
MAX_TREES: Final = 1000
#: Relayed lines nest one ``subagent.stderr`` per level; deeper ones are not unwrapped.
MAX_NESTING: Final = 16
#: Tool calls in flight shown per node (a reply may ask for many at once), and the characters of a name.
MAX_CALLS: Final = 16
TOOL_NAME_MAX: Final = 100


def _epoch(ts: Any) -> float | None:
    if not isinstance(ts, str) or len(ts) < 20:
        return None
    import calendar  # with time.strptime's own imports: on the first line read, not on the daemon's start-up

    try:
        whole = calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S"))
        return whole + int(ts[20:23]) / 1000
    except ValueError:
        return None


@attrs.define
class _Node:
    handle: str
    run_id: str
    status: str = "running"
    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    started: float | None = None
    ended: float | None = None
    error: str | None = None
    #: The tool calls in flight (``tool.call`` seen, its ``tool.result`` not yet): call id -> tool name.
    calls: dict[str, str] = attrs.field(factory=dict)
    #: What the run's own replies cost in US dollars (``cost_usd`` of its usage; priced runs only).
    cost_usd: float | None = None

    def to_json(self, children: list[dict[str, Any]]) -> dict[str, Any]:
        duration = (round(self.ended - self.started, 3)
                    if self.started is not None and self.ended is not None else None)
        doc: dict[str, Any] = {
            "handle": self.handle, "run_id": self.run_id, "status": self.status, "steps": self.steps,
            "tokens": {"input": self.input_tokens, "output": self.output_tokens,
                       "total": self.input_tokens + self.output_tokens},
            "duration_s": duration, "children": children,
        }
        if self.error:
            doc["error"] = self.error
        if self.cost_usd is not None:
            doc["cost_usd"] = self.cost_usd
        return doc


@attrs.define
class _Server:
    calls: int = 0
    errors: int = 0
    faults: int = 0
    rejected: int = 0


def _tree_key(run_id: str, handle: str) -> str:
    """The top-level run a line belongs to: the root run id plus the top handle (``0`` or ``served.N``)."""
    root = run_id.split("/", 1)[0]
    parts = handle.split(".")
    top = ".".join(parts[:2]) if parts[0] == "served" and len(parts) > 1 else parts[0]
    return f"{root}#{top}"


@attrs.define(eq=False)
class Recorder:
    """Collects nodes, server counts and the ledger from event lines (a sink tee)."""

    caps: Mapping[str, Any] = attrs.field(factory=dict)
    _trees: dict[str, dict[str, _Node]] = attrs.field(factory=dict)
    _servers: dict[str, dict[str, _Server]] = attrs.field(factory=dict)
    _refusals: dict[str, list[str]] = attrs.field(factory=dict)
    _budget: dict[str, list[str]] = attrs.field(factory=dict)
    dropped_trees: int = 0

    def observe(self, line: Mapping[str, Any], depth: int = 0) -> dict[str, Any] | None:
        """Take one event line; the node it changed (its :meth:`node_view`), if it changed one."""
        event = line.get("event")
        if event == "subagent.stderr":
            inner = line.get("line")
            if depth < MAX_NESTING and isinstance(inner, str) and inner.startswith("{"):
                try:
                    decoded = json.loads(inner)
                except ValueError:
                    return None
                if isinstance(decoded, dict):
                    return self.observe(decoded, depth + 1)
            return None
        run_id = str(line.get("run_id") or "")
        handle = str(line.get("agent_path") or "0")
        if event == "run.start":
            node = self._node(run_id, handle)
            node.started, node.status = _epoch(line.get("ts")), "running"
            return self.node_view(node)
        if event in ("run.end", "run.cancelled"):
            self._ended(event, line, run_id, handle)
            return self.node_view(self._node(run_id, handle))
        if event == "loop.step" and isinstance(line.get("step"), int):
            node = self._node(run_id, handle)
            node.steps = int(line["step"])
            raw = line.get("usage")
            if isinstance(raw, dict):
                node.input_tokens = int(raw.get("prompt_tokens") or 0)
                node.output_tokens = int(raw.get("completion_tokens") or 0)
                node.cost_usd = _cost(raw, node.cost_usd)
            return self.node_view(node)
        self._count(event, line, run_id, handle)
        if event in ("tool.call", "tool.result"):
            return self._tool(event, line, run_id, handle)
        return None

    def _tool(self, event: Any, line: Mapping[str, Any], run_id: str, handle: str) -> dict[str, Any] | None:
        """A tool call of a known run started or ended: that run's node, with the calls now in flight."""
        tree = self._trees.get(_tree_key(run_id, handle))
        node = tree.get(handle) if tree is not None else None
        if node is None or node.ended is not None:
            return None
        call_id = str(line.get("call_id") or "")
        if event == "tool.result":
            if node.calls.pop(call_id, None) is None:
                return None
        elif len(node.calls) < MAX_CALLS:
            node.calls[call_id] = str(line.get("tool") or line.get("wire_name") or "?")[:TOOL_NAME_MAX]
        return self.node_view(node)

    def record(self, line: dict[str, Any]) -> None:
        """:meth:`observe` as an event sink."""
        self.observe(line)

    def node_view(self, node: _Node) -> dict[str, Any]:
        """One node for the live stream: ``tree.node`` with its place in the tree, the tools it is calling and
        its elapsed seconds now (a viewer adds its own clock's time since, for a running node: no skew)."""
        elapsed = None
        if node.started is not None:
            elapsed = round((node.ended if node.ended is not None else time.time()) - node.started, 3)
        return {"event": "tree.node", "run_id": node.run_id.split("/", 1)[0], "handle": node.handle,
                "parent": node.handle.rpartition(".")[0] or None, "status": node.status, "steps": node.steps,
                "tokens": node.input_tokens + node.output_tokens, "tools": list(node.calls.values()),
                "elapsed_s": elapsed, **({} if node.cost_usd is None else {"cost_usd": node.cost_usd})}

    def nodes(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` nodes as :meth:`node_view` (a new stream subscriber's snapshot)."""
        every = [node for tree in self._trees.values() for node in tree.values()]
        return [self.node_view(node) for node in every[-limit:]]

    def _ended(self, event: Any, line: Mapping[str, Any], run_id: str, handle: str) -> None:
        if event == "run.end":
            node = self._node(run_id, handle)
            node.status = str(line.get("status", "unknown"))
            node.steps = int(line.get("steps") or 0)
            raw = line.get("usage")
            usage: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
            node.input_tokens = int(usage.get("prompt_tokens") or 0)
            node.output_tokens = int(usage.get("completion_tokens") or 0)
            own = usage.get("own")
            node.cost_usd = _cost(own if isinstance(own, dict) else usage, node.cost_usd)
            node.ended = _epoch(line.get("ts"))
            node.calls.clear()
            if line.get("error"):
                node.error = str(line["error"])[:300]
        else:
            node = self._node(run_id, handle)
            node.status, node.ended = "cancelled", _epoch(line.get("ts"))
            node.calls.clear()

    def _count(self, event: Any, line: Mapping[str, Any], run_id: str, handle: str) -> None:
        if event == "tool.result":
            servers = self._servers.setdefault(_tree_key(run_id, handle), {})
            counts = servers.setdefault(str(line.get("server") or "agentd"), _Server())
            counts.calls += 1
            kind = line.get("kind")
            if kind == "fault":
                counts.faults += 1
            elif kind == "rejected":
                counts.rejected += 1
            elif line.get("is_error"):
                counts.errors += 1
        elif event == "subagent.refused":
            self._refusals.setdefault(_tree_key(run_id, handle), []).append(str(line.get("reason", ""))[:200])
        elif event in ("budget.exhausted", "loop.budget"):
            self._budget.setdefault(_tree_key(run_id, handle), []).append(
                f"{handle}: {line.get('budget') or line.get('reason') or event}")

    def _node(self, run_id: str, handle: str) -> _Node:
        key = _tree_key(run_id, handle)
        tree = self._trees.get(key)
        if tree is None:
            if len(self._trees) >= MAX_TREES:
                oldest = next(iter(self._trees))
                del self._trees[oldest]
                self._servers.pop(oldest, None)
                self.dropped_trees += 1
            tree = self._trees[key] = {}
        node = tree.get(handle)
        if node is None:
            node = tree[handle] = _Node(handle, run_id)
        return node

    def documents(self) -> list[dict[str, Any]]:
        out = []
        for key, nodes in self._trees.items():
            out.append(self._document(key, nodes))
        return out

    def _document(self, key: str, nodes: dict[str, _Node]) -> dict[str, Any]:
        def build(handle: str) -> dict[str, Any]:
            kids = sorted((h for h in nodes if h.rpartition(".")[0] == handle and h != handle),
                          key=lambda h: [int(p) if p.isdigit() else 0 for p in h.split(".")])
            return nodes[handle].to_json([build(k) for k in kids])

        roots = [h for h in nodes if h.rpartition(".")[0] not in nodes]
        roots.sort(key=len)
        top = build(roots[0]) if len(roots) == 1 else {
            "handle": key.split("#", 1)[1], "run_id": key.split("#", 1)[0], "status": "unknown", "steps": 0,
            "tokens": {"input": 0, "output": 0, "total": 0}, "duration_s": None,
            "children": [build(r) for r in roots]}
        total = sum(n.input_tokens + n.output_tokens for n in nodes.values())
        costs = [n.cost_usd for n in nodes.values() if n.cost_usd is not None]
        spent = {"cost_usd": round(sum(costs), 12)} if costs else {}
        servers = {name: attrs.asdict(c) for name, c in sorted(self._servers.get(key, {}).items())}
        return {
            "run_id": key.split("#", 1)[0],
            "tree": top,
            "nodes": len(nodes),
            "servers": servers,
            "budget": {"tokens_used": total, **spent, **dict(self.caps), "refusals": self._refusals.get(key, []),
                       "exhausted": self._budget.get(key, [])},
        }

    def write(self, path: str) -> None:
        """Write every tree, one JSON document per line (atomically: a temporary file, then a rename)."""
        tmp = f"{path}.{os.getpid()}.tmp"
        with open_private(tmp) as file:
            for doc in self.documents():
                file.write(json.dumps(doc, ensure_ascii=False, default=str) + "\n")
        os.replace(tmp, path)


# --- rendering ---------------------------------------------------------------------------------------------


def _cost(usage: Mapping[str, Any], before: float | None) -> float | None:
    value = usage.get("cost_usd")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else before


def _priced(node: Mapping[str, Any]) -> bool:
    return "cost_usd" in node or any(_priced(c) for c in node.get("children") or [] if isinstance(c, Mapping))


def _rows(node: Mapping[str, Any], indent: int = 0, priced: bool = False) -> Iterable[list[str]]:
    tokens = node.get("tokens") or {}
    duration = node.get("duration_s")
    cost = node.get("cost_usd")
    yield ["  " * indent + str(node.get("handle")), str(node.get("status")), str(node.get("steps")),
           str(tokens.get("total", 0)), *([("-" if cost is None else f"{cost:.6f}")] if priced else []),
           "-" if duration is None else f"{duration:.3f}"]
    for child in node.get("children") or []:
        yield from _rows(child, indent + 1, priced)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def render(documents: Iterable[Mapping[str, Any]]) -> str:
    """The report as text tables: per tree, its nodes, its servers, its budget."""
    out: list[str] = []
    for doc in documents:
        out.append(f"run {doc.get('run_id')}  ({doc.get('nodes')} node(s))")
        tree = doc.get("tree") or {}
        priced = _priced(tree)
        out.append(_table(["handle", "status", "steps", "tokens", *(["usd"] if priced else []), "seconds"],
                          list(_rows(tree, priced=priced))))
        servers = doc.get("servers") or {}
        if servers:
            out.append("")
            out.append(_table(["server", "calls", "errors", "faults", "rejected"],
                              [[name, str(c.get("calls", 0)), str(c.get("errors", 0)), str(c.get("faults", 0)),
                                str(c.get("rejected", 0))] for name, c in servers.items()]))
        budget = doc.get("budget") or {}
        out.append("")
        caps = ", ".join(f"{k}={v}" for k, v in budget.items() if k not in ("refusals", "exhausted"))
        out.append(f"budget: {caps}")
        for refusal in budget.get("refusals") or []:
            out.append(f"  refused: {refusal}")
        for exhausted in budget.get("exhausted") or []:
            out.append(f"  exhausted: {exhausted}")
        out.append("")
    return "\n".join(out)


def load(path: str) -> list[dict[str, Any]]:
    """The documents of a report file (ValueError for a line that is not a JSON object)."""
    docs = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            doc = json.loads(line)
            if not isinstance(doc, dict):
                raise ValueError(f"line {number} is not a JSON object")
            docs.append(doc)
    return docs
