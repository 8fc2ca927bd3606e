"""The several-hosts harness (tests/peers/netns.py) and real agentd processes on different hosts.

Hosts are network namespaces on a private bridge; a cut link drops packets silently, as a partition does.
The agents' model is the scripted gateway in this process, reached from each host through a loopback relay
(``Host.forward``), so only the link between the agents is cut.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.agents import agentd_worker, events_of, run_agentd, text_of
from tests.peers import netns
from tests.peers.gateway import RecordedRequest, scripted_gateway, text, tool_call
from tests.selfmcp.certs import Pki, make_pki
from tests.waiting import until

pytestmark = [pytest.mark.usefixtures("no_leftover_children")]

CALL_TIMEOUT = 10.0


@pytest.fixture(autouse=True)
def _netns_available() -> None:
    netns.require()


async def connect(host: netns.Host, addr: str, port: int, timeout: float) -> trio.SocketStream | None:
    """A TCP connection made from inside ``host``, or None when nothing answered within ``timeout``."""
    with netns._inside(host.name):
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock = trio.socket.from_stdlib_socket(raw)
    with trio.move_on_after(timeout):
        await sock.connect((addr, port))
        return trio.SocketStream(sock)
    sock.close()
    return None


async def test_hosts_reach_each_other_and_a_cut_link_is_silence() -> None:
    async with netns.network(2, root_link=True) as net:
        a, b = net.hosts
        assert len({a.name, b.name, net.switch}) == 3 and all(str(os.getpid()) in n for n in net.namespaces)
        assert a.addr != b.addr and net.root_addr is not None
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(a.listen_socket(0, a.addr)))
        port = listener.socket.getsockname()[1]
        async with listener:
            # B reaches A over the bridge; A's loopback is its own (nothing listens there from B's side).
            stream = await connect(b, a.addr, port, timeout=5)
            assert stream is not None
            accepted = await listener.accept()
            await stream.send_all(b"ping")
            assert await accepted.receive_some(4) == b"ping"
            await stream.aclose()
            await accepted.aclose()
            # The root namespace is on the network too (root_link).
            root = trio.socket.socket()
            with trio.fail_after(5):
                await root.connect((a.addr, port))
            root.close()
            (await listener.accept()).socket.close()
            # A cut link: the SYN is dropped, no reset, no answer; the link back and it connects again.
            a.link_down()
            assert await connect(b, a.addr, port, timeout=1.0) is None
            a.link_up()
            with trio.fail_after(10):
                stream = await connect(b, a.addr, port, timeout=10)
            assert stream is not None
            await stream.aclose()
        # Host.run: a process group inside the host, killed as a whole (the backgrounded child too).
        async with b.run(["sh", "-c", "sleep 300 & exec sleep 301"]):
            await until(lambda: len(netns._pids_in(b.name)) >= 2, timeout=5, what="both processes in the host")
        await until(lambda: not netns._pids_in(b.name), timeout=5, what="the host's processes gone")


async def test_cleanup_after_a_failing_test_and_of_a_killed_run() -> None:
    # A failing block: the process left inside and every namespace and link go.
    tag = ""
    inside: subprocess.Popen[bytes] | None = None
    with pytest.raises(RuntimeError, match="the test failed"):
        async with netns.network(2, root_link=True) as net:
            tag = net.tag
            inside = subprocess.Popen([*net.hosts[1].exec_prefix, "sleep", "300"])
            await until(lambda: netns._pids_in(net.hosts[1].name), timeout=5, what="the process in the host")
            raise RuntimeError("the test failed")
    assert inside is not None
    assert inside.wait(timeout=5) == -9
    assert netns.leftovers(tag) == []
    # Leftovers of a run killed outright (its pid gone) are removed by the next network (ours, or another
    # xdist worker's that gets there first), the process left in them killed; live runs' are not.
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    stale = f"{netns.PREFIX}{dead}-0-h0"
    netns.ip("netns", "add", stale)
    orphan = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "300"])
    try:
        await until(lambda: netns._pids_in(stale) or stale not in netns.namespaces(), timeout=5,
                    what="the orphan in the stale namespace")
        async with netns.hosts(1) as (only,):
            assert stale not in netns.namespaces()
            assert netns.cleanup_stale() == [] and only.name in netns.namespaces()
        assert orphan.wait(timeout=5) != 0  # killed (or, if a cleanup won the race to its exec, never ran)
    finally:
        netns.remove_namespace(stale)
        orphan.kill()
        orphan.wait(timeout=5)


# --- agentd on two hosts --------------------------------------------------------------------------------------


def role(request: RecordedRequest) -> str:
    user = " ".join(text_of(m.get("content")) for m in request.messages if m.get("role") == "user")
    return "WORKER" if "WORKER-TASK" in user else "PARENT"


def tool_texts(request: RecordedRequest) -> list[str]:
    return [text_of(m.get("content")) for m in request.messages if m.get("role") == "tool"]


def parent_config(tmp_path: Path, pki: Pki, url: str) -> Path:
    config = tmp_path / "parent.yaml"
    config.write_text(  # the worker serves on the test network's private address: egress there is opt-in
        f"{netns.EGRESS_ALLOW}\n"
        "mcp_servers:\n"
        f"  - name: reviewer\n    url: {url}\n    call_timeout: {CALL_TIMEOUT:g}s\n"
        f"    tls: {{ca: {pki.ca}, cert: {pki.client.cert}, key: {pki.client.key}}}\n"
    )
    return config


@pytest.mark.slow
async def test_parent_spawns_on_another_host_a_cut_link_fails_the_call_and_a_restored_one_works(
        tmp_path: Path) -> None:
    """Worker agentd on host A serves its self-MCP over HTTPS with mTLS on A's address; a parent agentd on
    host B spawns a subagent there. Cutting A's link while the spawn is in flight ends the parent's call
    with the documented call time-out (a tool fault the model sees, ``no answer within N s``, N the
    server's ``call_timeout``) within a bound, although the worker answers right after the cut; with the
    link back a new parent run gets the worker's answer."""
    gate = trio.Event()
    worker_asked = trio.Event()

    def reply(request: RecordedRequest) -> dict[str, Any]:
        if role(request) == "WORKER":
            worker_asked.set()
            return text("WORKER-VERDICT: approve", wait=gate)
        if not tool_texts(request):
            return tool_call("reviewer__subagent_spawn", {"instruction": "WORKER-TASK review"})
        return text("", echo_last=True)

    async with netns.network(2) as net, scripted_gateway(default=reply) as gw:
        a, b = net.hosts
        pki = make_pki(tmp_path / "pki", names=(a.addr,))
        async with a.forward(gw.port) as model_a, b.forward(gw.port) as model_b:
            worker_argv = ["--serve-mcp", f"https://{a.addr}:0", "--serve-cert", str(pki.server.cert),
                           "--serve-key", str(pki.server.key), "--serve-client-ca", str(pki.ca),
                           "--intelligence", f"http://127.0.0.1:{model_a}", "--drain-timeout", "5"]
            async with agentd_worker(worker_argv, prefix=a.exec_prefix) as worker:
                assert worker.url.startswith(f"https://{a.addr}:")
                config = parent_config(tmp_path, pki, worker.url)
                parent_argv = ["--config", str(config), "--intelligence", f"http://127.0.0.1:{model_b}",
                               "--instruction", "PARENT-TASK: get a review", "--drain-timeout", "5"]
                runs: list[subprocess.CompletedProcess[bytes]] = []

                async def parent_run() -> None:
                    runs.append(await run_agentd(parent_argv, prefix=b.exec_prefix, timeout=120))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(parent_run)
                    with trio.fail_after(90):
                        await worker_asked.wait()
                    cut = trio.current_time()
                    a.link_down()
                    gate.set()  # the worker answers now: only the cut link keeps it from the parent
                elapsed = trio.current_time() - cut
                [first] = runs
                assert first.returncode == 0, first.stderr.decode()[-3000:]
                faults = [e for e in events_of(first) if e["event"] == "tool.result"]
                assert [(e["kind"], e["reason"]) for e in faults] == [
                    ("fault", f"tools/call subagent.spawn: no answer within {CALL_TIMEOUT:g} s")], faults
                result = json.loads(first.stdout)
                assert result["status"] == "completed"
                assert f"no answer within {CALL_TIMEOUT:g} s" in str(result["result"]), result
                # The call's own bound (counted from before the cut), then the abandoned call's bounded
                # cancel notification and the session's bounded DELETE (2 s each) on the way out.
                assert elapsed < CALL_TIMEOUT + 10, elapsed

                a.link_up()
                again = await run_agentd(parent_argv, prefix=b.exec_prefix, timeout=90)
                assert again.returncode == 0, again.stderr.decode()[-3000:]
                answer = json.loads(again.stdout)
                assert answer["status"] == "completed"
                assert "WORKER-VERDICT: approve" in str(answer["result"]), answer
            served = [e for e in worker.named("serve.request") if e.get("tool") == "subagent.spawn"]
            assert len(served) == 2
