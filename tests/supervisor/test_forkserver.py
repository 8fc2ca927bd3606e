"""The same guarantees when children are forked from the pre-imported fork server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from agentd.supervisor.caps import Refusal
from tests.peers import proctree
from tests.supervisor.conftest import ROOT, req, script
from tests.waiting import until


async def test_forked_children_run_sync_async_and_warm(root, events):
    with trio.fail_after(40):
        async with root(fork_server=True) as sup:
            sync = await sup.spawn(ROOT, req(["usage", 2, 3], ["echo"]))
            assert (sync.status, sync.result["handle"]) == ("completed", "0.1")
            server_pid = sup.statistics().fork_server_pid
            assert server_pid is not None
            # Forked, not re-executed: the child's parent is the fork server, in its own session.
            late = await sup.spawn(ROOT, req(["hang"], async_=True))
            pid = (await sup.wait_ready(late.handle)).pid
            assert proctree.descendants()[pid].ppid == server_pid
            assert os.getsid(pid) == pid
            warm = await sup.spawn(ROOT, req(["echo"], warm=True))
            assert (await sup.send(ROOT, warm.handle, "again")).result["message"] == "again"
            nested = await sup.spawn(ROOT, req(["spawn", {"instruction": script(["result", "deep"])}]))
            assert nested.result["spawned"][0]["result"] == "deep"
    assert events.named("subagent.exit", handle="0.1")[0]["usage_tokens"] == 5


@pytest.mark.parametrize(("flags", "rung"), [
    ({}, "cancel"),
    ({"ignore_cancel": True}, "eof"),
    ({"ignore_cancel": True, "ignore_eof": True}, "sigterm"),
    ({"ignore_cancel": True, "ignore_eof": True, "ignore_sigterm": True}, "sigkill"),
])
async def test_the_ladder_reaches_each_rung_for_forked_children(root, events, flags, rung):
    with trio.fail_after(40):
        async with root(fork_server=True) as sup:
            await sup.spawn(ROOT, req(["hang"], async_=True, flags=flags))
            await sup.wait_ready("0.1")
            view = await sup.cancel(ROOT, "0.1")
    assert view.status == "cancelled"
    assert events.named("subagent.exit", handle="0.1")[0]["rung"] == rung


async def test_failures_are_reported_for_forked_children(root):
    with trio.fail_after(40):
        async with root(fork_server=True) as sup:
            crash = await sup.spawn(ROOT, req(["crash", 5]))
            assert crash.status == "failed" and "status 5" in crash.result["error"]
            garbage = await sup.spawn(ROOT, req(["garbage"]))
            assert "bad frame" in garbage.result["error"]
            await sup.spawn(ROOT, req(["hang"], async_=True))
            os.kill((await sup.wait_ready("0.3")).pid, signal.SIGKILL)
            killed = await sup.await_(ROOT, "0.3")
            assert "killed by signal 9" in killed.result["error"]


async def test_losing_the_fork_server_fails_its_children_and_the_next_spawn_starts_a_new_one(root):
    with trio.fail_after(40):
        async with root(fork_server=True) as sup:
            await sup.spawn(ROOT, req(["hang"], async_=True))
            await sup.wait_ready("0.1")
            server_pid = sup.statistics().fork_server_pid
            os.kill(server_pid, signal.SIGKILL)
            gone = await sup.await_(ROOT, "0.1")
            assert gone.status == "failed"
            assert (await sup.wait_until(lambda s: s.fork_server_pid is None)).fork_server_pid is None
            after = await sup.spawn(ROOT, req(["result", "still spawning"]))
            assert after.result == "still spawning"
            assert not isinstance(after, Refusal)
            assert sup.statistics().fork_server_pid not in (None, server_pid)


def _relayed(events, name: str) -> list[dict]:
    """Events of nested supervisors: each child's log lines reach the root as ``subagent.stderr``, a
    grandchild's nested once more."""
    import json

    found, lines = [], [e for e in events if e["event"] == "subagent.stderr"]
    while lines:
        try:
            inner = json.loads(lines.pop()["line"])
        except ValueError:
            continue
        if inner.get("event") == name:
            found.append(inner)
        elif inner.get("event") == "subagent.stderr":
            lines.append(inner)
    return found


