"""A serving daemon at a real terminal (a pty) says where it serves, and the status line stays alive while the
model thinks; through a pipe neither is drawn (JSON lines, ``proc.ready`` among them) and stdout is one JSON
document."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from tests.cli.helpers import clean_env
from tests.peers import launch
from tests.peers.gateway import gateway_argv
from tests.terminal.pty_run import CONTROL, PtyRun

SERVE = ["--serve-mcp", "http://127.0.0.1:0/mcp", "--serve-a2a", "--intelligence", "test",
         "--metrics-addr", "127.0.0.1:0"]


def _events_until(proc: subprocess.Popen[str], name: str, timeout: float = 60.0) -> list[dict]:
    """The daemon's stderr event lines up to the first ``name`` one; a daemon that says nothing for ``timeout``
    seconds is killed (its stderr ends, the test fails)."""
    assert proc.stderr is not None
    events: list[dict] = []
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        for line in proc.stderr:
            events.append(json.loads(line))  # every stderr line is a JSON event
            if events[-1]["event"] == name:
                return events
    finally:
        watchdog.cancel()
    raise AssertionError(f"no {name} before the daemon ended: {events[-5:]}")


def _field(screen: str, label: str) -> str:
    match = re.search(rf"^  {re.escape(label)} +(\S+)$", screen, re.MULTILINE)
    assert match, f"no {label!r} line in:\n{screen[-3000:]}"
    return match.group(1)


def test_a_serving_daemon_says_where_it_serves(tmp_path, no_leftover_children) -> None:
    state = tmp_path / "state"
    run = PtyRun([*SERVE, "--state-dir", str(state)])
    try:
        run.read_until("agentd top http://")
        screen = run.read_until("· serving")  # the status line comes after the whole banner
        assert "agentd is listening (once mode)" in screen
        mcp = _field(screen, "MCP")
        port = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/mcp", mcp)
        assert port and port.group(1) != "0", mcp  # the URL as given, with the port it is bound to
        origin = f"127.0.0.1:{port.group(1)}"
        assert _field(screen, "A2A card") == f"http://{origin}/.well-known/agent-card.json"
        assert _field(screen, "events") == f"ws://{origin}/events"
        assert _field(screen, "browser") == f"http://{origin}/ui/"
        assert _field(screen, "state") == str(state)
        assert _field(screen, "control") == str(state / "ctl.sock")
        assert f"  watch     agentd top {mcp}" in screen.splitlines()
        metrics = _field(screen, "metrics")
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", metrics) and ":0/" not in metrics
        # the addresses are the real ones: the metrics and the card answer there
        assert httpx.get(metrics, timeout=10).status_code == 200
        card = httpx.get(_field(screen, "A2A card"), timeout=10)
        assert card.status_code == 200 and card.json()["name"]
        assert "model None" not in screen and "step 0" not in screen
        assert '"event"' not in screen  # no raw JSON lines for a person
        run.interrupt()
        code, screen, stdout = run.finish()
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
    assert code == 0, screen[-3000:]
    assert json.loads(stdout)["status"] == "completed"


def test_a_daemon_mode_shows_its_model_and_gateway(tmp_path) -> None:
    run = PtyRun(["--mode", "loop", "--instruction", "tick", "--intelligence", "test", "--interval", "1h",
                  "--serve-mcp", "http://127.0.0.1:0/mcp"])
    try:
        run.read_until("agentd top http://")
        screen = run.read_until("loop daemon ")
        screen = run.read_until("servers: none")
        assert re.search(r"^loop daemon \S+ · model \S+ via test · servers: none$", screen, re.MULTILINE), screen
        assert "model None" not in screen
        run.read_until("▸ woken by loop")
        run.read_until("✓ completed after 1 step")
        run.interrupt()
        code, screen, _ = run.finish()
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
    assert code == 0, screen[-3000:]
    # the wake, the drain and the daemon's end, each said plainly (no raw event line)
    assert "draining (signal)" in screen and "drained after 1 wake" in screen
    assert "✓ daemon stopped: completed" in screen
    assert "loop.final" not in screen and "exit None" not in screen and "{" not in screen


@pytest.fixture
def slow_gateway(tmp_path):
    """A model that holds its one reply for a few seconds."""
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"rules": [], "default": {"content": "thought it over", "delay": 4}}))
    with launch.start_peer(gateway_argv(path)) as gw:
        yield gw


def _pieces(raw: str) -> list[str]:
    """The text a terminal received, cut at every control sequence (each redraw is a piece of its own)."""
    return CONTROL.sub("\n", re.sub(r"\x1b\[[0-9;]*m", "", raw)).split("\n")  # styles are not cuts


def _status_draws(raw: str) -> list[str]:
    """Every status line drawn while the model was awaited (the text between the control sequences)."""
    pieces = [piece.strip() for piece in _pieces(raw) if "waiting for the model" in piece]
    return [piece for piece in pieces if re.search(r"waiting for the model \(\d+ s\)$", piece)]


def test_the_status_line_stays_alive_while_the_model_thinks(slow_gateway) -> None:
    run = PtyRun(["--instruction", "think", "--intelligence", slow_gateway.url])
    code, screen, stdout = run.finish()
    assert code == 0, screen[-3000:]
    draws = _status_draws(run.text)
    waited = {int(re.search(r"\((\d+) s\)$", draw).group(1)) for draw in draws}  # type: ignore[union-attr]
    # redrawn while nothing else happened: the spinner turned and the time waited counted up, second by second
    assert len(set(draws)) >= 4, draws
    assert len(waited) >= 3, draws
    assert json.loads(stdout)["result"] == "thought it over"


def test_through_a_pipe_nothing_is_drawn(slow_gateway, tmp_path) -> None:
    env = clean_env({})
    proc = subprocess.Popen([sys.executable, "-m", "agentd", *SERVE, "--instruction", "think",
                             "--intelligence", slow_gateway.url], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        events = _events_until(proc, "run.end")
        proc.send_signal(signal.SIGINT)
        stdout, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events += [json.loads(line) for line in rest.splitlines()]
    ready = [e for e in events if e["event"] == "proc.ready"]
    assert len(ready) == 1 and re.fullmatch(r"http://127\.0\.0\.1:\d+/mcp", ready[0]["mcp"])
    assert ready[0]["watch"] == f"agentd top {ready[0]['mcp']}"
    assert ready[0]["a2a_card"].endswith("/.well-known/agent-card.json") and ready[0]["metrics"].endswith("/metrics")
    assert json.loads(stdout)["result"] == "thought it over"  # one JSON document


def test_ctl_at_a_terminal_is_for_a_person_and_json_through_a_pipe(tmp_path, no_leftover_children) -> None:
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "agentd", "--serve-mcp", "http://127.0.0.1:0/mcp",
                             "--intelligence", "test", "--state-dir", str(state)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env({}), text=True)
    try:
        _events_until(proc, "proc.ready")
        code, screen, _ = PtyRun(["ctl", "status", "--state-dir", str(state)], stdout_tty=True).finish()
        assert code == 0, screen
        assert re.search(rf"^once daemon · run \S+ · pid {proc.pid} · ready$", screen, re.MULTILINE), screen
        assert "no run in flight" in screen and "{" not in screen
        code, screen, _ = PtyRun(["ctl", "status", "--json", "--state-dir", str(state)], stdout_tty=True).finish()
        assert code == 0 and json.loads(screen)["pid"] == proc.pid
        piped = subprocess.run([sys.executable, "-m", "agentd", "ctl", "lame-duck", "--state-dir", str(state)],
                               capture_output=True, text=True, env=clean_env({}), timeout=60, check=False)
        assert piped.returncode == 0 and json.loads(piped.stdout) == {"lame_duck": True, "ready": False}
        code, screen, _ = PtyRun(["ctl", "cancel", "nope", "--state-dir", str(state)], stdout_tty=True).finish()
        assert code == 1 and screen.startswith("agentd ctl cancel: "), screen
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert json.loads(stdout)["status"] == "completed"


def test_journal_at_a_terminal_is_a_table_and_json_through_a_pipe(tmp_path) -> None:
    state = str(tmp_path / "state")
    done = subprocess.run([sys.executable, "-m", "agentd", "--instruction", "hi", "--intelligence", "test",
                           "--state-dir", state, "--run-id", "r-table"], capture_output=True, text=True,
                          env=clean_env({}), timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    piped = subprocess.run([sys.executable, "-m", "agentd", "journal", "show", "r-table", "--state-dir", state],
                           capture_output=True, text=True, env=clean_env({}), timeout=60, check=False)
    kinds = [r["kind"] for r in json.loads(piped.stdout)["records"]]
    code, screen, _ = PtyRun(["journal", "list", "--state-dir", state], stdout_tty=True).finish()
    assert code == 0 and "{" not in screen
    assert re.search(r"r-table\s+│\s+completed\s+│\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", screen), screen
    code, screen, _ = PtyRun(["journal", "show", "r-table", "--state-dir", state], stdout_tty=True).finish()
    assert code == 0 and "{" not in screen
    rows = [line for line in screen.splitlines() if re.match(r"│\s+\d+\s+│", line)]
    assert [row.split("│")[3].strip() for row in rows] == kinds, screen  # every record, in order
    code, screen, _ = PtyRun(["journal", "show", "nope", "--state-dir", state], stdout_tty=True).finish()
    assert code == 1 and screen.strip() == "agentd journal show: no run 'nope' in the journal", screen
    code, screen, _ = PtyRun(["journal", "list", "--json", "--state-dir", state], stdout_tty=True).finish()
    assert code == 0 and json.loads(screen)["runs"][0]["run_id"] == "r-table"


STREAMED = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa"


@pytest.mark.parametrize("content", [True, False])
def test_a_streamed_reply_appears_as_it_arrives_with_log_content(tmp_path, content) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"rules": [], "default": {"content": STREAMED, "chunk": 6, "chunk_delay": 0.2}}))
    with launch.start_peer(gateway_argv(path)) as gw:
        run = PtyRun(["--instruction", "spell", "--intelligence", gw.url, "--stream-intelligence",
                      *(["--log-content"] if content else [])])
        code, screen, stdout = run.finish()
    assert code == 0, screen[-3000:]
    assert json.loads(stdout)["result"] == STREAMED
    draws = [piece for piece in _pieces(run.text) if "waiting for the model" in piece]
    partial = [draw for draw in draws if "alpha" in draw and "papa" not in draw]
    if content:
        # the status line showed the reply growing before it was complete
        assert len({draw.split(" · ")[-1] for draw in partial}) >= 3, draws
    else:
        assert not any("alpha" in draw for draw in draws)  # text is shown only where --log-content lets it
