"""Elicitation and sampling against npm server-everything, which registers its ``trigger-elicitation-request`` and
``trigger-sampling-request`` tools only for a client that declares the capability. Default: agentd declares
none, so neither tool exists. Opted in (``--mcp-capabilities``): a question lands in ``agentd ctl approvals`` and
``agentd ctl answer`` answers it (checked against the server's schema); without anyone to ask it is declined at
once; a sampling request goes through agentd's own gateway with no tools, and its tokens count in the run's
usage."""

from __future__ import annotations

import json

import pytest

from agentd.mcp.client_session import ClientSession
from agentd.mcp.types import Implementation
from tests.ctl.daemon import Daemon, ctl, daemon
from tests.peers import launch
from tests.peers.gateway import Rule, ScriptedGateway, scripted_gateway, text, tool_call
from tests.waiting import until

pytestmark = pytest.mark.interop

ELICIT = "ev__trigger-elicitation-request"
SAMPLE = "ev__trigger-sampling-request"


def chats(gw: ScriptedGateway) -> list[object]:
    return [r for r in gw.requests if r.path.endswith("/chat/completions")]


def last_tool_message(gw: ScriptedGateway) -> str:
    return [str(m.get("content")) for m in chats(gw)[-1].messages if m.get("role") == "tool"][-1]  # type: ignore[attr-defined]


async def questions(d: Daemon, sock: str, timeout: float = 60) -> list[dict[str, object]]:
    async def asked() -> list[dict[str, object]] | None:
        assert d.alive(), d.stderr.read_text()[-3000:]
        code, doc = await ctl("approvals", "--socket", sock)
        return list(doc["approvals"]) if code == 0 and doc["approvals"] else None

    return list(await until(asked, timeout=timeout, what="a question waiting"))


def test_the_handshake_declares_only_what_the_host_opted_in() -> None:
    info = Implementation(name="agentd", version="1")
    assert ClientSession(info).start_initialize().params["capabilities"] == {}  # type: ignore[index]
    opted = ClientSession(info, declared=("elicitation",))
    assert opted.start_initialize().params["capabilities"] == {"elicitation": {}}  # type: ignore[index]


async def test_by_default_the_server_sees_no_capability(tmp_path, everything_server: launch.PeerProcess):
    async with scripted_gateway(default=text("fine")) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"ev={everything_server.url}", "--instruction", "Look."]
        async with daemon(argv, tmp_path) as d:
            code, _ = await d.wait()
        assert code == 0
        offered = chats(gw)[0].tool_names  # type: ignore[attr-defined]
        assert "ev__echo" in offered and ELICIT not in offered and SAMPLE not in offered


async def test_a_question_is_answered_through_ctl_checked_against_its_schema(
        tmp_path, everything_server: launch.PeerProcess):
    sock = str(tmp_path / "agentd.sock")
    rules = [Rule({"last_role": "tool"}, text("thanks"))]
    async with scripted_gateway(rules=rules, default=tool_call(ELICIT, {})) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"ev={everything_server.url}", "--mcp-capabilities",
                "ev=elicitation", "--ctl-socket", sock, "--instruction", "Ask me.", "--deadline", "120s"]
        async with daemon(argv, tmp_path) as d:
            [item] = await questions(d, sock)
            assert item["kind"] == "elicitation" and item["server"] == "ev"
            assert item["message"] == "Please provide inputs for the following fields:"
            schema = item["schema"]
            assert isinstance(schema, dict) and schema["required"] == ["name"]
            code, doc = await ctl("approve", str(item["id"]), "--socket", sock)
            assert code == 1 and "answer" in doc["error"]
            code, doc = await ctl("answer", str(item["id"]), json.dumps({"integer": 500}), "--socket", sock)
            assert code == 1 and "does not match the requested schema" in doc["error"]  # still waits
            code, doc = await ctl("answer", str(item["id"]), json.dumps({"name": "Ada", "integer": 7}),
                                  "--socket", sock)
            assert code == 0 and doc["action"] == "accept"
            code, result = await d.wait()
        assert code == 0 and result["result"] == "thanks"
        observed = last_tool_message(gw)
        assert "- Name: Ada" in observed and "- Favorite Integer: 7" in observed
        assert [e["action"] for e in d.events("elicitation.decided")] == ["accept"]