async def test_children_at_depth_two_and_three_are_forked_from_the_trees_fork_server(root, events):
    deepest = script(["ancestry"])
    middle = script(["spawn", {"instruction": deepest}], ["ancestry"])
    with trio.fail_after(60):
        async with root(fork_server=True, max_depth=4) as sup:
            view = await sup.spawn(ROOT, req(["spawn", {"instruction": middle}], ["ancestry"]))
            server = sup.statistics().fork_server_pid
    assert view.status == "completed", view
    one = view.result
    two = one["spawned"][0]["result"]
    assert "result" in two["spawned"][0], two
    three = two["spawned"][0]["result"]
    # Every depth is a child of the one fork server in Unix terms, and watches its parent in the tree.
    assert (one["ppid"], two["ppid"], three["ppid"]) == (server, server, server)
    assert (two["parent"], three["parent"]) == (str(one["pid"]), str(two["pid"]))
    spawned = {e["depth"]: e["forked"] for e in _relayed(events, "subagent.spawn")}
    assert spawned == {2: True, 3: True}
    assert events.named("subagent.spawn", handle="0.1")[0]["forked"] is True


async def test_a_nested_forked_child_ends_when_its_parent_is_killed(root):
    with trio.fail_after(60):
        async with root(fork_server=True) as sup:
            await sup.spawn(ROOT, req(["spawn_async", {"instruction": script(["hang"])}], ["hang"], async_=True))
            child = (await sup.wait_ready("0.1")).pid
            server = sup.statistics().fork_server_pid

            def grandchildren() -> list[int]:
                return [p.pid for p in proctree.descendants().values()
                        if p.ppid == server and p.pid != child and not p.zombie]

            await until(grandchildren, timeout=60, what="the grandchild")
            [grandchild] = grandchildren()
            os.kill(child, signal.SIGKILL)  # no ladder, no cancel: the grandchild sees its parent die
            await until(lambda: grandchild not in grandchildren(), timeout=60, what="the grandchild gone")
            assert (await sup.await_(ROOT, "0.1")).status == "failed"
            # The tree's fork server outlives the child: the next spawn is forked as before.
            assert (await sup.spawn(ROOT, req(["result", "again"]))).result == "again"
            assert sup.statistics().fork_server_pid == server



async def _pipelined_launches(pause: float) -> dict[int, int]:
    """Three concurrent launches against a stand-in server on a real socket pair, which reads all three
    requests before answering any, then answers them in order, ``pause`` seconds apart."""
    import json
    import socket

    from agentd.supervisor.forkserver import MESSAGE_SIZE, connect_fork_server
    from agentd.telemetry.events import null_log

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    peer = trio.socket.from_stdlib_socket(theirs)
    launched: dict[int, int] = {}
    async with trio.open_nursery() as nursery:
        await peer.send(json.dumps({"ready": 1}).encode())
        server = await connect_fork_server(nursery, ours.detach(), log=null_log())

        async def launch(i: int) -> None:
            child = await server.launch({"N": str(i)})
            launched[i] = child.pid
            for stream in (child.stdin, child.stdout, child.stderr):
                await stream.aclose()

        try:
            for i in range(3):
                nursery.start_soon(launch, i)
            asked = []
            for _ in range(3):  # all three arrive although none has been answered yet
                data, ancdata, _flags, _addr = await peer.recvmsg(MESSAGE_SIZE, socket.CMSG_SPACE(3 * 4))
                for _level, _type, fds in ancdata:
                    for fd in memoryview(fds).cast("i"):
                        os.close(fd)
                asked.append(int(json.loads(data)["env"]["N"]))
            for i in asked:
                await trio.sleep(pause)  # virtual time: 8 s apart on autojump_clock, or 0 (a checkpoint)
                await peer.send(json.dumps({"spawned": 1000 + i}).encode())
            await until(lambda: len(launched) >= 3, timeout=60, what="three launches")
        finally:
            with trio.CancelScope(shield=True):
                await server.aclose()  # ends its reader (and so the nursery) whatever happened
    peer.close()
    return launched


