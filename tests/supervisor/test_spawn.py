"""Real child processes: sync, async and warm spawns, status, await, send, cancel."""

from __future__ import annotations

import json

import trio

from agentd.config.model import IntelligenceConfig, SubagentsConfig
from agentd.supervisor.caps import Refusal
from agentd.supervisor.supervisor import Caller, Origin
from tests.supervisor.conftest import ROOT, req


async def test_sync_spawn_returns_the_distilled_result(root, events):
    with trio.fail_after(20):
        async with root() as sup:
            view = await sup.spawn(ROOT, req(["usage", 10, 5], ["echo"], output_contract="json"))
    assert view.done and view.status == "completed" and view.partial is False
    assert view.handle == "0.1"
    assert view.result["handle"] == "0.1" and view.result["depth"] == 1
    assert view.result["tool_scope"] == ["fs", "web"]
    assert set(view.structured()) == {"handle", "status", "done", "partial", "result", "usage"}
    assert events.named("subagent.exit", handle="0.1")[0]["usage_tokens"] == 15
    assert events.named("subagent.exit", handle="0.1")[0]["rung"] == "exited"


async def test_async_spawn_returns_a_handle_at_once_then_status_and_await(root):
    with trio.fail_after(20):
        async with root() as sup:
            view = await sup.spawn(ROOT, req(["sleep", 0.5], ["result", {"n": 1}], async_=True))
            assert view.handle == "0.1" and view.done is False and view.status in ("starting", "running")
            assert sup.status(ROOT, "0.1").done is False
            done = await sup.await_(ROOT, "0.1")
            assert (done.status, done.done, done.result) == ("completed", True, {"n": 1})
            assert sup.status(ROOT, "0.1") == done


async def test_await_reports_still_running_after_its_bound(root):
    with trio.fail_after(20):
        async with root() as sup:
            await sup.spawn(ROOT, req(["hang"], async_=True))
            view = await sup.await_(ROOT, "0.1", timeout=0.5)
            assert view.done is False and view.status == "running"
            await sup.wait_ready("0.1")
            view = await sup.await_(ROOT, "0.1", timeout=0.5)
            assert view.done is False and view.status == "running"


async def test_warm_session_answers_each_message_until_cancelled(root):
    with trio.fail_after(20):
        async with root() as sup:
            first = await sup.spawn(ROOT, req(["echo"], warm=True))
            assert first.status == "awaiting_turn" and first.done is False
            assert first.result["handle"] == "0.1"
            second = await sup.send(ROOT, "0.1", "and now this")
            assert second.status == "awaiting_turn" and second.result["message"] == "and now this"
            third = await sup.send(ROOT, "0.1", "once more")
            assert third.result["message"] == "once more"
            ended = await sup.cancel(ROOT, "0.1", "enough")
            assert (ended.status, ended.done, ended.partial) == ("cancelled", True, False)
            assert isinstance(await sup.send(ROOT, "0.1", "too late"), Refusal)


async def test_send_to_a_busy_or_cold_session_is_refused(root):
    with trio.fail_after(20):
        async with root() as sup:
            await sup.spawn(ROOT, req(["hang"], async_=True))
            await sup.wait_ready("0.1")
            refused = await sup.send(ROOT, "0.1", "hello")
            assert isinstance(refused, Refusal) and "not awaiting a message" in refused.message


async def test_handles_are_scoped_to_the_callers_subtree(root):
    with trio.fail_after(20):
        async with root() as sup:
            await sup.spawn(ROOT, req(["hang"], async_=True))
            assert isinstance(sup.status(ROOT, "0.9"), Refusal)
            assert isinstance(sup.status(Caller(Origin.STDIO, "0.2"), "0.1"), Refusal)
            assert isinstance(sup.status(Caller(Origin.MANAGEMENT), "0.1"), Refusal)


async def test_a_caller_kept_to_its_own_tree_sees_only_the_children_spawned_in_it(root):
    """The runs of cluster work items share the member's handles: one item's run never reaches another's child."""
    with trio.fail_after(20):
        async with root() as sup:
            item_a = Caller(Origin.STDIO, "0", tree="job-a", own_tree_only=True)
            item_b = Caller(Origin.STDIO, "0", tree="job-b", own_tree_only=True)
            view = await sup.spawn(item_a, req(["hang"], async_=True))
            assert not isinstance(view, Refusal) and view.handle == "0.1"
            assert sup.status(item_a, "0.1").status == "running"
            for other in (item_b, Caller(Origin.STDIO, "0", tree="job-a/x", own_tree_only=True)):
                assert isinstance(sup.status(other, "0.1"), Refusal)
                assert isinstance(await sup.cancel(other, "0.1"), Refusal)
            assert not isinstance(sup.status(Caller(Origin.STDIO, "0", tree="job-b"), "0.1"), Refusal)  # a wake's


