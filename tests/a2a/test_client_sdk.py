"""agentd as an A2A client against the official ``a2a-sdk`` 1.3.0 server (asyncio, uvicorn, its own process).

Card fetch, send, stream, cancel, an unknown task, a failing task; a run delegating through ``a2a.delegate``;
a required peer that is down or has a broken card is exit 6 before the run starts, an optional one is
omitted with an event.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import trio

import agentd
from agentd.a2a.client import open_a2a_peers
from agentd.a2a.types import render_outcome
from agentd.agent.a2a import register_a2a_tools
from agentd.agent.control import ControlContext, ControlToolRegistry
from agentd.config.model import McpServerConfig
from agentd.errors import A2aConnectError, A2aRpcError
from agentd.telemetry.events import EventLog
from tests.client.helpers import Events
from tests.peers import launch
from tests.peers.gateway import closed_port, scripted_gateway, text, tool_call

pytest.importorskip("a2a", reason="a2a-sdk (the test extra) is not installed")


def peer_argv(*extra: str) -> list[str]:
    return [sys.executable, "-m", "tests.a2a.sdk_peer", *extra]


@pytest.fixture(scope="module")
def sdk_peer() -> Iterator[launch.PeerProcess]:
    with launch.start_peer(peer_argv(), cwd=launch.REPO_ROOT) as peer:
        yield peer


def _peer(url: str, name: str = "echo", **options: Any) -> McpServerConfig:
    return McpServerConfig(name, url, **options)


async def test_card_send_stream_data_and_failure(sdk_peer: launch.PeerProcess) -> None:
    events = Events()
    with trio.fail_after(30):
        async with open_a2a_peers([_peer(sdk_peer.url)], log=events.log) as peers:
            peer = peers.peer("echo")
            assert (peer.card.name, peer.card.version, peer.card.streaming) == ("sdk echo", "1.0", True)
            assert [s.id for s in peer.card.skills] == ["echo"]
            # streamed (the card says it can): ends completed with the text artifact
            result = await peers.delegate("echo", "hello there", context_id=None)
            assert result.state == "completed"  # type: ignore[union-attr]
            assert "echo: hello there" in result.artifacts[0].parts[0].text  # type: ignore[union-attr]
            # the same context id continues the conversation
            again = await peers.delegate("echo", "second", context_id=result.context_id)
            assert again.context_id == result.context_id
            # data parts as JSON, files by reference
            data = await peers.delegate("echo", "data please", context_id=None)
            rendered = render_outcome(data)
            assert '{"echo": "data please"}' in rendered
            assert "[file report.pdf (application/pdf) at https://files.example/report.pdf; not fetched]" in rendered
            # a failing task is an outcome, not an exception
            failed = await peers.delegate("echo", "fail now", context_id=None)
            assert failed.state == "failed"  # type: ignore[union-attr]
            assert "asked to fail" in render_outcome(failed)
            rejected = await peers.delegate("echo", "reject this", context_id=None)
            assert rejected.state == "rejected"  # type: ignore[union-attr]
            # non-streaming path (SendMessage returnImmediately + GetTask polling)
            peer.card = attrs.evolve(peer.card, streaming=False)
            polled = await peers.delegate("echo", "polled", context_id=None)
            assert polled.state == "completed" and "echo: polled" in render_outcome(polled)
    names = [line["event"] for line in events.lines]
    assert names[0] == "a2a.card" and "a2a.skill_description" in names
    assert [e["state"] for e in events.named("a2a.task_end")] == [
        "completed", "completed", "completed", "failed", "rejected", "completed"
    ]


async def test_async_status_cancel_and_unknown_task(sdk_peer: launch.PeerProcess) -> None:
    events = Events()
    with trio.fail_after(30):
        async with open_a2a_peers([_peer(sdk_peer.url)], log=events.log) as peers:
            started = await peers.start("echo", "slow job", context_id=None)
            assert started.state in ("submitted", "working")  # type: ignore[union-attr]
            status = await peers.status("echo", started.id)  # type: ignore[union-attr]
            assert status.state in ("submitted", "working")
            cancelled = await peers.cancel("echo", started.id, reason="test")  # type: ignore[union-attr]
            assert cancelled.state == "canceled"
            with pytest.raises(A2aRpcError) as info:
                await peers.status("echo", "no-such-task")
            assert info.value.code == -32001


async def test_abandoned_delegation_is_cancelled_on_the_peer(sdk_peer: launch.PeerProcess) -> None:
    events = Events()
    with trio.fail_after(30):
        async with open_a2a_peers([_peer(sdk_peer.url)], log=events.log) as peers:
            with trio.move_on_after(1.0):  # the run's deadline, say
                await peers.delegate("echo", "slow and abandoned", context_id=None)
            [cancel] = events.named("a2a.cancel")
            task = await peers.status("echo", cancel["task_id"])
            assert task.state == "canceled"
            # an async task left open when the block ends is cancelled too
            left = await peers.start("echo", "slow and left", context_id=None)
        assert [e["task_id"] for e in events.named("a2a.cancel")][-1] == left.id  # type: ignore[union-attr]
        async with open_a2a_peers([_peer(sdk_peer.url)], log=events.log) as peers:
            assert (await peers.status("echo", left.id)).state == "canceled"  # type: ignore[union-attr]


async def test_control_tools(sdk_peer: launch.PeerProcess) -> None:
    events = Events()
    with trio.fail_after(30):
        async with open_a2a_peers([_peer(sdk_peer.url)], log=events.log) as peers:
            registry = ControlToolRegistry()
            register_a2a_tools(registry, peers)
            assert [t.name for t in registry] == ["a2a.delegate", "a2a.status", "a2a.cancel"]
            delegate = registry.get("a2a.delegate")
            assert delegate is not None and "Repeats the message back." in delegate.description
            ctx = ControlContext("r", events.log, 1)
            ok = await delegate.handler({"peer": "echo", "message": "hi"}, ctx)
            assert not ok.is_error and "echo: hi" in ok.content[0]["text"]
            bad = await delegate.handler({"peer": "echo", "message": "fail"}, ctx)
            assert bad.is_error and "failed" in bad.content[0]["text"]
            status = registry.get("a2a.status")
            assert status is not None
            unknown = await status.handler({"peer": "echo", "task_id": "nope"}, ctx)
            assert unknown.is_error and "no such task" in unknown.content[0]["text"]


async def test_required_peer_down_or_broken_is_connect_error(free_port: int) -> None:
    events = Events()
    with trio.fail_after(30):
        with pytest.raises(A2aConnectError) as info:
            async with open_a2a_peers([_peer(f"http://127.0.0.1:{closed_port()}")], log=events.log):
                pytest.fail("must not be entered")
        assert info.value.exit_code == 6
        with launch.start_peer(peer_argv("--broken-card"), cwd=launch.REPO_ROOT) as broken:
            with pytest.raises(A2aConnectError, match="invalid agent card"):
                async with open_a2a_peers([_peer(broken.url)], log=events.log):
                    pytest.fail("must not be entered")
            # optional: omitted with an event, the block runs without it
            async with open_a2a_peers([_peer(broken.url, required=False)], log=events.log) as peers:
                assert peers.peers == {} and "echo" in peers.failed
    assert [e["required"] for e in events.named("a2a.card_failed")] == [True, True, False]


async def test_bearer_header_is_sent(free_port: int) -> None:
    with launch.start_peer(peer_argv("--bearer", "s3cret-token"), cwd=launch.REPO_ROOT) as guarded:
        events = Events()
        peer = _peer(guarded.url, headers={"Authorization": "Bearer {{secret:TOKEN}}"})
        from agentd.security.secrets import SecretResolver

        resolver = SecretResolver(env={"TOKEN": "s3cret-token"}, redactor=events.log.redactor)
        with trio.fail_after(30):
            async with open_a2a_peers([peer], log=events.log, secrets=resolver) as peers:
                result = await peers.delegate("echo", "authorised", context_id=None)
                assert result.state == "completed"  # type: ignore[union-attr]
            async with open_a2a_peers([_peer(guarded.url)], log=events.log) as peers:
                with pytest.raises(Exception, match="HTTP 401"):
                    await peers.delegate("echo", "no auth", context_id=None)
        assert "s3cret-token" not in json.dumps(events.lines)


def _cfg(*args: str) -> agentd.Config:
    return agentd.load_config(["--instruction", "delegate the task", *args], env={})


async def test_run_delegates_and_reads_the_observation(sdk_peer: launch.PeerProcess) -> None:
    script = [tool_call("a2a_delegate", {"peer": "echo", "message": "from the run"}), text("done")]
    async with scripted_gateway(script) as gw:
        lines: list[dict[str, Any]] = []
        cfg = _cfg("--intelligence", gw.url, "--a2a-peer", f"echo={sdk_peer.url}", "--run-id", "a2a-1")
        with trio.fail_after(30):
            result = await agentd.main(cfg, log=EventLog(sink=lines.append))
        assert result.status.value == "completed" and result.result == "done"
        first, second = gw.requests
        assert "a2a_delegate" in first.tool_names
        [observation] = [m["content"] for m in second.messages if m["role"] == "tool"]
        assert "echo: from the run" in observation and "completed" in observation


async def test_run_with_required_peer_down_is_exit_6() -> None:
    cfg = _cfg("--intelligence", "test", "--a2a-peer", f"gone=http://127.0.0.1:{closed_port()}")
    lines: list[dict[str, Any]] = []
    with trio.fail_after(30):
        result = await agentd.main(cfg, log=EventLog(sink=lines.append))
    assert int(result.exit_code) == 6 and result.status.value == "mcp_failed"
    assert not [line for line in lines if line["event"] in ("loop.start", "intel.call", "tool.call")]


async def test_a_peer_declaring_protocol_0_3_gets_the_0_3_methods() -> None:
    """The card declares 0.3: agentd speaks ``message/stream``/``tasks/get``/``tasks/cancel`` (SDK compat layer)."""
    with launch.start_peer(peer_argv("--protocol", "0.3"), cwd=launch.REPO_ROOT) as old:
        events = Events()
        with trio.fail_after(30):
            async with open_a2a_peers([_peer(old.url)], log=events.log) as peers:
                assert peers.peer("echo").card.version == "0.3"
                done = await peers.delegate("echo", "old protocol", context_id=None)
                assert done.state == "completed" and "echo: old protocol" in render_outcome(done)  # type: ignore[union-attr]
                failed = await peers.delegate("echo", "fail please", context_id=None)
                assert failed.state == "failed"  # type: ignore[union-attr]
                started = await peers.start("echo", "slow one", context_id=None)
                cancelled = await peers.cancel("echo", started.id, reason="test")  # type: ignore[union-attr]
                assert cancelled.state == "canceled"
                with pytest.raises(A2aRpcError) as info:
                    await peers.status("echo", "no-such-task")
                assert info.value.code == -32001


async def test_a_lost_stream_is_followed_again_with_subscribe_to_task(sdk_peer: launch.PeerProcess) -> None:
    """The SDK server's stream is cut after its first event; the task goes on there; agentd resubscribes."""
    events = Events()
    with trio.fail_after(30):
        async with open_a2a_peers([_peer(sdk_peer.url)], log=events.log) as peers:
            result = await peers.delegate("echo", "drop me halfway", context_id=None)
            assert result.state == "completed"  # type: ignore[union-attr]
            assert "echo: drop me halfway" in render_outcome(result)
    [again] = events.named("a2a.resubscribe")
    assert again["task_id"] == result.id and again["attempt"] == 1  # type: ignore[union-attr]
    assert not events.named("a2a.cancel")


async def test_the_authenticated_extended_card_replaces_the_public_one() -> None:
    with launch.start_peer(peer_argv("--extended", "--bearer", "ext-token"), cwd=launch.REPO_ROOT) as peer:
        events = Events()
        with trio.fail_after(30):
            good = _peer(peer.url, headers={"Authorization": "Bearer ext-token"})
            async with open_a2a_peers([good], log=events.log) as peers:
                card = peers.peer("echo").card
                assert card.name == "sdk echo (extended)" and [s.id for s in card.skills] == ["echo", "secret"]
                assert (await peers.delegate("echo", "hi", context_id=None)).state == "completed"  # type: ignore[union-attr]
            # the wrong credential: the public card (served to anyone) is used, with a warning
            async with open_a2a_peers([_peer(peer.url, headers={"Authorization": "Bearer wrong"})],
                                      log=events.log) as peers:  # fmt: skip
                assert peers.peer("echo").card.name == "sdk echo"
        assert [e["extended"] for e in events.named("a2a.card")] == [True, False]
        [failed] = events.named("a2a.extended_card_failed")
        assert "HTTP 401" in failed["error"] and "ext-token" not in json.dumps(events.lines)
