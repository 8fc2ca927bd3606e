"""End to end: the reactive daemon against the official Python SDK server (legacy and 2026 eras) and the
scripted gateway, over real loopback sockets. Each wake's first model request is checked for the
instruction, the URI and the content read after the update."""

import json

import pytest
import trio

from agentd.errors import ExitCode
from tests.modes.live import config, live_daemon
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text, tool_call
from tests.waiting import until

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
            await trio.sleep(0.3)  # real time: quiet, for a wrong second wake of the real daemon to show
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
            await trio.sleep(0.5)  # real time: quiet, for any wake of the real daemon still due to show
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
            await trio.sleep(0.3)  # real time: quiet, for a wrong extra wake of the real daemon to show
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
                await daemon.events.wait_for("mcp.disconnected", server="srv")
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


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_self_subscribe_is_applied_after_the_run_and_then_wakes_the_agent(era: str) -> None:
    other = "test://other"
    rules = [({"last_role": "user", "contains": f"resource {COUNTER}"}, tool_call("subscribe", {"uri": other}))]
    argv = launch.sdk_server_argv() if era == "legacy" else launch.modern_server_argv()
    async with scripted_gateway(rules=rules, default=text("noted")) as gw, launch.peer_server(argv) as peer:
        async with live_daemon(config(gw.url, {"srv": peer.url}, subscribe=(COUNTER,))) as daemon:
            await launch.abump(peer.url)
            await daemon.events.wait_for("mcp.subscribe", origin="self", applied=True)
            await launch.abump(peer.url, other)
            await daemon.events.wait_for("run.end", trigger="wake", uri=other)
            await daemon.stop()
    prompts = wake_prompts(gw)
    assert len(prompts) == 2 and other in prompts[1] and contents_of(prompts[1]) == "1"
    offered = gw.requests[0].tool_names
    assert {"subscribe", "unsubscribe", "schedule", "await_resource"} <= set(offered)
    assert any(name.startswith("subagent") for name in offered)  # a wake is an ordinary run: subagents too
    assert any(name.startswith("srv__") for name in offered) and any("resource" in n for n in offered)


async def test_await_resource_returns_the_update_that_satisfies_the_condition() -> None:
    other = "test://other"
    wait = {"uri": other, "timeout_s": 20, "condition": {"pointer": "", "op": "gt", "value": 1}}
    rules = [({"last_role": "user"}, tool_call("await_resource", wait))]
    async with scripted_gateway(rules=rules, default=text("noted")) as gw, \
            launch.peer_server(launch.sdk_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"srv": peer.url}, subscribe=(COUNTER,))) as daemon:
            await launch.abump(peer.url)  # the wake awaits other > 1 (other does not exist yet)
            await daemon.events.wait_for("trigger.armed", count=2)  # subscribed for the await
            await launch.abump(peer.url, other)  # 1: not yet
            await launch.abump(peer.url, other)  # 2: satisfied
            await daemon.events.wait_for("run.end", trigger="wake")
            await daemon.stop()
        tool_results = [m["content"] for r in gw.requests for m in r.messages if m["role"] == "tool"]
    assert tool_results and "matched after" in tool_results[-1] and tool_results[-1].endswith("\n2")


async def test_await_resource_times_out_as_an_observation() -> None:
    rules = [({"last_role": "user"}, tool_call("await_resource", {"uri": "test://other", "timeout_s": 0.3}))]
    async with scripted_gateway(rules=rules, default=text("noted")) as gw, \
            launch.peer_server(launch.sdk_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"srv": peer.url}, subscribe=(COUNTER,))) as daemon:
            await launch.abump(peer.url)
            await daemon.events.wait_for("run.end", trigger="wake")
            await daemon.stop()
    [observation] = [m["content"] for m in gw.requests[-1].messages if m["role"] == "tool"]
    assert "no matching update of test://other within 0.3 s" in observation
    assert [c for c in daemon.events.named("mcp.subscribe") if c.get("uri") == "test://other"]


async def test_poll_degradation_when_the_server_cannot_subscribe() -> None:
    import sys
    from pathlib import Path

    argv = [sys.executable, str(Path(__file__).with_name("nosub_server.py"))]
    polled = "test://polled"
    async with scripted_gateway(default=text("noted")) as gw, launch.peer_server(argv) as peer:
        cfg = config(gw.url, {"nosub": peer.url}, subscribe=(polled,), poll_interval=0.1)
        async with live_daemon(cfg) as daemon:
            await daemon.events.wait_for("reactive.degraded")
            await trio.sleep(0.3)  # real time: a few polls (0.1 s apart) of an unchanged resource: no wake
            assert not gw.requests
            await trio.to_thread.run_sync(lambda: launch._side_door(peer.url, "/_test/bump", uri=polled))
            await daemon.events.wait_for("run.end", trigger="wake")
            await daemon.stop()
        no_polling = config(gw.url, {"nosub": peer.url}, subscribe=(polled,))
        from agentd.errors import ConfigError

        async with live_daemon(no_polling) as failing:
            await failing.done.wait()
        assert isinstance(failing.error, ConfigError) and "poll-interval" in str(failing.error)
        assert failing.error.exit_code is ExitCode.USAGE
    assert contents_of(wake_prompts(gw)[0]) == "1"
    assert daemon.events.named("reactive.degraded")[0]["level"] == "warn"


