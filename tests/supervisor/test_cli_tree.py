"""The whole tree through the command line: a root that delegates, and a drain with a child in flight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tests.peers import launch, proctree
from tests.peers.gateway import gateway_argv, read_record
from tests.waiting import until_sync


def _script(tmp_path, child_reply):
    script = {
        "rules": [
            {"match": {"contains": "CHILD TASK"}, "reply": child_reply},
            {"match": {"last_role": "tool"}, "reply": {"content": "root done"}},
        ],
        "default": {"tool_calls": [{"name": "subagent_spawn", "arguments": {"instruction": "CHILD TASK"}}]},
    }
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    return path


def _agentd(url, *extra):
    return [sys.executable, "-m", "agentd", "--instruction", "ROOT TASK: delegate it", "--intelligence", url,
            "--log-level", "info", *extra]


def test_a_root_run_delegates_to_a_forked_child(tmp_path, no_leftover_children):
    record = tmp_path / "record.jsonl"
    with launch.start_peer(gateway_argv(_script(tmp_path, {"content": "child says hi"}), record)) as gw:
        done = subprocess.run(_agentd(gw.url), capture_output=True, timeout=60, cwd=os.getcwd())
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout)
    assert out["status"] == "completed" and "root done" in json.dumps(out["result"])
    requests = read_record(record)
    tool_results = [m for r in requests for m in r.messages if m.get("role") == "tool"]
    assert any("child says hi" in str(m.get("content")) and "0.1" in str(m.get("content")) for m in tool_results)
    events = [json.loads(line) for line in done.stderr.decode().splitlines() if line.startswith("{")]
    assert any(e["event"] == "subagent.exit" and e["status"] == "completed" for e in events)


def test_sigterm_drains_a_run_with_a_child_in_flight_and_exits_0(tmp_path, no_leftover_children):
    slow_child = {"content": "too late", "delay": 60}
    with launch.start_peer(gateway_argv(_script(tmp_path, slow_child))) as gw:
        proc = subprocess.Popen(_agentd(gw.url, "--drain-timeout", "1"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=os.getcwd())
        try:
            # Wait until the child exists (the root's tree has the fork server and the child).
            tree = until_sync(lambda: len(t := proctree.descendants(proc.pid)) >= 2 and t, timeout=30,
                              what="the child process")
            time.sleep(0.5)  # real time: the real child starts its (60 s) model call
            proc.send_signal(signal.SIGTERM)
            _stdout, stderr = proc.communicate(timeout=40)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, stderr.decode()[-3000:]
    events = [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert "subagent.drain" in names
    cancels = [e.get("reason") for e in events if e["event"] == "subagent.cancel"]
    assert cancels and set(cancels) <= {"draining", "parent ended"}, cancels
    assert not [p for p in tree if os.path.exists(f"/proc/{p}")]