async def test_with_nobody_to_ask_a_question_is_declined_at_once(tmp_path, everything_server: launch.PeerProcess):
    rules = [Rule({"last_role": "tool"}, text("declined"))]
    async with scripted_gateway(rules=rules, default=tool_call(ELICIT, {})) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"ev={everything_server.url}", "--mcp-capabilities",
                "ev=elicitation", "--instruction", "Ask me.", "--deadline", "120s"]
        async with daemon(argv, tmp_path) as d:
            code, result = await d.wait()
        assert code == 0 and result["result"] == "declined"
        assert "declined" in last_tool_message(gw)
        assert [e["action"] for e in d.events("elicitation.decided")] == ["decline"]


async def test_sampling_uses_the_run_gateway_without_tools_and_counts_its_tokens(
        tmp_path, everything_server: launch.PeerProcess):
    rules = [Rule({"no_tools": True}, text("a sampled line", usage={"prompt_tokens": 40, "completion_tokens": 9})),
             Rule({"last_role": "tool"}, text("relayed"))]
    async with scripted_gateway(rules=rules, default=tool_call(SAMPLE, {"prompt": "say hi"})) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"ev={everything_server.url}", "--mcp-capabilities",
                "ev=sampling", "--instruction", "Sample.", "--deadline", "120s", "--model", "m-1"]
        async with daemon(argv, tmp_path) as d:
            code, result = await d.wait()
        assert code == 0 and result["result"] == "relayed"
        sampled = [r for r in chats(gw) if not r.tool_names]  # type: ignore[attr-defined]
        assert len(sampled) == 1 and sampled[0].body["model"] == "m-1"  # type: ignore[attr-defined]
        assert [m["role"] for m in sampled[0].messages] == ["system", "user"]  # type: ignore[attr-defined]
        assert "say hi" in sampled[0].messages[1]["content"]  # type: ignore[attr-defined]
        assert "a sampled line" in last_tool_message(gw)
        usage = result["usage"]
        assert usage["prompt_tokens"] == 10 + 40 + 10 and usage["completion_tokens"] == 5 + 9 + 5
        [event] = d.events("sampling.request")
        assert event["outcome"] == "ok" and event["prompt_tokens"] == 40


async def test_a_sampling_reply_s_cost_is_charged_to_the_money_budget(tmp_path, everything_server: launch.PeerProcess):
    """A sampled reply is a model reply of the run: priced like a step's and charged to the tree's money books, so
    the next reply of the run, cheap itself, finds the budget spent (``--budget-usd``)."""
    rules = [Rule({"no_tools": True}, text("a sampled line", usage={"prompt_tokens": 40_000, "completion_tokens": 9})),
             Rule({"last_role": "tool"}, text("relayed"))]
    async with scripted_gateway(rules=rules, default=tool_call(SAMPLE, {"prompt": "say hi"})) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"ev={everything_server.url}", "--mcp-capabilities",
                "ev=sampling", "--instruction", "Sample.", "--deadline", "120s", "--model", "m-1",
                "--price", "m-1=3/15", "--budget-usd", "0.01"]
        async with daemon(argv, tmp_path) as d:
            code, result = await d.wait()
    assert "a sampled line" in last_tool_message(gw)
    assert code == 7 and result["status"] == "exhausted_budget", result
    assert result["usage"]["cost_usd"] > 0.1  # the sampled 40,000 prompt tokens at $3 per million


