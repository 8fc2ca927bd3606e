"""Approvals with real processes: a tool marked ``--approve`` waits for a person before each call. ``agentd ctl
approve`` sends it exactly once, ``deny`` never sends it and the model reads why; a SIGKILL while one waits, and a
restart with the same ``--run-id``, lists it again and still sends nothing; without a control socket the call is
denied at once. The counting peer executes what it is sent, so "sent" is counted at the server."""

from __future__ import annotations

import json
import re
import sys

import pytest
import trio

from tests.ctl.daemon import Daemon, ctl, daemon, env, kill
from tests.durable.peer import counting_peer
from tests.peers.gateway import Rule, ScriptedGateway, scripted_gateway, text, tool_call
from tests.waiting import until

pytestmark = pytest.mark.interop


def chats(gw: ScriptedGateway) -> list[object]:
    return [r for r in gw.requests if r.path.endswith("/chat/completions")]


def tool_messages(gw: ScriptedGateway) -> list[str]:
    last = [r for r in gw.requests if r.path.endswith("/chat/completions")][-1]
    return [str(m.get("content")) for m in last.messages if m.get("role") == "tool"]


async def waiting(d: Daemon, sock: str, count: int = 1, timeout: float = 60) -> list[dict[str, object]]:
    """Poll ``agentd ctl approvals`` until ``count`` items wait; the daemon must stay up."""
    async def pending() -> list[dict[str, object]] | None:
        assert d.alive(), d.stderr.read_text()[-3000:]
        code, doc = await ctl("approvals", "--socket", sock)
        return list(doc["approvals"]) if code == 0 and len(doc["approvals"]) >= count else None

    return list(await until(pending, timeout=timeout, what=f"{count} approvals waiting"))


async def test_approve_sends_once_deny_never_sends_and_the_model_reads_why(tmp_path):
    state = tmp_path / "state"
    sock = str(state / "ctl.sock")
    rules = [Rule({"last_contains": "execution #1"}, tool_call("pay__charge", {"key": "k2"})),
             Rule({"last_contains": "too expensive"}, text("k1 charged, k2 refused"))]
    async with (
        scripted_gateway(rules=rules, default=tool_call("pay__charge", {"key": "k1", "hold": "a" * 300})) as gw,
        counting_peer() as peer,
    ):
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--approve", "pay__charge",
                "--instruction", "Charge k1 and k2.", "--run-id", "appr-1", "--state-dir", str(state),
                "--deadline", "120s"]
        async with daemon(argv, tmp_path) as d:
            [item] = await waiting(d, sock)
            assert item["tool"] == "pay__charge" and item["run_id"] == "appr-1" and item["kind"] == "approval"
            args = item["arguments"]
            assert isinstance(args, dict) and args["key"] == "k1"  # a short value whole
            assert str(args["hold"]).startswith("a" * 80 + "…") and "300 chars" in str(args["hold"])  # a long one cut
            assert isinstance(item["waiting_s"], float) and item["waiting_s"] >= 0
            assert peer.received == []  # held: nothing reached the server
            code, status = await ctl("status", "--socket", sock)
            assert code == 0 and status["approvals"] == 1

            code, doc = await ctl("approve", str(item["id"]), "--socket", sock)
            assert code == 0 and doc == {"id": item["id"], "kind": "approval", "action": "approve", "run_id": "appr-1"}
            code, doc = await ctl("approve", str(item["id"]), "--socket", sock)  # decided: nothing waits under it
            assert code == 1 and "nothing waits" in doc["error"]

            [second] = await waiting(d, sock)  # the next call, k2, waits in its turn
            assert second["arguments"] == {"key": "k2"} and second["id"] != item["id"]
            assert peer.count("charge") == 1
            code, doc = await ctl("deny", str(second["id"]), "too expensive", "--socket", sock)
            assert code == 0 and doc["action"] == "deny"
            code, result = await d.wait()
        assert code == 0 and result["status"] == "completed" and result["result"] == "k1 charged, k2 refused"
        assert [c["key"] for c in peer.received] == ["k1"] and peer.count("charge") == 1  # k2 never sent
        denial = tool_messages(gw)[-1]
        assert "denied" in denial and "not sent" in denial and "too expensive" in denial
        decided = d.events("approval.decided")
        assert [(e["action"], e.get("reason")) for e in decided] == [("approve", None), ("deny", "too expensive")]
        assert len(d.events("approval.pending")) == 2


