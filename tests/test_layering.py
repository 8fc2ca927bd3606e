"""Import rules that keep the layers honest, checked on the AST (no imports are executed).

- ``agentd/mcp/**`` is the sans-io core: it imports no I/O framework and has no ``async def``.
- ``agentd/**`` runs on trio only: no asyncio, anyio or threading anywhere.
"""

from __future__ import annotations

import ast
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
