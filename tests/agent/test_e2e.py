"""agentd.main end to end: a real scripted gateway (HTTP) and real MCP servers in their own processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import agentd
from agentd.config.model import IntelligenceConfig
from agentd.telemetry.events import EventLog
from tests.agent import meta_server
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, status, text, tool_call, tool_calls
from tests.waiting import until

pytestmark = [pytest.mark.interop, pytest.mark.usefixtures("no_leftover_children")]


@pytest.fixture(scope="module")
def peer() -> Iterator[launch.PeerProcess]:
    """The SDK peer plus ``whoami``; instructions set; resources test://static, blob, counter, cancelled."""
    with launch.start_peer(meta_server.argv(instructions="Peer says: be brief.", tools=3),
                           cwd=launch.REPO_ROOT) as started:
        yield started


def _cfg(*args: str) -> agentd.Config:
    return agentd.load_config(["--instruction", "do the task", *args], env={})


async def _main(cfg: agentd.Config) -> tuple[agentd.RunResult, list[dict[str, Any]]]:
    lines: list[dict[str, Any]] = []
    with trio.fail_after(30):
        result = await agentd.main(cfg, log=EventLog(sink=lines.append))
    return result, lines


def _tool_contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_call_observation_final_answer(peer: launch.PeerProcess, stream: bool) -> None:
    async with scripted_gateway([tool_call("sdk__add", {"a": 2, "b": 40}), text("The sum is 42.")]) as gw:
        args = ["--intelligence", gw.url, "--mcp", f"sdk={peer.url}", "--run-id", "e2e-1"]
        cfg = _cfg(*args, *(["--stream-intelligence"] if stream else []))
        result, lines = await _main(cfg)
        assert result.to_json() == {
            "run_id": "e2e-1", "status": "completed", "done": True, "partial": False, "result": "The sum is 42.",
            "steps": 2, "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30,
                                  "own": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}},
        }
        assert [r.stream for r in gw.requests] == [stream, stream]
        first, second = gw.requests
        assert "sdk__add" in first.tool_names and "resource_read" in first.tool_names
        assert _tool_contents(second.messages) == ["42"]
        assert {line["run_id"] for line in lines} == {"e2e-1"}
        events = [line["event"] for line in lines]
        assert events[0] == "run.start" and events[-1] == "run.end"


async def test_prompt_holds_server_instructions_and_resource_catalogue(peer: launch.PeerProcess) -> None:
    async with scripted_gateway([text("ok")]) as gw:
        await _main(_cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}"))
        system = gw.requests[0].messages[0]
        assert system["role"] == "system"
        assert 'Server "sdk"' in system["content"] and "Peer says: be brief." in system["content"]
        assert "uri=test://static; server=sdk; name=static; mime=text/plain" in system["content"]
        assert gw.requests[0].messages[-1] == {"role": "user", "content": "do the task"}


async def test_run_id_reaches_tools_call_meta(peer: launch.PeerProcess) -> None:
    async with scripted_gateway([tool_call("sdk__whoami", {}), text("done")]) as gw:
        result, _ = await _main(_cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}", "--run-id", "meta-run-7"))
        assert result.status is agentd.RunStatus.COMPLETED
        observed = json.loads(_tool_contents(gw.requests[1].messages)[0])
        assert "meta-run-7" in observed.values()


async def test_is_error_self_correction_unknown_tool_invalid_arguments(peer: launch.PeerProcess) -> None:
    script = [
        tool_call("sdk__fail", {"message": "disk on fire"}),
        tool_calls(("sdk__nonexistent", {}), ("sdk__add", {"a": "two", "b": 2}), ("sdk__add", "{broken")),
        tool_call("sdk__echo", {"text": "recovered"}),
        text("recovered"),
    ]
    async with scripted_gateway(script) as gw:
        result, lines = await _main(_cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}"))
        assert (result.status.value, result.steps, result.result) == ("completed", 4, "recovered")
        is_error = _tool_contents(gw.requests[1].messages)[-1]
        assert is_error.startswith("[tool error") and "disk on fire" in is_error
        rejected = _tool_contents(gw.requests[2].messages)[-3:]
        assert all(r.startswith("[agentd rejected this call") for r in rejected)
        assert "unknown tool 'sdk__nonexistent'" in rejected[0]
        assert "inputSchema" in rejected[1] and "not valid JSON" in rejected[2]
        assert _tool_contents(gw.requests[3].messages)[-1] == "recovered"
        assert sum(line["event"] == "tool.rejected" for line in lines) == 3