async def test_drain_during_a_wake_finishes_it_unsubscribes_and_exits_0() -> None:
    draining = trio.Event()  # the wake's model call answers once the drain has begun: in flight when it does
    async with scripted_gateway(default={**text("done"), "wait": draining}) as gw, \
            launch.peer_server(launch.sdk_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"srv": peer.url}, subscribe=(COUNTER,), drain_timeout=10)) as daemon:
            await launch.abump(peer.url)
            await until(lambda: gw.requests, timeout=10, what="the wake's model call")
            daemon.drain.set()
            await launch.abump(peer.url)  # during the drain: not taken
            await daemon.events.wait_for("drain.start")
            draining.set()
            result = await daemon.stop()
        stats = launch.stats(peer.url)
    assert result.exit_code is ExitCode.OK
    assert [e["status"] for e in daemon.wake_ends()] == ["completed"]
    assert len(gw.requests) == 1
    assert daemon.events.named("drain.end")[0]["outcome"] == "drained"
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


async def test_self_subscriptions_are_listed_in_agent_status_of_a_serving_worker() -> None:
    """The spec's reusable worker: reactive mode with --serve-mcp, through agentd.main and the drain latch."""
    import agentd
    from agentd.client import open_mcp_pool
    from agentd.config.model import McpServerConfig
    from agentd.oversight.drain import DrainLatch, use_drain
    from agentd.telemetry.events import EventLog, null_log
    from tests.modes.live import Events

    other = "test://other"
    rules = [({"last_role": "user", "contains": f"resource {COUNTER}"}, tool_call("subscribe", {"uri": other}))]
    served = f"http://127.0.0.1:{launch.free_port()}/mcp"
    async with scripted_gateway(rules=rules, default=text("noted")) as gw, \
            launch.peer_server(launch.sdk_server_argv()) as peer:
        cfg = config(gw.url, {"srv": peer.url}, subscribe=(COUNTER,), serve_mcp=served, run_id="worker-1")
        events = Events()
        latch = DrainLatch()
        result = None
        with trio.fail_after(60), use_drain(latch):
            async with trio.open_nursery() as nursery:
                async def run() -> None:
                    nonlocal result
                    result = await agentd.main(cfg, log=EventLog(sink=events.sink, level="debug"))

                nursery.start_soon(run)
                await events.wait_for("trigger.armed")
                await events.wait_for("serve.start")
                await launch.abump(peer.url)
                await events.wait_for("mcp.subscribe", origin="self", applied=True)
                async with open_mcp_pool([McpServerConfig("self", served)], log=null_log()) as pool:
                    read = await pool.read_resource("agent://status", "self")
                status = json.loads(read.contents[0]["text"])
                latch.request("test")
    assert result is not None and result.exit_code is ExitCode.OK
    assert status["run_id"] == "worker-1" and status["mode"] == "reactive"
    subscriptions = {s["uri"]: s["origins"] for s in status["reactive"]["subscriptions"]}
    assert subscriptions == {COUNTER: ["config"], other: ["self"]}


async def test_loop_mode_runs_ordinary_runs_through_the_real_loop() -> None:
    async with scripted_gateway(default=text("looped")) as gw, launch.peer_server(launch.sdk_server_argv()) as peer:
        cfg = config(gw.url, {"srv": peer.url}, mode="loop", interval=0.05, debounce=0.25)
        async with live_daemon(cfg, armed=0) as daemon:
            await daemon.events.wait_for("run.end", count=3, trigger="loop")
            result = await daemon.stop()
    runs = daemon.events.named("run.end", trigger="loop")
    assert [e["status"] for e in runs][:3] == ["completed"] * 3
    assert len({e["run_id"] for e in runs}) == len(runs)  # each fire has its own run id
    assert result.exit_code is ExitCode.OK and result.result["mode"] == "loop"
    assert all(r.messages[-1]["content"] == "Keep the counter report up to date" for r in gw.requests)


@pytest.mark.parametrize("uri", ["test://racy-silent", "test://racy-notify"])
async def test_a_change_while_the_subscribe_is_in_flight_is_not_lost(uri: str) -> None:
    """The real SDK server changes the resource while ``resources/subscribe`` is in flight: before it
    registers the subscription (nobody is told: the read-after-subscribe comparison finds it), or after,
    with an ``updated`` that beats the answer (the watch is already registered). Either way: one wake, on
    the new content, and no update was ever sent by a bump."""
    async with scripted_gateway(default=text("noted")) as gw, launch.peer_server(launch.sdk_server_argv()) as peer:
        async with live_daemon(config(gw.url, {"srv": peer.url}, subscribe=(f"srv:{uri}",))) as daemon:
            await daemon.events.wait_for("run.end", trigger="wake", uri=uri, timeout=20)
            await trio.sleep(0.3)  # real time: quiet, for a wrong second wake of the real daemon to show
            await daemon.stop()
    prompts = wake_prompts(gw)
    assert len(prompts) >= 1 and contents_of(prompts[-1]) == "1", prompts
