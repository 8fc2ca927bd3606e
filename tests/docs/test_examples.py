"""Every fenced example in README.md and docs/*.md is run or checked, unless it is marked as not runnable.

- ```` ```sh ````: each ``agentd ...`` command runs for real, offline, as a subprocess: the example hosts are
  replaced by local fixtures (:data:`FIXTURES`: the gateway by the offline model ``test``, an MCP server by
  the official SDK's server on loopback, an A2A peer by the a2a-sdk one), ``AGENTD_INTELLIGENCE=test`` is
  in the environment, and it must exit 0 with one JSON document on stdout (or the ``--output human`` text).
  A block may hold only comments, ``export``s/assignments (they apply to the commands after them) and
  ``agentd`` commands.
- ```` ```yaml ````: parsed by the real loader: an agent manifest (it has ``steps:``) by ``load_manifest``,
  anything else as a ``--config`` file by ``load_file`` (relative TLS paths are made to exist).
- ```` ```json ````: shaped like the real output it shows (:data:`JSON_SOURCES`), produced by one offline run.

A block is skipped only when the line before its fence is ``<!-- example: not run (WHY) -->``.
Fences without a language (program output, error text) are not examples.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentd.config.file import load_file
from agentd.connections.plan import load_manifest
from tests.peers import launch

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^<!-- example: not run \((?P<why>[^)]+)\) -->$")
FENCE = re.compile(r"^```(?P<lang>\w*)")

#: Example hosts -> local fixtures ({mcp} and {a2a} are filled in with the fixtures' URLs).
FIXTURES = {
    "https://gw.example/v1": "test",
    "https://api.openai.com/v1": "test",
    "http://127.0.0.1:3001/mcp": "{mcp}",
    "https://gateway/v1": "test",
    "https://mcp-fs.internal/mcp": "{mcp}",
    "https://pay.internal/mcp": "{mcp}",
    "https://reviewer.internal:8443": "{a2a}",
    "/var/lib/agentd": "{state}",
}

#: Which real output each JSON example shows: the doc, the text that starts the example, and the output.
JSON_SOURCES = {
    ("intelligence.md", '{"model": "agentd-offline-test"'): "result",
    ("observability.md", '{"alive": true'): "health",
    ("observability.md", '{"run_id": '): "report",
}
#: Keys whose values are maps keyed by data (server names): their entries are compared, not their keys.
DATA_KEYED = {"servers", "observed"}


@attrs.frozen
class Example:
    doc: str
    line: int
    lang: str
    text: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}:{self.lang}"


def fences(path: Path) -> Iterator[tuple[int, str, list[str], str | None]]:
    """Each fenced block of ``path``: its fence's line (1-based), language, lines, and the not-run reason
    marked before it (None: not marked)."""
    lines = path.read_text().split("\n")
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = index + 1
        while not lines[end].startswith("```"):
            end += 1
        marker = NOT_RUN.match(lines[index - 1].strip()) if index else None
        yield index + 1, fence["lang"], lines[index + 1:end], marker["why"] if marker else None
        index = end + 1


def examples() -> Iterator[Example]:
    for path in DOCS:
        for line, lang, body, why in fences(path):
            if lang in ("sh", "yaml", "json"):
                yield Example(path.name, line, lang, "\n".join(body), why)


ALL = list(examples())


def test_every_marked_example_says_why_and_examples_exist() -> None:
    assert len([e for e in ALL if e.skip is None]) >= 15
    for path in DOCS:
        for number, line in enumerate(path.read_text().split("\n"), 1):
            if line.strip().startswith("<!-- example"):
                assert NOT_RUN.match(line.strip()), f"{path.name}:{number}: malformed marker {line!r}"


#: A line of a fence without a language that is a command someone would type (``$ `` prompt optional); a synopsis
#: (``[FLAG]``, ``a|b``, ``...``) is a description, not an example.
COMMAND = re.compile(r"^\s*(\$ )?(agentd|docker|kubectl|systemctl|pipx?|curl|eval|journalctl) ")
SYNOPSIS = re.compile(r"\[|\||\.\.\.|…")


def test_a_command_in_a_fence_without_a_language_is_marked_with_why_it_is_not_run() -> None:
    """Every doc example is run by the suite or says why not: a command shown in a plain fence (which the runner
    above does not run) must carry the not-run marker with its reason, or become an ``sh`` block that runs."""
    unmarked = []
    for path in DOCS:
        for line, lang, body, why in fences(path):
            typed = [b for b in body if COMMAND.match(b) and not SYNOPSIS.search(b.split("#")[0])]
            if not lang and typed and why is None:
                unmarked.append(f"{path.name}:{line}: {typed[0].strip()[:80]}")
    assert unmarked == []


# -- shell ------------------------------------------------------------------------------------------------


def commands(text: str) -> list[tuple[dict[str, str], list[str]]]:
    """(environment assignments so far, argv) for each ``agentd`` command of a block."""
    joined = re.sub(r"\\\n\s*", " ", text)
    env: dict[str, str] = {}
    found = []
    for raw in joined.split("\n"):
        words = shlex.split(raw, comments=True)
        if not words:
            continue
        exported = words[0] == "export"
        if exported:
            words = words[1:]
        assigned = {}
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            name, _, value = words.pop(0).partition("=")
            assigned[name] = value
        if exported or not words:
            assert not words, f"not an assignment: {raw!r}"
            env.update(assigned)
            continue
        assert words[0] == "agentd", f"an unmarked sh example may hold only agentd commands: {raw!r}"
        found.append(({**env, **assigned}, words[1:]))
    return found


@pytest.fixture(scope="module")
def fixtures() -> Iterator[dict[str, str]]:
    with launch.start_peer(launch.sdk_server_argv()) as mcp:
        with launch.start_peer([sys.executable, "-m", "tests.a2a.sdk_peer"], cwd=launch.REPO_ROOT) as a2a:
            yield {"mcp": mcp.url, "a2a": a2a.url}


def localised(words: list[str], fixtures: dict[str, str]) -> list[str]:
    out = []
    for word in words:
        for example, local in FIXTURES.items():
            word = word.replace(example, local.format(**fixtures))
        out.append(word)
    return out


def run_agentd(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTD_", "AGENT_"))}
    return subprocess.run([sys.executable, "-m", "agentd", *argv], capture_output=True, text=True, timeout=120,
                          env={**base, "AGENTD_INTELLIGENCE": "test", **env}, cwd=cwd, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("example", [e for e in ALL if e.lang == "sh" and e.skip is None], ids=lambda e: e.id)
def test_shell_example_runs(example: Example, fixtures: dict[str, str], tmp_path: Path) -> None:
    found = commands(example.text)
    assert found, "an unmarked sh example without an agentd command: mark it"
    fixtures = {**fixtures, "state": str(tmp_path / "state")}
    for env, argv in found:
        done = run_agentd(localised(argv, fixtures), {k: localised([v], fixtures)[0] for k, v in env.items()},
                          tmp_path)  # fmt: skip
        assert done.returncode == 0, f"{example.id}: agentd {shlex.join(argv)}\n{done.stderr[-3000:]}"
        if "human" not in argv:
            json.loads(done.stdout)  # one JSON document


# -- yaml -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", [e for e in ALL if e.lang == "yaml" and e.skip is None], ids=lambda e: e.id)
def test_yaml_example_loads(example: Example, tmp_path: Path) -> None:
    path = tmp_path / "example.yaml"
    path.write_text(example.text)
    for relative in re.findall(r"\b(?:ca|cert|key|path): ([\w./-]+\.(?:pem|key|crt))", example.text):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("placeholder")
    env = {name: f"value-of-{name}" for name in re.findall(r"\{env: (\w+)\}", example.text)}
    env.update({name: "https://mcp.example/mcp" for name in env if name.endswith("_URL")})
    if re.search(r"^steps:", example.text, re.M):
        load_manifest(str(path))
    else:
        load_file(str(path), env)


# -- json -------------------------------------------------------------------------------------------------


def _loose_json(text: str) -> Any:
    """The example as JSON: ``…``/``...`` (elisions) dropped."""
    text = re.sub(r",\s*(?:\.\.\.|…)\s*(?=[}\]])", "", text)
    text = re.sub(r"\[\s*(?:\.\.\.|…)\s*\]", "[]", text)
    return json.loads(text)


def same_shape(example: Any, real: Any, where: str = "$") -> None:
    if isinstance(example, dict):
        assert isinstance(real, dict), f"{where}: an object in the docs, {type(real).__name__} in reality"
        if where.rsplit(".", 1)[-1] in DATA_KEYED:
            for key, value in example.items():
                assert real, f"{where}: empty in reality"
                same_shape(value, next(iter(real.values())), f"{where}.{key}")
            return
        missing = sorted(set(example) - set(real))
        assert not missing, f"{where}: the docs show {missing}, the real output has {sorted(real)}"
        for key, value in example.items():
            same_shape(value, real[key], f"{where}.{key}")
    elif isinstance(example, list):
        assert isinstance(real, list), f"{where}: a list in the docs, {type(real).__name__} in reality"
        if example and real:
            same_shape(example[0], real[0], f"{where}[0]")
    elif isinstance(example, bool) or example is None:
        assert real is None or isinstance(real, bool) == isinstance(example, bool), where
    elif isinstance(example, int | float):
        assert isinstance(real, int | float) and not isinstance(real, bool), f"{where}: {real!r} is not a number"
    else:
        assert isinstance(real, str), f"{where}: {real!r} is not a string"


@pytest.fixture(scope="module")
def real_outputs(fixtures: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("outputs")
    done = run_agentd(["--instruction", "describe the tools", "--mcp", f"srv={fixtures['mcp']}",
                       "--health-file", str(work / "health.json"), "--report-file", str(work / "report.jsonl")],
                      {}, work)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)["result"]  # the offline model answers with JSON text
    return {"result": json.loads(result) if isinstance(result, str) else result, "health": json.loads((work / "health.json").read_text()),
            "report": json.loads((work / "report.jsonl").read_text().splitlines()[0])}  # fmt: skip


@pytest.mark.parametrize("example", [e for e in ALL if e.lang == "json" and e.skip is None], ids=lambda e: e.id)
def test_json_example_has_the_real_shape(example: Example, real_outputs: dict[str, Any]) -> None:
    sources = [out for (doc, start), out in JSON_SOURCES.items() if doc == example.doc
               and example.text.startswith(start)]  # fmt: skip
    assert len(sources) == 1, f"{example.id}: say in JSON_SOURCES which output this shows (or mark it)"
    same_shape(_loose_json(example.text), real_outputs[sources[0]])
