"""agentd meets its HTTP libraries through their documented API only, checked on the AST (nothing is executed).

Private, for hypercorn, httpx, httpcore, h11, h2 and wsproto: importing an underscore module or name of theirs,
naming one of their underscore modules in a string (a pre-import table, ``sys.modules`` keys), subclassing any
hypercorn class but ``hypercorn.config.Config``, and touching an underscore attribute of their objects (any
attribute access ``x._name`` where ``_name`` is one the libraries define themselves and ``x`` is not agentd's
own ``self``/``cls``, and agentd defines no attribute of that name itself). An upgrade of one of them then needs no reading of its internals.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "agentd"
LIBRARIES = ("hypercorn", "httpx", "httpcore", "h11", "h2", "wsproto")
ALLOWED_BASES = {"hypercorn.config.Config"}
_PRIVATE_MODULE = re.compile(r"\b(?:" + "|".join(LIBRARIES) + r")(?:\.\w+)*\._[A-Za-z]\w*")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined(paths: Iterator[Path]) -> set[str]:
    """The underscore attributes these sources define: ``self._x``, methods, class-level fields."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
    return {name for name in names if _private(name)}


def _library_private_attributes() -> frozenset[str]:
    """The underscore attributes the libraries (as installed) define on their objects and classes, less those
    agentd defines on its own (an access ``pool._send`` to agentd's own pool is no library's private)."""
    names: set[str] = set()
    for library in LIBRARIES:
        spec = importlib.util.find_spec(library)
        if spec is not None and spec.submodule_search_locations:
            names |= _defined(Path(next(iter(spec.submodule_search_locations))).rglob("*.py"))
    return frozenset(names - _defined(PACKAGE.rglob("*.py")))


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _library(module: str) -> bool:
    return module.split(".")[0] in LIBRARIES


def violations(tree: ast.AST, private_attributes: frozenset[str]) -> Iterator[tuple[int, str]]:
    imported: dict[str, str] = {}  # local name -> dotted library name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _library(alias.name):
                    if any(_private(part) for part in alias.name.split(".")):
                        yield node.lineno, f"imports private module {alias.name}"
                    local = alias.asname or alias.name.split(".")[0]
                    imported[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _library(node.module):
            if any(_private(part) for part in node.module.split(".")):
                yield node.lineno, f"imports from private module {node.module}"
            for alias in node.names:
                if _private(alias.name):
                    yield node.lineno, f"imports private name {node.module}.{alias.name}"
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _PRIVATE_MODULE.search(node.value)
            if match:
                yield node.lineno, f"names private module {match.group(0)} in a string"
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if isinstance(root, ast.Name) and root.id in imported:
                yield node.lineno, f"touches {root.id}...{node.attr} of {imported[root.id]}"
            elif not own and node.attr in private_attributes:
                yield node.lineno, f"touches {node.attr}, a private attribute of one of {', '.join(LIBRARIES)}"
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                dotted = ast.unparse(base)
                head, _, rest = dotted.partition(".")
                resolved = imported.get(head, head if _library(head) else "") + (f".{rest}" if rest else "")
                if resolved.startswith("hypercorn") and resolved not in ALLOWED_BASES:
                    yield node.lineno, f"class {node.name} subclasses {resolved}"


def test_the_scanner_sees_each_kind_of_private_use() -> None:
    source = '''
import httpcore._backends.trio
from hypercorn.protocol.h11 import H11Protocol
from h11 import _util
import sys
sys.modules["httpx._main"] = None
class P(H11Protocol): ...
class C(hypercorn.config.Config): ...
pool._network_backend = None
'''
    found = [message for _, message in violations(ast.parse(source), frozenset({"_network_backend"}))]
    assert any("private module httpcore._backends.trio" in m for m in found)
    assert any("private name h11._util" in m for m in found)
    assert any("httpx._main in a string" in m for m in found)
    assert any("subclasses hypercorn.protocol.h11.H11Protocol" in m for m in found)
    assert not any("class C" in m for m in found)
    assert any("_network_backend" in m for m in found)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_agentd_uses_no_private_name_of_its_http_libraries(path: Path) -> None:
    found = list(violations(ast.parse(path.read_text(), str(path)), _PRIVATE_ATTRIBUTES))
    assert not found, "\n".join(f"{path.relative_to(REPO)}:{line}: {message}" for line, message in found)


_PRIVATE_ATTRIBUTES = _library_private_attributes()
