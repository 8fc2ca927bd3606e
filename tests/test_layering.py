"""Import rules that keep the layers honest, checked on the AST (no imports are executed).

- ``agentd/mcp/**`` is the sans-io core: it imports no I/O framework and has no ``async def``.
- ``agentd/**`` runs on trio only: no asyncio, anyio or threading anywhere.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "agentd"
CORE = PACKAGE / "mcp"

CORE_FORBIDDEN = {"trio", "httpx", "hypercorn", "anyio", "asyncio", "httpcore", "h11", "h2", "trio_websocket"}
PACKAGE_FORBIDDEN = {"asyncio", "anyio", "threading", "concurrent"}


def _modules(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _imported_roots(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Top-level names of every absolute import, including ones nested in functions or TYPE_CHECKING blocks."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value.split(".")[0]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value.split(".")[0]


def _violations(files: list[Path], forbidden: set[str]) -> list[str]:
    out = []
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for lineno, name in _imported_roots(tree):
            if name in forbidden:
                out.append(f"{path.relative_to(REPO)}:{lineno} imports {name}")
    return out


def test_there_is_something_to_check() -> None:
    assert _modules(CORE), "agentd/mcp has no modules: the layering rules would pass vacuously"
    assert len(_modules(PACKAGE)) > len(_modules(CORE))


def test_core_imports_no_io_framework() -> None:
    assert _violations(_modules(CORE), CORE_FORBIDDEN) == []


def test_core_has_no_async_code() -> None:
    found = []
    for path in _modules(CORE):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.AsyncWith | ast.AsyncFor):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {type(node).__name__}")
    assert found == []


def test_package_never_imports_asyncio_anyio_or_threading() -> None:
    assert _violations(_modules(PACKAGE), PACKAGE_FORBIDDEN) == []


@pytest.mark.parametrize(
    ("source", "forbidden", "expected"),
    [
        ("import trio", CORE_FORBIDDEN, ["trio"]),
        ("from httpx import AsyncClient", CORE_FORBIDDEN, ["httpx"]),
        ("def f():\n    import anyio.abc", PACKAGE_FORBIDDEN, ["anyio"]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import asyncio", PACKAGE_FORBIDDEN, ["asyncio"]),
        ("import importlib\nimportlib.import_module('threading')", PACKAGE_FORBIDDEN, ["threading"]),
        ("from . import trio", CORE_FORBIDDEN, []),  # relative: a sibling module, not the framework
        ("import trio_util_not_trio as t", CORE_FORBIDDEN, []),
    ],
)
def test_the_checker_itself(source: str, forbidden: set[str], expected: list[str]) -> None:
    names = [name for _, name in _imported_roots(ast.parse(source)) if name in forbidden]
    assert names == expected


# --- the package order --------------------------------------------------------------------------------------------
#: Every unit of ``agentd/`` (a top-level module or subpackage) in its layer, lowest first. A unit may import its
#: own layer's leaves and any lower layer; never a higher layer, and never a sibling role in its own layer (siblings
#: meet only in a layer above them, which hands one to the other). docs/architecture.md shows the same table.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("leaves", frozenset({"_version", "errors", "telemetry", "security", "oversight", "backoff", "formats",
                          "defaults", "deferred", "prices"})),
    ("mcp", frozenset({"mcp"})),
    ("transport", frozenset({"transport"})),
    ("config", frozenset({"config"})),
    ("journal", frozenset({"journal"})),
    ("cluster", frozenset({"cluster"})),
    ("client, intelligence, a2a", frozenset({"client", "intelligence", "a2a"})),
    ("agent", frozenset({"agent"})),
    ("run", frozenset({"run"})),
    ("supervisor", frozenset({"supervisor"})),
    ("selfmcp, modes, connections, ctl", frozenset({"selfmcp", "modes", "connections", "ctl"})),
    ("daemon", frozenset({"daemon"})),
    ("child", frozenset({"child"})),
    ("terminal", frozenset({"terminal"})),
    ("cli", frozenset({"cli", "__init__"})),
    ("entry", frozenset({"__main__"})),
)
#: Units that may import each other within one layer (the leaves are small shared vocabulary; the graph of their
#: modules must still be acyclic, which test_no_import_cycles checks).
MUTUAL = frozenset({"leaves"})


def _layer_of(unit: str) -> int:
    for index, (_, units) in enumerate(LAYERS):
        if unit in units:
            return index
    raise AssertionError(f"agentd unit {unit!r} is in no layer: add it to LAYERS (and docs/architecture.md)")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:`` (annotations only: never run, so not an edge)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            for stmt in node.body:
                out.update(id(inner) for inner in ast.walk(stmt))
    return out


def _is_dynamic_import(node: ast.AST) -> bool:
    """``importlib.import_module(…)``, ``import_module(…)`` or ``__import__(…)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return ((isinstance(func, ast.Attribute) and func.attr == "import_module")
            or (isinstance(func, ast.Name) and func.id in ("import_module", "__import__")))


