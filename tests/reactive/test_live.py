"""End to end: the reactive daemon against the official Python SDK server (legacy and 2026 eras) and the
scripted gateway, over real loopback sockets. Each wake's first model request is checked for the
instruction, the URI and the content read after the update."""

import json

import pytest
import trio

from agentd.errors import ExitCode
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text, tool_call
from tests.reactive.live import config, live_daemon

pytestmark = pytest.mark.interop

COUNTER = "test://counter"


def wake_prompts(gw) -> list[str]:  # type: ignore[no-untyped-def]
    prompts = []
    for request in gw.requests:
        users = [m for m in request.messages if m["role"] == "user"]
        if len(request.messages) and request.last_message.get("role") == "user" and users:
            prompts.append(str(users[-1]["content"]))
    return prompts


def contents_of(prompt: str) -> str:
    """The text between the first <resource ...> and </resource> of a wake prompt."""
    return prompt.split("<resource", 1)[1].split(">", 1)[1].split("</resource>", 1)[0].strip()


async def test_one_update_one_wake_with_the_new_content() -> None:
    async with scripted_gateway(default=text("noted")) as gw, launch.peer_server(launch.sdk_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"srv": peer.url}, subscribe=(COUNTER,))) as daemon:
            assert await launch.abump(peer.url) == 1
            await daemon.events.wait_for("run.end", trigger="wake")
            await trio.sleep(0.3)  # quiet period: nothing else may wake
            result = await daemon.stop()
        assert result.exit_code is ExitCode.OK
        [prompt] = wake_prompts(gw)
        assert prompt.startswith("Keep the counter report up to date")
        assert COUNTER in prompt and contents_of(prompt) == "1"
        assert len(daemon.wake_ends()) == 1
        stats = launch.stats(peer.url)
    assert "resources/unsubscribe" in json.dumps(stats)


async def test_burst_of_50_gives_few_wakes_and_the_last_reads_the_final_state() -> None:
    async with scripted_gateway(default=text("noted")) as gw, launch.peer_server(launch.sdk_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"srv": peer.url}, subscribe=(COUNTER,), debounce=0.25)) as daemon:
            async with trio.open_nursery() as bumps:
                for _ in range(50):
                    bumps.start_soon(launch.abump, peer.url)
            # Wait for the wake that read 50.
            with trio.fail_after(20):
                while not wake_prompts(gw) or contents_of(wake_prompts(gw)[-1]) != "50":
                    await daemon.events.wait_for("run.end", count=len(daemon.wake_ends()) + 1, trigger="wake")
            await trio.sleep(0.5)
            await daemon.stop()
        prompts = wake_prompts(gw)
    assert 1 <= len(prompts) <= 6, [contents_of(p) for p in prompts]
    assert contents_of(prompts[-1]) == "50"


async def test_two_uris_wake_independently() -> None:
    other = "test://other"
    async with scripted_gateway(default=text("noted")) as gw, launch.peer_server(launch.sdk_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"srv": peer.url}, subscribe=(COUNTER, f"srv:{other}")),
                               armed=2) as daemon:
            await launch.abump(peer.url, other)
            await daemon.events.wait_for("run.end", trigger="wake", uri=other)
            await launch.abump(peer.url, COUNTER)
            await launch.abump(peer.url, COUNTER)
            await daemon.events.wait_for("run.end", trigger="wake", uri=COUNTER)
            await trio.sleep(0.3)
            await daemon.stop()
    by_uri = {e["uri"] for e in daemon.wake_ends()}
    assert by_uri == {COUNTER, other}


async def test_server_restart_between_updates_wakes_with_post_restart_content() -> None:
    port = launch.free_port()
    argv = launch.sdk_server_argv(port=port)
    async with scripted_gateway(default=text("noted")) as gw:
        async with launch.peer_server(argv) as peer:
            url = peer.url
            cfg = config(gw.url, {"srv": url}, subscribe=(COUNTER,))
            async with live_daemon(cfg) as daemon:
                await launch.abump(url)
                await launch.abump(url)
                await daemon.events.wait_for("run.end", trigger="wake")
                # Kill the server; the counter state dies with it.
                await peer_stop(peer)
                await trio.sleep(0.2)
                async with launch.peer_server(argv) as again:
                    # The client reconnects, re-subscribes and synthesizes one update: the wake reads 0.
                    with trio.fail_after(30):
                        while not any(contents_of(p) == "0" for p in wake_prompts(gw)):
                            await daemon.events.wait_for("run.end", count=len(daemon.wake_ends()) + 1,
                                                         trigger="wake", timeout=30)
                    assert await launch.abump(again.url) == 1
                    with trio.fail_after(20):
                        while contents_of(wake_prompts(gw)[-1]) != "1" or len(wake_prompts(gw)) < 3:
                            await daemon.events.wait_for("run.end", count=len(daemon.wake_ends()) + 1,
                                                         trigger="wake")
                    result = await daemon.stop()
    assert result.exit_code is ExitCode.OK
    assert [contents_of(p) for p in wake_prompts(gw)][-2:] == ["0", "1"]