async def test_spawn_requests_are_pipelined_and_each_reply_reaches_the_launch_that_asked():
    # A burst of spawns does not wait for one fork-server round trip per spawn: every request is on the
    # server's socket before the first reply, and the replies (in request order) go to their own launches.
    with trio.fail_after(10):
        assert await _pipelined_launches(0) == {0: 1000, 1: 1001, 2: 1002}


async def test_a_launch_queued_behind_others_waits_while_the_server_answers(autojump_clock):
    # The last of three answered 24 s after its request, but the server answered something every 8 s:
    # no launch gives up (only a server silent for 10 s is given up on, and its spawns re-exec).
    assert await _pipelined_launches(8.0) == {0: 1000, 1: 1001, 2: 1002}


def test_the_fork_server_rehearses_a_child_session_and_leaves_nothing_behind_to_fork():
    """Before its first fork the server runs whole child sessions on itself, so each forked child starts
    with the session's code quickened and specialised (no copy-on-write of code objects it runs, no cold
    bytecode); and leaves no thread, descriptor or signal handler behind that a fork would inherit."""
    probe = textwrap.dedent("""
        import dis, json, os, signal, threading
        from agentd.child import forkserver, session

        def warm(fn):
            plain = [i.opname for i in dis.get_instructions(fn)]
            return plain != [i.opname for i in dis.get_instructions(fn, adaptive=True)]

        fns = (session._session, session._Session.run, session._Session._control)
        before = [warm(fn) for fn in fns]
        fds = sorted(os.listdir("/proc/self/fd"))
        forkserver._rehearse()
        import gc
        gc.collect()
        print(json.dumps({"before": before, "after": [warm(fn) for fn in fns],
                          "threads": threading.active_count(), "fds": sorted(os.listdir("/proc/self/fd")) == fds,
                          "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                          "wakeup_fd": signal.set_wakeup_fd(-1)}))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTD_PARENT_PID", "AGENTD_FORKED")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env,
                          check=True)
    assert json.loads(done.stdout) == {"before": [False] * 3, "after": [True] * 3, "threads": 1, "fds": True,
                                       "sigterm": True, "wakeup_fd": -1}


def _descriptors(pid: int) -> list[str]:
    """What each of ``pid``'s descriptors refers to (``socket:[inode]``, ``pipe:[inode]``, a path...)."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile
    return found


def _caught_signals(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16)
    raise AssertionError("no SigCgt line")


async def test_a_forked_child_holds_none_of_the_servers_descriptors_however_many_siblings_it_has(root):
    # The server holds a socket per live forked child; a new child closes all of them (by range) and keeps
    # only its pipes, its own connection and what its own loop opened: the tenth child has no more
    # descriptors than the first, and none of the server's.
    with trio.fail_after(60):
        async with root(fork_server=True, max_children=16, max_subagents=16, spawn_burst=16) as sup:
            first = await sup.spawn(ROOT, req(["echo"], warm=True))
            first_pid = sup._nodes[first.handle].pid
            for _ in range(8):
                assert not isinstance(await sup.spawn(ROOT, req(["echo"], warm=True)), Refusal)
            last = await sup.spawn(ROOT, req(["echo"], warm=True))
            assert not isinstance(last, Refusal), last.message
            last_pid = sup._nodes[last.handle].pid
            server_pid = sup.statistics().fork_server_pid
            assert first_pid and last_pid and server_pid
            for view in (first, last):  # a second turn: each child's own tasks have all started by now
                await sup.send(ROOT, view.handle, "again")
            servers = set(_descriptors(server_pid))
            mine = _descriptors(last_pid)
            assert len(mine) == len(_descriptors(first_pid))
            # The child's connection to the server is the other end of a pair: its inode is its own.
            assert not servers & {d for d in mine if d.startswith(("socket:", "pipe:"))}


async def test_a_forked_child_leaves_sigint_at_its_default(root):
    # No terminal's Ctrl-C reaches a forked child (its own session) and the ladder stops it with SIGTERM and
    # SIGKILL: its loop installs no SIGINT handler (trio's KeyboardInterrupt machinery skipped at its start),
    # while it still catches SIGTERM (the ladder's polite rung).
    with trio.fail_after(40):
        async with root(fork_server=True) as sup:
            view = await sup.spawn(ROOT, req(["echo"], warm=True))
            caught = _caught_signals(sup._nodes[view.handle].pid)
    assert not caught & (1 << (signal.SIGINT - 1))
    assert caught & (1 << (signal.SIGTERM - 1))


def test_the_fork_server_backs_its_heap_with_huge_pages_and_keeps_every_byte():
    """``_huge_pages`` collapses the server's anonymous memory into 2 MiB pages where whole aligned ranges
    allow (fork then copies one page-table entry per 2 MiB instead of 512): the memory reads back the same."""
    probe = textwrap.dedent("""
        import hashlib, json
        from agentd.child import forkserver

        blocks = [bytearray(hashlib.sha256(b"%d" % i).digest() * 32768) for i in range(4)]  # 4 x 1 MiB
        digest = [hashlib.sha256(b).hexdigest() for b in blocks]
        collapsed = forkserver._huge_pages()
        huge = 0
        with open("/proc/self/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("AnonHugePages:"):
                    huge = int(line.split()[1])
        print(json.dumps({"collapsed": collapsed, "huge_kib": huge,
                          "same": digest == [hashlib.sha256(b).hexdigest() for b in blocks]}))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    report = json.loads(done.stdout)
    assert report["same"]
    # Where the kernel can (Linux >= 6.1, THP built in), what was collapsed is mapped huge.
    assert report["collapsed"] == 0 or report["huge_kib"] >= 2048


def test_a_forked_childs_environment_is_exactly_the_one_its_supervisor_sent():
    """The server applies to each child only the differences between its own environment and the one the
    request carries (decoded once per distinct request): the result is that environment, nothing more."""
    probe = textwrap.dedent("""
        import json, os
        from agentd.child.forkserver import _Environments

        os.environ.update({"KEEP": "same", "STALE": "the server's", "CHANGED": "old"})
        asked = {"KEEP": "same", "CHANGED": "new", "ADDED": "x", "PATH": os.environ.get("PATH", "")}
        envs = _Environments()
        body = json.dumps({"env": asked}).encode()
        first, again = envs.change(body), envs.change(body)
        drop, put = first
        for name in drop:
            del os.environ[name]
        os.environ.update(put)
        errors = []
        for bad in (b'{"env": {"A": 1}}', b'{"env": []}', b'{"nope": {}}', b"not json"):
            try:
                envs.change(bad)
            except (ValueError, KeyError, TypeError) as exc:
                errors.append(type(exc).__name__)
        print(json.dumps({"same": dict(os.environ) == asked, "cached": again is first, "put": sorted(put),
                          "errors": errors}))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == {"same": True, "cached": True, "put": ["ADDED", "CHANGED"],
                                       "errors": ["ValueError", "ValueError", "KeyError", "JSONDecodeError"]}


def test_a_real_turn_imports_nothing_of_agentd_or_httpx_after_the_fork_servers_preimports():
    """Whatever a real child's turn imports on its way to its first model request is imported once by the fork
    server, not by every forked child (the model client's modules alone were ~20 ms of each child's CPU)."""
    probe = textwrap.dedent("""
        import json, sys, trio
        from agentd.child import forkserver
        forkserver._preimport()
        from tests.peers.gateway import scripted_gateway, text

        async def main():
            async with scripted_gateway(default=text("done")) as gw:
                from agentd.config.model import Config, IntelligenceConfig
                from agentd.telemetry.events import null_log
                from agentd.run import run_config
                before = set(sys.modules)
                result = await run_config(Config(instruction="hi", intelligence=IntelligenceConfig(endpoints=(gw.url,))), run_id="r",
                                          log=null_log())
                new = sorted(m for m in set(sys.modules) - before
                             if m.split(".")[0] in ("agentd", "httpx", "httpcore", "h11", "trio", "attr", "cattrs"))
                print(json.dumps({"status": result.status.value, "imported": new}))

        trio.run(main)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTD_PARENT_PID", "AGENTD_FORKED")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env,
                          check=True, cwd=Path(__file__).resolve().parents[2])
    assert json.loads(done.stdout) == {"status": "completed", "imported": []}