async def test_served_spawns_get_served_handles(root):
    with trio.fail_after(20):
        async with root() as sup:
            served = Caller(Origin.MANAGEMENT)
            view = await sup.spawn(served, req(["echo"]))
            assert view.handle == "served.1" and view.status == "completed"
            assert sup.status(served, "served.1").done
            assert isinstance(sup.status(ROOT, "served.1"), Refusal)


async def test_cancel_ends_a_running_subagent_at_the_first_rung(root, events):
    with trio.fail_after(20):
        async with root() as sup:
            await sup.spawn(ROOT, req(["usage", 3, 4], ["hang"], async_=True))
            await sup.wait_ready("0.1")
            await sup.wait_until(lambda s: s.node("0.1").usage_tokens == 7)  # past its usage step
            view = await sup.cancel(ROOT, "0.1", "changed my mind")
    assert (view.status, view.done, view.partial) == ("cancelled", True, True)
    assert view.result == {"cancelled": "changed my mind"}
    assert events.named("subagent.exit", handle="0.1")[0]["rung"] == "cancel"
    assert events.named("subagent.cancel", handle="0.1")[0]["reason"] == "changed my mind"


async def test_sync_spawn_is_cancelled_with_its_caller(root, events):
    with trio.fail_after(20):
        async with root() as sup:
            with trio.move_on_after(1.0):
                await sup.spawn(ROOT, req(["hang"]))
            assert sup.status(ROOT, "0.1").status == "cancelled"
    assert events.named("subagent.exit", handle="0.1")[0]["rung"] == "cancel"


async def test_closing_the_supervisor_cancels_async_and_warm_children(root):
    with trio.fail_after(20):
        async with root() as sup:
            await sup.spawn(ROOT, req(["hang"], async_=True))
            await sup.spawn(ROOT, req(["echo"], warm=True))
        assert sup.status(ROOT, "0.1").status == "cancelled"
        assert sup.status(ROOT, "0.2").status == "cancelled"


async def test_secrets_travel_in_the_payload_never_argv_or_env(root, tmp_path):
    secret = "s3cr3t-value-never-logged"
    with trio.fail_after(20):
        async with root() as sup:
            sup.secrets = {"TOKEN": secret, "OTHER": "unrelated-secret-value"}
            sup.child_config = {"mcp_servers": [
                {"name": "fs", "url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer {{secret:TOKEN}}"}},
                {"name": "web", "url": "http://127.0.0.1:2/mcp", "headers": {"X": "{{secret:OTHER}}"}},
            ]}
            node_view = await sup.spawn(ROOT, req(["hang"], async_=True, tool_scope=("fs",)))
            pid = (await sup.wait_ready(node_view.handle)).pid
            # The payload holds secrets, so it is deliberately not part of statistics(): read it directly.
            payload = sup._nodes[node_view.handle].payload
            assert payload.secrets == {"TOKEN": secret}
            assert [s["name"] for s in payload.config["mcp_servers"]] == ["fs"]
            for name in ("environ", "cmdline"):
                blob = (trio.Path(f"/proc/{pid}") / name)
                data = await blob.read_bytes()
                assert secret.encode() not in data and b"unrelated-secret" not in data
            env = dict(kv.split(b"=", 1) for kv in (await (trio.Path(f"/proc/{pid}") / "environ").read_bytes()).split(b"\0") if b"=" in kv)
            assert env[b"AGENT_SUBAGENT"] == b"1"


async def test_a_secret_in_a_childs_failure_is_scrubbed(root, events):
    secret = "tok-0123456789-secret"
    with trio.fail_after(20):
        async with root() as sup:
            sup.secrets = {"TOKEN": secret}
            sup.child_config = {"mcp_servers": [
                {"name": "fs", "url": "http://127.0.0.1:1/mcp", "headers": {"A": "Bearer {{secret:TOKEN}}"}}]}
            view = await sup.spawn(ROOT, req(["fail", f"server said {secret}"]))
    assert view.result == {"error": "subagent failed: RuntimeError: server said ***"}
    assert secret not in repr(list(events))


async def test_only_the_newest_ended_views_are_kept(root, monkeypatch):
    import agentd.supervisor.supervisor as module

    monkeypatch.setattr(module, "ENDED_KEPT", 2)
    with trio.fail_after(30):
        async with root() as sup:
            for _ in range(3):
                await sup.spawn(ROOT, req(["result", 1]))
            assert isinstance(sup.status(ROOT, "0.1"), Refusal)
            assert sup.status(ROOT, "0.2").done and sup.status(ROOT, "0.3").done