async def test_a_subagent_s_question_reaches_the_person_at_the_root(tmp_path, everything_server: launch.PeerProcess):
    from tests.peers.gateway import RecordedRequest

    def said(request: RecordedRequest) -> str:
        return " ".join(str(m.get("content")) for m in request.messages[:2] if m.get("role") in ("system", "user"))

    def reply(request: RecordedRequest) -> dict[str, object]:
        last = request.messages[-1] if request.messages else {}
        if "CHILD" in said(request):
            return text(f"child saw: {last.get('content')}") if last.get("role") == "tool" else tool_call(ELICIT, {})
        if last.get("role") == "tool":
            return text(f"parent got: {last.get('content')}")
        return tool_call("subagent_spawn", {"instruction": "CHILD: ask the user"})

    sock = str(tmp_path / "agentd.sock")
    async with scripted_gateway(default=reply) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"ev={everything_server.url}", "--mcp-capabilities",
                "ev=elicitation", "--ctl-socket", sock, "--instruction", "PARENT: delegate", "--deadline", "120s"]
        async with daemon(argv, tmp_path) as d:
            [item] = await questions(d, sock)
            assert item["kind"] == "elicitation" and item["server"] == "ev"
            code, _ = await ctl("answer", str(item["id"]), json.dumps({"name": "Grace"}), "--socket", sock)
            assert code == 0
            code, result = await d.wait()
        assert code == 0 and "- Name: Grace" in str(result["result"])
        assert len(chats(gw)) == 4


def journal_records(state: object, run_id: str) -> list[dict[str, object]]:
    import subprocess
    import sys

    from tests.ctl.daemon import ROOT, env

    shown = subprocess.run([sys.executable, "-m", "agentd", "journal", "export", run_id, "--state-dir", str(state)],
                           capture_output=True, check=True, env=env(), cwd=ROOT, timeout=60)
    return list(json.loads(shown.stdout)["records"])


async def test_a_question_is_journaled_its_answer_recorded_and_after_sigkill_it_is_recorded_cancelled(
        tmp_path, everything_server: launch.PeerProcess):
    """With ``--state-dir`` a question is committed before the wait and its answer after. A SIGKILL while one
    waits ends the server's request with the process: the restarted run records the question ``cancel``, tells
    the model the call's outcome is unknown (the tool is not idempotent), lists nothing, and goes on: here the
    model asks again, and that question is answered and recorded."""
    from tests.ctl.daemon import kill

    state = tmp_path / "state"
    sock = str(state / "ctl.sock")
    rules = [Rule({"last_contains": "may or may not have run"}, tool_call(ELICIT, {})),
             Rule({"last_role": "tool"}, text("thanks"))]
    async with scripted_gateway(rules=rules, default=tool_call(ELICIT, {})) as gw:
        argv = ["--intelligence", gw.url, "--mcp", f"ev={everything_server.url}", "--mcp-capabilities",
                "ev=elicitation", "--state-dir", str(state), "--run-id", "ask-crash", "--instruction", "Ask me.",
                "--deadline", "120s"]
        async with daemon(argv, tmp_path, "first") as first:
            await questions(first, sock)
            kill(first)
            await first.wait()
        kinds = [r["kind"] for r in journal_records(state, "ask-crash")]
        assert "elicitation.pending" in kinds and "elicitation.decided" not in kinds

        async with daemon(argv, tmp_path, "second") as second:
            [again] = await questions(second, sock)  # the model asked again: a new question (the old one is gone)
            code, _ = await ctl("answer", str(again["id"]), json.dumps({"name": "Ada", "integer": 7}),
                                "--socket", sock)
            assert code == 0
            code, result = await second.wait()
        assert code == 0 and result["result"] == "thanks"
        told = [str(m.get("content")) for m in chats(gw)[-2].messages if m.get("role") == "tool"]  # type: ignore[attr-defined]
        assert "may or may not have run" in told[-1]
        records = journal_records(state, "ask-crash")
        asked = [r for r in records if r["kind"] == "elicitation.pending"]
        settled = [r for r in records if r["kind"] == "elicitation.decided"]
        assert len(asked) == 2 and asked[0]["server"] == "ev" and asked[0]["message"]
        assert [(r["action"], r["call_id"]) for r in settled] == [("cancel", asked[0]["call_id"]),
                                                                   ("accept", asked[1]["call_id"])]
        assert "stopped before it was answered" in str(settled[0]["reason"])
        assert settled[1]["content"] == {"name": "Ada", "integer": 7}  # the answer, as the server got it
        assert [e["action"] for e in second.events("elicitation.decided")] == ["cancel", "accept"]