async def test_resource_read_listed_and_unlisted(peer: launch.PeerProcess) -> None:
    script = [tool_calls(("resource_read", {"uri": "test://static"}), ("resource_read", {"uri": "test://item/9"}),
                         ("resource_read", {"uri": "test://nope"})), text("read")]
    async with scripted_gateway(script) as gw:
        await _main(_cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}"))
        static, item, missing = _tool_contents(gw.requests[1].messages)
        assert "static text" in static and "item 9" in item
        assert missing.startswith("[tool error") and "not found" in missing


async def test_budgets_end_with_partial_best_result(peer: launch.PeerProcess) -> None:
    async with scripted_gateway(default=tool_call("sdk__echo", {"text": "x"}, content="still going")) as gw:
        result, lines = await _main(_cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}", "--max-steps", "3"))
        assert (result.status.value, result.partial, result.result, result.steps, int(result.exit_code)) == (
            "exhausted_steps", True, "still going", 3, 7)
        assert any(line["event"] == "loop.budget" for line in lines)
        result, _ = await _main(_cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}", "--max-tokens", "40"))
        assert (result.status.value, result.steps, int(result.exit_code)) == ("exhausted_tokens", 3, 7)


async def test_deadline_cuts_a_slow_tool(peer: launch.PeerProcess) -> None:
    async with scripted_gateway([tool_call("sdk__slow", {"seconds": 30}, content="waiting on slow")]) as gw:
        result, _ = await _main(_cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}", "--deadline", "500ms"))
        assert (result.status.value, result.partial, result.result, int(result.exit_code)) == (
            "deadline", True, "waiting on slow", 7)


async def test_failover_and_429(peer: launch.PeerProcess) -> None:
    async with scripted_gateway([status(429, retry_after=0), tool_call("sdk__echo", {"text": "a"}),
                                 text("through")]) as gw:
        down = "http://127.0.0.1:9/v1"  # discard port: refused
        result, lines = await _main(_cfg("--intelligence", f"{down},{gw.url}", "--mcp", f"sdk={peer.url}"))
        assert (result.status.value, result.result) == ("completed", "through")
        assert len(gw.requests) == 3  # the 429 was retried, the refused endpoint never answered
        assert {"intel.failover", "intel.retry"} & {line["event"] for line in lines}


async def test_offline_test_model(peer: launch.PeerProcess) -> None:
    result, lines = await _main(_cfg("--intelligence", "test", "--mcp", f"sdk={peer.url}"))
    assert result.status is agentd.RunStatus.COMPLETED
    called = {line["tool"] for line in lines if line["event"] == "tool.result"}
    assert {"echo", "add", "whoami"} <= called
    assert result.steps == len(called) + 1


async def test_required_server_down_and_intelligence_down() -> None:
    async with scripted_gateway([text("never")]) as gw:
        result, lines = await _main(_cfg("--intelligence", gw.url, "--mcp", "gone=http://127.0.0.1:9/mcp"))
        assert (result.status.value, int(result.exit_code)) == ("mcp_failed", 6)
        assert lines[-1]["event"] == "run.end" and lines[-1]["exit_code"] == 6
        assert gw.requests == []
    result, _ = await _main(_cfg("--intelligence", "http://127.0.0.1:9/v1"))
    assert (result.status.value, int(result.exit_code)) == ("intelligence_failed", 4)


