"""Whatever happens, stdout is one JSON document: an internal crash still prints a ``crashed`` result.

The crash is real: a trusted runtime module (``agentd run --runtime-module``) whose hook raises an exception
agentd does not expect, in a real ``python -m agentd`` process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio
import yaml

from tests.cli.helpers import clean_env

MODULE = '''
class Adapter:
    async def list_tools(self):
        raise {error}


tool_adapter = Adapter()
'''


async def run_manifest(tmp_path: Path, error: str, env: dict[str, str] | None = None) -> trio.CompletedProcess[bytes]:
    module = tmp_path / "runtime_mod.py"
    module.write_text(MODULE.format(error=error))
    host = tmp_path / "host.yaml"
    host.write_text(yaml.safe_dump({"intelligence": {"url": "test"}, "transcript": {"enabled": False}}))
    manifest = tmp_path / "agent.yaml"
    manifest.write_text(yaml.safe_dump({"steps": [{"id": "s", "prompt": "p"}]}))
    argv = [sys.executable, "-m", "agentd", "run", str(manifest), "--config", str(host),
            "--runtime-module", str(module), "--run-id", "crash-1"]
    with trio.fail_after(60):
        return await trio.run_process(argv, env=clean_env(env), capture_stdout=True, capture_stderr=True,
                                      check=False, stdin=b"")


async def test_an_internal_crash_prints_one_crashed_document_and_exits_1(tmp_path: Path) -> None:
    done = await run_manifest(tmp_path, "KeyError('the adapter lost its index ' + 'x' * 5000)")
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, done.stdout
    doc = json.loads(lines[0])
    assert doc["run_id"] == "crash-1" and doc["status"] == "crashed" and doc["done"] is True
    assert doc["error"].startswith("KeyError: ") and "the adapter lost its index" in doc["error"]
    assert len(doc["error"]) < 400  # a short message, not the whole exception text
    for line in done.stderr.decode().splitlines():
        json.loads(line)  # stderr stays JSON lines


async def test_plain_agentd_crash_before_the_run_still_prints_a_crashed_document(tmp_path: Path) -> None:
    # The served endpoint's port is taken: the listener fails outside the run itself.
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "agentd", "--intelligence", "test", "--instruction", "x",
                "--run-id", "crash-2", "--serve-mcp", f"http://127.0.0.1:{port}/mcp"]
        with trio.fail_after(60):
            done = await trio.run_process(argv, env=clean_env(), capture_stdout=True, capture_stderr=True,
                                          check=False, stdin=b"")
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    [line] = done.stdout.decode().splitlines()
    doc = json.loads(line)
    assert doc["run_id"] == "crash-2" and doc["status"] == "crashed" and doc["done"] is True
    assert doc["error"].startswith("OSError: ")
