"""No test sleeps in real time without saying why.

A sleep that stands for time passing in trio code runs on trio's autojump clock (pytest-trio's ``autojump_clock``
or ``mock_clock`` fixture, or ``trio.run(..., clock=MockClock(...))``): it costs nothing and cannot flake. A wait
for a real peer (a child process, a server, a database) waits for the state itself, through tests/waiting.py.
What is left sleeps in real time because a real peer needs it, and says so on the line:

    await trio.sleep(1.0)  # real time: a window for a wrong second wake of the real daemon to show

A helper in one module whose sleeps run under the clock of tests in another (a fake model, a scripted peer) says
that instead: ``# virtual time: <which tests drive it>``. This test reads every module under tests/ and fails on
any other sleep, so the count of real sleeps cannot grow back unseen.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SLEEPS = {("time", "sleep"), ("trio", "sleep"), ("trio", "sleep_until"), ("asyncio", "sleep"), ("anyio", "sleep")}
CLOCK_FIXTURES = {"autojump_clock", "mock_clock"}
MARKERS = ("# real time:", "# virtual time:")
REAL_TIME_CEILING = 60  # the real-time sleeps left once the rest waited for state or ran on autojump_clock


def _sleep_names(tree: ast.Module) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """The module's names for the clock modules (``import trio as t``) and for their sleeps (``from time import
    sleep``)."""
    modules = {module: module for module, _ in SLEEPS}
    functions: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in modules:
            for alias in node.names:
                if (node.module, alias.name) in SLEEPS:
                    functions[alias.asname or alias.name] = (node.module, alias.name)
    return modules, functions


def _is_sleep(call: ast.Call, modules: dict[str, str], functions: dict[str, tuple[str, str]]) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        named = (modules.get(func.value.id, ""), func.attr)
    elif isinstance(func, ast.Name):
        named = functions.get(func.id, ("", ""))
    else:
        return False
    if named not in SLEEPS:
        return False
    # trio.sleep(0) is a checkpoint, not time passing
    return not (call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value == 0)


def _on_a_clock(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The function takes a mock-clock fixture, or runs trio itself with a clock of its own."""
    args = function.args
    if {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} & CLOCK_FIXTURES:
        return True
    return any(isinstance(node, ast.Call) and any(k.arg == "clock" for k in node.keywords)
               for node in ast.walk(function))


def _comments(source: str) -> dict[int, str]:
    return {tok.start[0]: tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}


def _marker(comments: dict[int, str], lines: list[str], call: ast.Call) -> str | None:
    """The marker with a reason on one of the call's lines, or on a comment line right above it."""
    candidates = [comments.get(n, "") for n in range(call.lineno, (call.end_lineno or call.lineno) + 1)]
    above = call.lineno - 1
    if above >= 1 and lines[above - 1].strip().startswith("#"):
        candidates.append(comments.get(above, ""))
    for comment in candidates:
        for marker in MARKERS:
            at = comment.find(marker)
            if at >= 0 and comment[at + len(marker):].strip():
                return marker
    return None


def sleeps(source: str, name: str = "<source>") -> list[tuple[str, str | None]]:
    """``(name:line: text, marker)`` of every sleep in ``source`` that is not on a mock clock; marker is None
    where no reason is given."""
    tree = ast.parse(source)
    lines = source.splitlines()
    comments = _comments(source)
    modules, functions = _sleep_names(tree)
    found: list[tuple[str, str | None]] = []

    def visit(node: ast.AST, clocked: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            clocked = clocked or _on_a_clock(node)
        if isinstance(node, ast.Call) and _is_sleep(node, modules, functions) and not clocked:
            found.append((f"{name}:{node.lineno}: {lines[node.lineno - 1].strip()}", _marker(comments, lines, node)))
        for child in ast.iter_child_nodes(node):
            visit(child, clocked)

    visit(tree, False)
    return found


def unexplained_sleeps(source: str, name: str = "<source>") -> list[str]:
    """``name:line: text`` of every real-time sleep in ``source`` without a reason."""
    return [where for where, marker in sleeps(source, name) if marker is None]


def _all_sleeps() -> list[tuple[str, str | None]]:
    return [hit for path in sorted(TESTS.rglob("*.py"))
            for hit in sleeps(path.read_text(), str(path.relative_to(TESTS.parent)))]


def test_every_real_sleep_in_the_tests_names_its_reason() -> None:
    found = [where for where, marker in _all_sleeps() if marker is None]
    assert not found, ("sleeps in real time without '# real time: <reason>' (use autojump_clock for time passing, "
                       "tests/waiting.py to wait for a peer's state):\n" + "\n".join(found))


def test_the_real_sleeps_do_not_grow_in_number() -> None:
    """A new real-time sleep needs more than a comment: it raises this ceiling, in review. Lower the ceiling
    when one goes."""
    real = [where for where, marker in _all_sleeps() if marker == "# real time:"]
    assert len(real) <= REAL_TIME_CEILING, "\n".join(real)


def test_the_scan_tells_real_from_virtual_and_reasoned_sleeps() -> None:
    source = '''
import time, trio

async def test_ticks(autojump_clock):
    await trio.sleep(60)

def test_runs_its_own_clock():
    async def main():
        await trio.sleep(5)
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

async def helper():
    await trio.sleep(0)
    await trio.sleep_forever()
    await trio.sleep(1)  # virtual time: driven by test_ticks
    # real time: the peer needs a second
    time.sleep(1)
    await trio.sleep(0.5)  # real time:
    await trio.sleep(0.05)
    await trio.sleep_until(3)
'''
    assert [hit.split(": ", 1)[1] for hit in unexplained_sleeps(source)] == [
        "await trio.sleep(0.5)  # real time:", "await trio.sleep(0.05)", "await trio.sleep_until(3)"]
    renamed = "import trio as t\nfrom time import sleep as nap\nasync def f():\n    await t.sleep(1)\n    nap(1)\n"
    assert [hit.split(": ", 1)[1] for hit in unexplained_sleeps(renamed)] == ["await t.sleep(1)", "nap(1)"]