async def test_two_concurrent_main_runs(peer: launch.PeerProcess) -> None:
    results: dict[str, agentd.RunResult] = {}

    async def one(run_id: str, gw_url: str) -> None:
        results[run_id], _ = await _main(_cfg("--intelligence", gw_url, "--mcp", f"sdk={peer.url}",
                                              "--run-id", run_id))

    async with scripted_gateway([tool_call("sdk__whoami", {}), tool_call("sdk__whoami", {}), text("A")]) as a, \
            scripted_gateway([tool_call("sdk__whoami", {}), text("B")]) as b:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "run-a", a.url)
            nursery.start_soon(one, "run-b", b.url)
        assert (results["run-a"].result, results["run-a"].steps) == ("A", 3)
        assert (results["run-b"].result, results["run-b"].steps) == ("B", 2)
        for gw, run_id in ((a, "run-a"), (b, "run-b")):
            for content in _tool_contents(gw.requests[-1].messages):
                assert run_id in json.loads(content).values()


async def test_server_everything(everything_server: launch.PeerProcess) -> None:
    script = [tool_calls(("everything__echo", {"message": "hello everything"}), ("everything__get-sum", {"a": 2, "b": 3})),
              {"content": '{"echo": "hello everything", "sum": 5}'}]
    async with scripted_gateway(script) as gw:
        result, _ = await _main(_cfg("--intelligence", gw.url, "--mcp", f"everything={everything_server.url}",
                                         "--output-contract", '{"echo": string, "sum": integer}'))
        assert (result.status.value, result.result) == ("completed", {"echo": "hello everything", "sum": 5})
        echo, total = _tool_contents(gw.requests[1].messages)
        assert "hello everything" in echo and "5" in total
        system = gw.requests[0].messages[0]["content"]
        assert "## Resources" in system and "server=everything" in system
        assert "Output contract" in system


async def test_server_everything_task_tool(everything_server: launch.PeerProcess) -> None:
    """A tool the server runs only as a task is offered, called as a task, and its final result is the model's
    observation like any tool result; its statuses go to the event log."""
    script = [tool_call("everything__simulate-research-query", {"topic": "tides"}), text("researched")]
    async with scripted_gateway(script) as gw:
        result, lines = await _main(_cfg("--intelligence", gw.url, "--mcp", f"everything={everything_server.url}"))
        assert (result.status.value, result.result) == ("completed", "researched")
        assert "everything__simulate-research-query" in gw.requests[0].tool_names
        (report,) = _tool_contents(gw.requests[1].messages)
        assert "Research Report: tides" in report
        statuses = [line["status"] for line in lines if line["event"] == "mcp.task"]
        assert statuses[0] == "working" and statuses[-1] == "completed"


def _open_connections_to(port: int) -> int:
    """TCP connections this test's side still holds open to 127.0.0.1:``port`` (established, or closed by the
    server but not yet by the client), read from /proc/net/tcp."""
    held = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port, state = int(fields[2].rsplit(":", 1)[1], 16), fields[3]
        held += remote_port == port and state in ("01", "08")  # ESTABLISHED, CLOSE_WAIT
    return held


@pytest.fixture(scope="module")
def task_peer() -> Iterator[launch.PeerProcess]:
    """The modern-wire peer whose ``research`` tool always runs as a task (polled every 200 ms)."""
    with launch.start_peer(launch.modern_server_argv(tasks=True)) as started:
        yield started


async def test_a_run_waiting_on_a_task_holds_no_gateway_connection(task_peer: launch.PeerProcess) -> None:
    """While a tool call waits on its task (for hours, perhaps), the run's model client keeps no connection to
    the gateway alive; the model call after the task ended connects anew and goes on."""
    script = [tool_call("m__research", {"topic": "tides", "seconds": 3600}), text("researched")]
    lines: list[dict[str, Any]] = []
    async with scripted_gateway(script) as gw, trio.open_nursery() as nursery:
        done: list[agentd.RunResult] = []

        async def run() -> None:
            cfg = _cfg("--intelligence", gw.url, "--mcp", f"m={task_peer.url}")
            done.append(await agentd.main(cfg, log=EventLog(sink=lines.append)))

        nursery.start_soon(run)
        with trio.fail_after(30):
            await until(lambda: [line for line in lines if line["event"] == "mcp.task"], timeout=30,
                        what="the task being polled")
            assert len(gw.requests) == 1
            assert _open_connections_to(gw.port) == 0
            assert launch.tasks_state(task_peer.url)["tasks"]  # still working: the run waits on it
            await trio.to_thread.run_sync(launch.finish_tasks, task_peer.url)
            await until(lambda: done, timeout=30, what="the run's end")
    (result,) = done
    assert (result.status.value, result.result) == ("completed", "researched")
    assert len(gw.requests) == 2
    assert _tool_contents(gw.requests[1].messages) == ["researched tides"]