def _agentd_imports(path: Path) -> Iterator[tuple[int, str]]:
    """Every ``agentd`` module this file imports, resolved to a module: absolute or relative, at module level or
    in a function, ``importlib.import_module``/``__import__`` of a string, and every string constant that names an
    agentd module (a lazy export table, a pre-import list: ``"agentd.config.model"``, ``"agentd.run:open_run"``).
    Only imports under ``if TYPE_CHECKING:`` are not edges."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return _edges(path.read_text(), package)


def _edges(source: str, package: str) -> Iterator[tuple[int, str]]:
    known = {_module_name(p) for p in _modules(PACKAGE)}
    tree = ast.parse(source)
    typing_only = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # ``from agentd.oversight import drain`` imports the module agentd.oversight.drain
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.partition(":")[0]
            if name in known and name != "agentd":
                targets = [name]
        for target in targets:
            if target == "agentd" or target.startswith("agentd."):
                yield node.lineno, target


#: Every import whose module is computed at run time, and why it may be: the test cannot see where these go, so
#: each names the import strings that feed it (which are edges of their own, counted above) or why it is not
#: agentd's. A new dynamic import fails :func:`test_every_dynamic_import_is_listed` until it is listed here.
DYNAMIC_IMPORTS: dict[str, str] = {
    "agentd/deferred/lazy.py": "resolves a package's lazy export table; the table's module strings are edges of the "
                      "package that declares it (agentd, agentd.client, agentd.intelligence)",
    "agentd/config/__init__.py": "config's lazy exports (PEP 562, so `agentd --help` imports only the flag "
                                 "table); _LAZY's module strings are its edges",
    "agentd/child/forkserver.py": "the fork server's pre-import table (PREIMPORT): its strings are the child "
                                  "program's edges, the non-agentd ones are libraries",
}


def _dynamic_imports(path: Path) -> list[int]:
    """Lines of dynamic imports whose argument is not a string literal (outside TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node.lineno for node in ast.walk(tree) if _is_dynamic_import(node)
            and isinstance(node, ast.Call) and not (node.args and isinstance(node.args[0], ast.Constant))]


def test_every_dynamic_import_is_listed() -> None:
    found = {str(path.relative_to(REPO)): lines for path in _modules(PACKAGE) if (lines := _dynamic_imports(path))}
    unlisted = {path: lines for path, lines in found.items() if path not in DYNAMIC_IMPORTS}
    assert unlisted == {}, "a dynamic import the layering test cannot follow: make it a plain import, or list it"
    assert set(DYNAMIC_IMPORTS) <= set(found), "DYNAMIC_IMPORTS lists a module that no longer has one"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    from agentd.oversight import drain", ["agentd.oversight.drain"]),
        ("import importlib\nimportlib.import_module('agentd.telemetry.events')", ["agentd.telemetry.events"]),
        ("__import__('agentd.formats.ids')", ["agentd.formats.ids"]),
        ("_LAZY = {'Config': 'agentd.config.model'}", ["agentd.config.model"]),
        ("PREIMPORT = ('agentd.run', 'httpcore')", ["agentd.run"]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agentd.oversight.drain import DrainLatch", []),
        ("x = 'agentd.no_such_module'", []),
        ("from . import catalogue", ["agentd.agent.catalogue"]),
    ],
)
def test_the_edge_finder_itself(source: str, expected: list[str]) -> None:
    assert [target for _, target in _edges(source, "agentd.agent")] == expected


def _upward_edges() -> list[str]:
    out = []
    for path in _modules(PACKAGE):
        source = _module_name(path)
        unit = _unit(source)
        for lineno, target in _agentd_imports(path):
            other = _unit(target)
            if other == unit:
                continue
            mine, theirs = _layer_of(unit), _layer_of(other)
            if theirs > mine or (theirs == mine and LAYERS[mine][0] not in MUTUAL):
                out.append(f"{path.relative_to(REPO)}:{lineno} ({LAYERS[mine][0]}) imports {target} "
                           f"({LAYERS[theirs][0]})")
    return out


def test_the_architecture_page_shows_the_same_layers_in_the_same_order() -> None:
    """docs/architecture.md's layer table names the units of each layer of :data:`LAYERS`, lowest first."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text[text.index("| layer (lowest first) |"):].split("\n\n")[0].splitlines()[2:]
    shown = [frozenset(re.findall(r"`([^`]+)`", row.split("|")[2])) for row in table]
    assert shown == [units for _, units in LAYERS]


def test_every_unit_has_a_layer() -> None:
    for path in _modules(PACKAGE):
        _layer_of(_unit(_module_name(path)))


def test_no_import_points_upward_or_sideways() -> None:
    assert _upward_edges() == []


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    modules = {_module_name(p): p for p in _modules(PACKAGE)}
    for name, path in modules.items():
        graph[name] = {t for _, t in _agentd_imports(path) if t in modules and t != name}
    # Tarjan's strongly connected components: any component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert cycles == []


def test_no_package_cycles() -> None:
    """The units (top-level modules and subpackages) form no loop either, the leaves among themselves included:
    a leaf package that reaches another and back could not be understood, or moved, alone."""
    graph: dict[str, set[str]] = {}
    for path in _modules(PACKAGE):
        unit = _unit(_module_name(path))
        graph.setdefault(unit, set()).update(
            other for _, target in _agentd_imports(path) if (other := _unit(target)) != unit)
    loops = []
    for start in sorted(graph):
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            node = todo.pop()
            if node == start:
                loops.append(start)
                break
            if node not in seen:
                seen.add(node)
                todo.extend(graph.get(node, ()))
    assert loops == []