async def peer_stop(peer) -> None:  # type: ignore[no-untyped-def]
    import signal

    peer.proc.send_signal(signal.SIGKILL)
    with trio.fail_after(10):
        await peer.proc.wait()


async def test_modern_listen_server() -> None:
    async with scripted_gateway(default=text("noted")) as gw, launch.peer_server(launch.modern_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"modern": peer.url}, subscribe=(COUNTER,))) as daemon:
            assert await launch.abump(peer.url) == 1
            await daemon.events.wait_for("run.end", trigger="wake")
            await daemon.stop()
    [prompt] = wake_prompts(gw)
    assert contents_of(prompt) == "1"
    assert daemon.events.named("mcp.era") == [] or any(e.get("era") == "modern" for e in daemon.events.named("mcp.era"))


async def test_self_subscribe_is_applied_after_the_run_and_then_wakes_the_agent() -> None:
    other = "test://other"
    rules = [({"last_role": "user", "contains": f"resource {COUNTER}"}, tool_call("subscribe", {"uri": other}))]
    async with scripted_gateway(rules=rules, default=text("noted")) as gw, \
            launch.peer_server(launch.sdk_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"srv": peer.url}, subscribe=(COUNTER,))) as daemon:
            await launch.abump(peer.url)
            await daemon.events.wait_for("mcp.subscribe", origin="self", applied=True)
            await launch.abump(peer.url, other)
            await daemon.events.wait_for("run.end", trigger="wake", uri=other)
            await daemon.stop()
    prompts = wake_prompts(gw)
    assert len(prompts) == 2 and other in prompts[1] and contents_of(prompts[1]) == "1"
    assert "subscribe" in gw.requests[0].tool_names and "await_resource" in gw.requests[0].tool_names


async def test_await_resource_with_an_update_and_with_a_timeout() -> None:
    other = "test://other"
    wait = {"uri": other, "timeout_s": 20, "condition": {"pointer": "", "op": "gt", "value": 1}}
    rules = [
        ({"last_role": "user", "contains": "counter is 1"}, tool_call("await_resource", wait)),
        ({"last_role": "user", "contains": "counter is 2"},
         tool_call("await_resource", {"uri": other, "timeout_s": 0.3})),
    ]
    async with scripted_gateway(rules=rules, default=text("noted")) as gw, \
            launch.peer_server(launch.sdk_server_argv()) as peer:
        cfg = config(gw.url, {"srv": peer.url}, subscribe=(COUNTER,), instruction="When the counter is 1, act")
        async with live_daemon(cfg) as daemon:
            await launch.abump(peer.url)  # wake 1 awaits other > 1
            with trio.fail_after(10):
                while len(gw.requests) < 1:
                    await trio.sleep(0.01)
            await trio.sleep(0.3)  # the subscription for the await is in place
            await launch.abump(peer.url, other)  # 1: not yet
            await launch.abump(peer.url, other)  # 2: satisfied
            await daemon.events.wait_for("run.end", trigger="wake")
            daemon.events.lines.clear()
        tool_results = [m["content"] for r in gw.requests for m in r.messages if m["role"] == "tool"]
    assert any("matched after" in t and "\n2" in t for t in tool_results), tool_results


async def test_drain_during_a_wake_finishes_it_unsubscribes_and_exits_0() -> None:
    async with scripted_gateway(default=text("done", delay=1.0)) as gw, \
            launch.peer_server(launch.sdk_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"srv": peer.url}, subscribe=(COUNTER,), drain_timeout=10)) as daemon:
            await launch.abump(peer.url)
            with trio.fail_after(10):
                while not gw.requests:
                    await trio.sleep(0.01)
            daemon.drain.set()
            await launch.abump(peer.url)  # during the drain: not taken
            result = await daemon.stop()
        stats = launch.stats(peer.url)
    assert result.exit_code is ExitCode.OK
    assert [e["status"] for e in daemon.wake_ends()] == ["completed"]
    assert len(gw.requests) == 1
    assert daemon.events.named("drain.end")[0]["timed_out"] is False
    assert "resources/unsubscribe" in json.dumps(stats)


async def test_continue_feeds_one_warm_session_in_order() -> None:
    async with scripted_gateway(default=text("handled")) as gw, launch.peer_server(launch.sdk_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"srv": peer.url}, continue_uris=(COUNTER,))) as daemon:
            for n in range(1, 4):
                await launch.abump(peer.url)
                await daemon.events.wait_for("run.end", count=n, trigger="continue")
            await daemon.stop()
    assert len(gw.requests) == 3
    turns = [[m for m in r.messages if m["role"] in ("user", "assistant")] for r in gw.requests]
    assert [len(t) for t in turns] == [1, 3, 5]  # each turn carries the conversation so far
    assert [contents_of(str(t[-1]["content"])) for t in turns] == ["1", "2", "3"]