async def test_root_run_spawns_a_subagent_through_the_control_seam(peer: launch.PeerProcess) -> None:
    child_rule = ({"last_role": "user", "last_contains": "child task"}, text('{"child": "done"}'))
    script = [tool_call("subagent_spawn", {"instruction": "child task", "output_contract": "a JSON object"}),
              text("root done")]
    async with scripted_gateway(script, rules=[child_rule]) as gw:
        result, lines = await _main(_cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}"))
        assert (result.status.value, result.result) == ("completed", "root done")
        assert any(line["event"] == "subagent.spawn" for line in lines)
        assert "subagent_spawn" in gw.requests[0].tool_names
        spawned = [r for r in gw.requests if r.messages[-1].get("content") == "child task"]
        assert spawned, "the child never asked the gateway"
        observation = _tool_contents(gw.requests[-1].messages)[-1]
        assert '"child": "done"' in observation or '"child":"done"' in observation
        assert result.usage.total_tokens == 30  # the root's own usage; the child's is reported to the tree


async def test_cancelled_from_outside_logs_run_cancelled(peer: launch.PeerProcess) -> None:
    lines: list[dict[str, Any]] = []
    async with scripted_gateway([tool_call("sdk__slow", {"seconds": 30})]) as gw:
        with trio.move_on_after(2) as scope:
            await agentd.main(_cfg("--intelligence", gw.url, "--mcp", f"sdk={peer.url}"), log=EventLog(sink=lines.append))
    assert scope.cancelled_caught
    assert [line["event"] for line in lines if line["event"].startswith("run.")] == ["run.start", "run.cancelled"]


async def test_secrets_never_reach_events_and_log_content_shows_bodies(peer: launch.PeerProcess) -> None:
    secret = "sk-very-secret-token-123"
    async with scripted_gateway([tool_call("sdk__echo", {"text": f"leak {secret}?"}), text(f"done {secret}")]) as gw:
        cfg = agentd.load_config(["--instruction", "go", "--intelligence", gw.url, "--mcp", f"sdk={peer.url}",
                                       "--intelligence-token", "{{secret:GW_TOKEN}}", "--log-content"],
                                      env={"GW_TOKEN": secret})
        lines: list[dict[str, Any]] = []
        with trio.fail_after(30):
            result = await agentd.main(cfg, log=EventLog(sink=lines.append, log_content=True),
                                       env={"GW_TOKEN": secret})
        assert result.status is agentd.RunStatus.COMPLETED
        assert gw.requests[0].headers.get("authorization") == f"Bearer {secret}"
        dumped = json.dumps(lines)
        assert secret not in dumped and "***" in dumped
        tool_results = [line for line in lines if line["event"] == "tool.result"]
        assert tool_results[0]["content"] == "leak ***?"  # bodies as text with --log-content, still scrubbed


async def test_library_config_errors_raise_before_side_effects() -> None:
    from agentd.errors import ConfigError

    lines: list[dict[str, Any]] = []
    with pytest.raises(ConfigError, match="instruction"):
        await agentd.main(agentd.Config(intelligence=IntelligenceConfig(endpoints=("test",))), log=EventLog(sink=lines.append))
    with pytest.raises(ConfigError):
        await agentd.main(agentd.Config(instruction="x", intelligence=IntelligenceConfig(endpoints=("ftp://nowhere",))),
                          log=EventLog(sink=lines.append))
    assert not any(line["event"] == "mcp.connect" for line in lines)