async def test_a_spaced_secret_reference_reaches_the_child_and_nothing_beyond_its_scope(events, no_leftover_children):
    # The parent resolves `{{ secret:TOK }}` (spaces allowed); its child must receive TOK for the same header,
    # and neither the out-of-scope server's secret nor an unreferenced variable.
    from agentd.config.model import Config, McpServerConfig
    from agentd.security.secrets import SecretResolver
    from agentd.supervisor.wiring import open_root_supervisor
    from agentd.telemetry.events import EventLog
    from tests.supervisor.conftest import _from_instruction

    env = {"TOK": "tok-value-in-scope-0123", "OTHER": "other-value-out-of-scope", "UNUSED": "unused-value-987"}
    header = "Bearer {{ secret:TOK }}"
    assert SecretResolver(env).resolve(header) == f"Bearer {env['TOK']}"  # what the parent itself sends
    cfg = Config(instruction="root", intelligence=IntelligenceConfig(endpoints=("http://127.0.0.1:9/v1",)), mcp=(
        McpServerConfig("fs", "http://127.0.0.1:1/mcp", headers={"Authorization": header}),
        McpServerConfig("web", "http://127.0.0.1:2/mcp", headers={"X-Key": "{{secret:OTHER}}"}),
    ))
    with trio.fail_after(30):
        async with open_root_supervisor(cfg, log=EventLog(sink=events.append), env=env, fork_server=False,
                                        test_script=_from_instruction) as sup:
            first = await sup.spawn(ROOT, req(["echo"], warm=True, tool_scope=("fs",)))
            pid = sup.statistics().node(first.handle).pid
            proc = trio.Path(f"/proc/{pid}")
            environ, cmdline = await (proc / "environ").read_bytes(), await (proc / "cmdline").read_bytes()
            await sup.cancel(ROOT, first.handle, "done")
    assert first.result["tool_scope"] == ["fs"]
    assert first.result["secret_names"] == ["TOK"]
    for value in env.values():
        assert value.encode() not in environ and value.encode() not in cmdline
    child_env = dict(kv.split(b"=", 1) for kv in environ.split(b"\0") if b"=" in kv)
    assert not {b"TOK", b"OTHER", b"UNUSED"} & set(child_env)


async def test_nested_children_receive_only_their_own_scopes_secrets(events, no_leftover_children):
    # Three servers, three secrets. The child is scoped to fs and web, its own child to fs alone: each level's
    # payload carries exactly the secrets its scope references, and no level has any secret value in its
    # environment or argv (they travel in the control-channel payload only).
    from agentd.config.model import Config, McpServerConfig
    from agentd.supervisor.wiring import open_root_supervisor
    from agentd.telemetry.events import EventLog
    from tests.peers import proctree
    from tests.supervisor.conftest import _from_instruction
    from tests.supervisor.test_tree import nested

    env = {"TOK": "tok-value-fs-0123456", "OTHER": "other-value-web-456789", "THIRD": "third-value-db-789012"}
    cfg = Config(instruction="root", intelligence=IntelligenceConfig(endpoints=("http://127.0.0.1:9/v1",)), subagents=SubagentsConfig(max_depth=3), mcp=(
        McpServerConfig("fs", "http://127.0.0.1:1/mcp", headers={"Authorization": "Bearer {{secret:TOK}}"}),
        McpServerConfig("web", "http://127.0.0.1:2/mcp", headers={"X-Key": "{{secret:OTHER}}"}),
        McpServerConfig("db", "http://127.0.0.1:3/mcp", headers={"X-Db": "{{secret:THIRD}}"}),
    ))
    before = set(proctree.descendants())
    with trio.fail_after(60):
        async with open_root_supervisor(cfg, log=EventLog(sink=events.append), env=env, fork_server=False,
                                        test_script=_from_instruction) as sup:
            child = await sup.spawn(ROOT, req(
                ["spawn", nested(["echo"], tool_scope=["fs"])],
                ["spawn_async", nested(["hang"], tool_scope=["fs"])],
                ["echo"], warm=True, tool_scope=("fs", "web")))
            await sup.wait_until(lambda stats: len(stats.tree_live or ()) >= 2)  # the child and the hanging grandchild
            blobs = []
            for pid in proctree.descendants():
                if pid in before:
                    continue
                for name in ("environ", "cmdline"):
                    try:
                        blobs.append(await (trio.Path(f"/proc/{pid}") / name).read_bytes())
                    except (FileNotFoundError, ProcessLookupError):
                        pass
            await sup.cancel(ROOT, child.handle, "done")
    assert child.result["secret_names"] == ["OTHER", "TOK"]
    grandchild = child.result["spawned"][0]["result"]
    assert grandchild["secret_names"] == ["TOK"] and grandchild["tool_scope"] == ["fs"]
    assert len(blobs) >= 4  # the child and the hanging grandchild: environ and cmdline
    for value in env.values():
        assert not any(value.encode() in blob for blob in blobs)
    assert not any(value in json.dumps(list(events)) for value in env.values())