async def test_a_pending_approval_survives_sigkill_and_is_asked_again_never_sent(tmp_path):
    state = tmp_path / "state"
    sock = str(state / "ctl.sock")
    async with (
        scripted_gateway(rules=[Rule({"last_role": "tool"}, text("done"))],
                         default=tool_call("pay__charge", {"key": "k9"})) as gw,
        counting_peer() as peer,
    ):
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--approve", "pay__charge",
                "--instruction", "Charge k9.", "--run-id", "appr-crash", "--state-dir", str(state),
                "--deadline", "120s"]
        async with daemon(argv, tmp_path, "first") as first:
            await waiting(first, sock)
            kill(first)
            await first.wait()
        listed = await trio.run_process([sys.executable, "-m", "agentd", "journal", "show", "appr-crash",
                                         "--state-dir", str(state)], capture_stdout=True, env=env())
        kinds = [r["kind"] for r in json.loads(listed.stdout)["records"]]
        assert "approval.pending" in kinds and "approval.decided" not in kinds

        async with daemon(argv, tmp_path, "second") as second:
            [again] = await waiting(second, sock)  # resumed from the journal: asked again, not sent
            assert again["tool"] == "pay__charge" and again["run_id"] == "appr-crash"
            assert peer.received == [] and len(chats(gw)) == 1  # no new model call either
            code, _ = await ctl("approve", str(again["id"]), "--socket", sock)
            assert code == 0
            code, result = await second.wait()
        assert code == 0 and result["status"] == "completed"
        assert peer.count("charge") == 1 and len(peer.received) == 1


async def test_without_a_person_to_ask_the_call_is_denied_at_once(tmp_path):
    async with (
        scripted_gateway(rules=[Rule({"last_role": "tool"}, text("could not"))],
                         default=tool_call("pay__charge", {"key": "k3", "api_key": "sk-live-abcdefghijklmnop"})) as gw,
        counting_peer() as peer,
    ):
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--approve", "pay__*",
                "--instruction", "Charge k3."]
        async with daemon(argv, tmp_path) as d:
            code, result = await d.wait()
        assert code == 0 and result["result"] == "could not"
        assert peer.received == []
        denial = tool_messages(gw)[-1]
        assert "denied" in denial and "--ctl-socket" in denial
        assert [e["action"] for e in d.events("approval.decided")] == ["deny"]


async def test_approvals_at_a_terminal_is_a_table_and_secrets_are_redacted(tmp_path):
    from tests.terminal.pty_run import PtyRun

    sock = str(tmp_path / "agentd.sock")
    async with (
        scripted_gateway(rules=[Rule({"last_role": "tool"}, text("ok"))],
                         default=tool_call("pay__charge", {"key": "k4", "password": "hunter2hunter2",
                                                           "hold": "sk-live-abcdefghijklmnop1234"})) as gw,
        counting_peer() as peer,
    ):
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--approve", "pay__charge",
                "--instruction", "Charge k4.", "--ctl-socket", sock, "--deadline", "120s"]
        async with daemon(argv, tmp_path) as d:
            [item] = await waiting(d, sock)
            assert item["arguments"] == {"key": "k4", "password": "***", "hold": "***"}
            code, screen, _ = await trio.to_thread.run_sync(
                lambda: PtyRun(["ctl", "approvals", "--socket", sock], stdout_tty=True).finish())
            assert code == 0, screen
            assert "{" not in screen.split("\n")[0]
            assert re.search(rf"│ {item['id']} +│ pay__charge", screen), screen
            assert "key=k4" in screen and "hunter2" not in screen and "abcdefghijkl" not in screen
            code, _doc = await ctl("deny", str(item["id"]), "--socket", sock)
            assert code == 0
            code, _result = await d.wait()
        assert code == 0 and peer.received == []
        assert "denied by the operator" in tool_messages(gw)[-1]


async def test_approvals_appear_on_the_events_stream(tmp_path):
    from trio_websocket import open_websocket_url

    from tests.telemetry.test_events_stream import _serving

    sock = str(tmp_path / "agentd.sock")
    subscribed = trio.Event()  # /events replays no past line: the model asks for the call once the test listens
    async with (
        scripted_gateway(rules=[Rule({"last_role": "tool"}, text("ok"))],
                         default={**tool_call("pay__charge", {"key": "k5"}), "wait": subscribed}) as gw,
        counting_peer() as peer,
        trio.open_nursery() as nursery,
    ):
        base, latch, _ = await _serving(nursery, [
            "--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--approve", "pay__charge",
            "--instruction", "Charge k5.", "--ctl-socket", sock, "--serve-mcp", "http://127.0.0.1:0/mcp",
            "--deadline", "120s"], {})
        got: list[dict[str, object]] = []
        async with open_websocket_url(base.replace("http://", "ws://") + "/events") as ws:
            with trio.fail_after(30):  # the stream has begun (the tree's snapshot): this subscriber is live
                got.append(json.loads(await ws.get_message()))
            subscribed.set()
            with trio.fail_after(30):
                while not any(m.get("event") == "approval.pending" for m in got):
                    got.append(json.loads(await ws.get_message()))
            pending = next(m for m in got if m.get("event") == "approval.pending")
            assert pending["server"] == "pay" and pending["tool"] == "charge"
            code, _ = await ctl("approve", str(pending["id"]), "--socket", sock)
            assert code == 0
            with trio.fail_after(30):
                while not any(m.get("event") == "approval.decided" for m in got):
                    got.append(json.loads(await ws.get_message()))
        decided = next(m for m in got if m.get("event") == "approval.decided")
        assert decided["action"] == "approve" and decided["id"] == pending["id"]
        await until(lambda: peer.count("charge") >= 1, timeout=30, what="the charge sent")
        latch.request("test")
    assert peer.count("charge") == 1


async def test_a_drain_releases_the_wait_and_the_restart_asks_again(tmp_path):
    import signal

    state = tmp_path / "state"
    sock = str(state / "ctl.sock")
    async with (
        scripted_gateway(rules=[Rule({"last_role": "tool"}, text("gave up"))],
                         default=tool_call("pay__charge", {"key": "k6"})) as gw,
        counting_peer() as peer,
    ):
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--approve", "pay__charge",
                "--instruction", "Charge k6.", "--run-id", "appr-drain", "--state-dir", str(state),
                "--deadline", "600s", "--drain-timeout", "600s"]
        async with daemon(argv, tmp_path, "first") as first:
            await waiting(first, sock)
            first.proc.send_signal(signal.SIGTERM)
            code, result = await first.wait(timeout=120)  # well before the drain timeout: the wait was released
        assert code == 0 and result["status"] == "cancelled", result
        assert peer.received == [] and first.events("approval.decided") == []

        async with daemon(argv, tmp_path, "second") as second:
            [again] = await waiting(second, sock)
            code, _ = await ctl("deny", str(again["id"]), "not today", "--socket", sock)
            assert code == 0
            code, result = await second.wait()
        assert code == 0 and result["result"] == "gave up"
        assert peer.received == [] and "not today" in tool_messages(gw)[-1]


async def test_a_subagent_asks_the_person_at_the_root(tmp_path):
    """A subagent's process has no control socket: its marked call is asked about at the root (the ``ask`` frame
    up the tree), listed there with the child's run, and sent once when approved there."""
    from tests.peers.gateway import RecordedRequest

    def said(request: RecordedRequest) -> str:
        return " ".join(str(m.get("content")) for m in request.messages[:2] if m.get("role") in ("system", "user"))

    def reply(request: RecordedRequest) -> dict[str, object]:
        last = request.messages[-1] if request.messages else {}
        if "CHILD" in said(request):
            if last.get("role") == "tool":
                return text(f"child saw: {last.get('content')}")
            return tool_call("pay__charge", {"key": "order-3"})
        if last.get("role") == "tool":
            return text(f"parent got: {last.get('content')}")
        return tool_call("subagent_spawn", {"instruction": "CHILD: charge order 3"})

    sock = str(tmp_path / "agentd.sock")
    async with scripted_gateway(default=reply) as gw, counting_peer() as peer:
        argv = ["--intelligence", gw.url, "--mcp", f"pay={peer.origin}/mcp", "--approve", "pay__charge",
                "--instruction", "PARENT: delegate", "--run-id", "tree-appr", "--ctl-socket", sock,
                "--deadline", "120s"]
        async with daemon(argv, tmp_path) as d:
            [item] = await waiting(d, sock)
            assert item["tool"] == "pay__charge" and item["run_id"] != "tree-appr"  # the child's run
            assert item["arguments"] == {"key": "order-3"} and peer.received == []
            code, _ = await ctl("approve", str(item["id"]), "--socket", sock)
            assert code == 0
            code, result = await d.wait()
        assert code == 0 and "charge order-3 done (execution #1)" in str(result["result"])
        assert peer.count("charge") == 1
