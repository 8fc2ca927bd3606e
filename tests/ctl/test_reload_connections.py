"""Reload of the MCP servers and the intelligence endpoints, with a real daemon, real MCP peers and real gateways.

A loop daemon (every tick is a wake on the daemon's long-lived pool and intelligence) has its config file
rewritten: an added server is handshaked and its tools are offered from the next wake on, a changed server
is re-handshaked with its new headers, a removed one disappears, the gateway URL moves to another gateway.
A required server that cannot be reached makes the reload fail and the old servers keep serving; the
settings only a restart changes are refused by name. Header secrets never appear in an event."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.ctl.daemon import Daemon, ctl, daemon
from tests.durable.peer import counting_peer
from tests.peers.gateway import RecordedRequest, ScriptedGateway, scripted_gateway, text
from tests.waiting import until

pytestmark = pytest.mark.interop

SECRET_A = "s3cr3t-header-value-a"
SECRET_B = "s3cr3t-header-value-b"


def chats(gw: ScriptedGateway) -> list[RecordedRequest]:
    return [r for r in gw.requests if r.path.endswith("/chat/completions")]


def offered(gw: ScriptedGateway) -> list[set[str]]:
    """The MCP tools offered to the model on each call (the peers' two tools, by server)."""
    return [{t for t in r.tool_names if t.endswith(("__lookup", "__charge"))} for r in chats(gw)]


def server(name: str, origin: str, *, key: str | None = None, required: bool = True) -> str:
    entry = f"  - name: {name}\n    url: {origin}/mcp\n    tags: [sensitive_data]\n    connect_timeout: 2\n"
    if not required:
        entry += "    required: false\n"
    if key is not None:
        entry += f"    headers:\n      X-Api-Key: '{{{{secret:{key}}}}}'\n"
    return entry


def config(gateway: str, *servers: str, extra: str = "") -> str:
    return (f"mode: loop\ninterval: 200ms\nintelligence: {gateway}\n{extra}"
            f"mcp_servers:\n{''.join(servers)}")


async def reload(sock: str) -> tuple[int, dict]:
    return await ctl("reload", "--socket", sock)


def no_secret_in(d: Daemon) -> None:
    err = d.stderr.read_text()
    assert SECRET_A not in err and SECRET_B not in err


async def test_reload_adds_changes_and_removes_servers_and_moves_the_gateway(tmp_path, monkeypatch):
    monkeypatch.setenv("RELOAD_KEY_A", SECRET_A)
    monkeypatch.setenv("RELOAD_KEY_B", SECRET_B)
    sock = str(tmp_path / "agentd.sock")
    file = tmp_path / "agentd.yaml"
    async with (
        scripted_gateway(default=text("tick")) as gw1,
        scripted_gateway(default=text("tock")) as gw2,
        counting_peer() as pay,
        counting_peer() as books,
    ):
        file.write_text(config(gw1.url, server("pay", pay.origin, key="RELOAD_KEY_A")))
        async with daemon(["--config", str(file), "--instruction", "Tick.", "--ctl-socket", sock], tmp_path) as d:
            await d.until(lambda: any("pay__lookup" in tools for tools in offered(gw1)))
            assert [h.get("x-api-key") for h in pay.handshakes] == [SECRET_A]

            # a second server and another gateway: both from the next wake on
            file.write_text(config(gw2.url, server("pay", pay.origin, key="RELOAD_KEY_A"), server("books", books.origin)))
            code, doc = await reload(sock)
            assert code == 0 and doc["reloaded"] is True, doc
            assert doc["changed"] == ["intelligence", "mcp"]
            assert doc["mcp"] == {"added": ["books"], "removed": [], "changed": []}
            assert doc["intelligence"] == [gw2.url]
            before = len(chats(gw1))
            await d.until(lambda: any({"pay__lookup", "books__lookup"} <= tools for tools in offered(gw2)))
            assert len(books.handshakes) == 1 and len(pay.handshakes) == 1  # the unchanged server kept its session
            assert len(chats(gw1)) <= before + 1  # at most the call in flight at the reload finished there

            # a changed header re-handshakes that server; a removed server's tools are gone at the next wake
            file.write_text(config(gw2.url, server("pay", pay.origin, key="RELOAD_KEY_B")))
            code, doc = await reload(sock)
            assert code == 0 and doc["mcp"] == {"added": [], "removed": ["books"], "changed": ["pay"]}, doc
            assert [h.get("x-api-key") for h in pay.handshakes] == [SECRET_A, SECRET_B]
            seen = len(chats(gw2))
            await d.until(lambda: len(chats(gw2)) >= seen + 3)
            assert offered(gw2)[-1] == {"pay__lookup", "pay__charge"}

            d.proc.send_signal(signal.SIGTERM)
            code, result = await d.wait()
        assert code == 0 and result["status"] == "completed"
        applied = [e for e in d.events("ctl.reload") if e["outcome"] == "applied"]
        assert [e["mcp"] for e in applied] == [{"added": ["books"], "removed": [], "changed": []},
                                               {"added": [], "removed": ["books"], "changed": ["pay"]}]
        no_secret_in(d)


async def test_an_unreachable_required_server_fails_the_reload_and_the_old_servers_keep_serving(tmp_path, monkeypatch):
    monkeypatch.setenv("RELOAD_KEY_A", SECRET_A)
    sock = str(tmp_path / "agentd.sock")
    file = tmp_path / "agentd.yaml"
    dead = "http://127.0.0.1:9"  # discard port: nothing listens there
    async with scripted_gateway(default=text("tick")) as gw, counting_peer() as pay:
        file.write_text(config(gw.url, server("pay", pay.origin)))
        async with daemon(["--config", str(file), "--instruction", "Tick.", "--ctl-socket", sock], tmp_path) as d:
            await d.until(lambda: any("pay__lookup" in tools for tools in offered(gw)))

            # a required server that cannot be reached, beside a change of the gateway: nothing changes
            file.write_text(config(gw.url.replace("/v1", "/v2"), server("pay", pay.origin),
                                   server("down", dead, key="RELOAD_KEY_A")))
            code, doc = await reload(sock)
            assert code == 1 and doc["outcome"] == "failed" and "down" in doc["error"], doc
            seen = len(chats(gw))
            await d.until(lambda: len(chats(gw)) >= seen + 2)
            assert all(r.path == "/v1/chat/completions" for r in chats(gw)[seen:])  # the old endpoint
            assert offered(gw)[-1] == {"pay__lookup", "pay__charge"}  # the old pool
            assert len(pay.handshakes) == 1

            # an optional one that cannot be reached does not hold the reload back
            file.write_text(config(gw.url, server("pay", pay.origin), server("down", dead, required=False)))
            code, doc = await reload(sock)
            assert code == 0 and doc["mcp"]["added"] == ["down"], doc

            # what only a restart changes is refused by name, and nothing else of that file is applied
            file.write_text(config(gw.url, server("pay", pay.origin), extra=f"state_dir: {tmp_path / 'state'}\n"
                                   "serve_mcp: http://127.0.0.1:0/mcp\n"))
            code, doc = await reload(sock)
            assert code == 1 and doc["outcome"] == "refused" and doc["refused"] == ["serve_mcp", "state_dir"], doc
            code, status = await ctl("status", "--socket", sock)
            assert status["config"]["reloads"] == 1

            d.proc.send_signal(signal.SIGTERM)
            code, result = await d.wait()
        assert code == 0 and result["status"] == "completed"
        outcomes = [(e["outcome"], e.get("refused")) for e in d.events("ctl.reload")]
        assert outcomes == [("failed", None), ("applied", None), ("refused", ["serve_mcp", "state_dir"])]
        no_secret_in(d)


async def test_a_reactive_daemon_moves_a_replaced_servers_subscription_and_drops_a_removed_ones(tmp_path):
    from tests.peers import launch

    sock = str(tmp_path / "agentd.sock")
    file = tmp_path / "agentd.yaml"

    def reactive(servers: dict[str, str], subscribe: str) -> str:
        entries = "".join(f"  - name: {n}\n    url: {u}\n    tags: [sensitive_data]\n" for n, u in servers.items())
        return (f"mode: reactive\ndebounce: 50ms\nintelligence: {gw.url}\nsubscribe: ['{subscribe}']\n"
                f"mcp_servers:\n{entries}")

    def wakes() -> int:
        return len([e for e in d.events("run.end") if e.get("trigger") == "wake"])

    async with (
        scripted_gateway(default=text("noted")) as gw,
        launch.peer_server(launch.sdk_server_argv()) as first,
        launch.peer_server(launch.sdk_server_argv()) as second,
    ):
        file.write_text(reactive({"srv": first.url}, "srv:test://counter"))
        argv = ["--config", str(file), "--instruction", "Report the counter.", "--ctl-socket", sock]
        async with daemon(argv, tmp_path) as d:
            await d.until(lambda: d.events("trigger.armed"))
            await launch.abump(first.url)
            await d.until(lambda: wakes() == 1)

            # srv moves to the second peer: its subscription is made there (one synthesized update: a wake)
            file.write_text(reactive({"srv": second.url, "other": first.url}, "srv:test://counter"))
            code, doc = await reload(sock)
            assert code == 0 and doc["mcp"] == {"added": ["other"], "removed": [], "changed": ["srv"]}, doc
            await d.until(lambda: wakes() == 2)
            await launch.abump(second.url)
            await d.until(lambda: wakes() == 3)

            # srv is removed: what its connection watched is dropped, with events saying so
            file.write_text(reactive({"other": first.url}, "other:test://other"))
            code, doc = await reload(sock)
            assert code == 0 and doc["mcp"] == {"added": [], "removed": ["srv"], "changed": []}, doc
            [dropped] = [e for e in d.events("mcp.subscribe") if e.get("action") == "dropped"]
            assert dropped["server"] == "srv" and dropped["uri"] == "test://counter"
            [forgotten] = d.events("trigger.dropped")
            assert forgotten["uri"] == "test://counter" and forgotten["origins"] == ["config"]
            await d.until(lambda: any(e["uri"] == "test://other" for e in d.events("trigger.armed")))

            d.proc.send_signal(signal.SIGTERM)
            code, _ = await d.wait()
        assert code == 0, d.stderr.read_text()[-2000:]


async def test_a_reload_keeps_an_event_servers_2026_connection_and_its_subscription(tmp_path):
    """A server an --on-event names connects on the 2026-07-28 wire (era auto would settle on 2025-11-25 with a
    server that speaks both); a reload that adds another server must see it as unchanged, not reconnect it
    with era auto, and the subscription keeps waking."""
    from tests.modes.events_peer import emit, side
    from tests.peers import launch

    sock = str(tmp_path / "agentd.sock")
    file = tmp_path / "agentd.yaml"
    events = "on_events:\n  - {server: ev, event: ticket.created}\n"
    async with scripted_gateway(default=text("handled")) as gw, counting_peer() as books, \
            launch.peer_server(launch.events_server_argv()) as peer:
        entry = f"  - name: ev\n    url: {peer.url}\n"
        file.write_text(f"mode: reactive\nintelligence: {gw.url}\n{events}mcp_servers:\n{entry}")
        async with daemon(["--config", str(file), "--instruction", "Handle tickets.", "--ctl-socket", sock],
                          tmp_path) as d:
            async def polled() -> Any:  # armed and polled once: its null cursor means "from now"
                assert d.alive(), d.stderr.read_text()[-3000:]
                return (await side(peer.url, "/_test/events"))["polls"]

            await until(polled, timeout=60, what="the first poll")
            file.write_text(f"mode: reactive\nintelligence: {gw.url}\n{events}mcp_servers:\n{entry}"
                            f"{server('books', books.origin)}")
            code, doc = await reload(sock)
            assert code == 0 and doc["mcp"] == {"added": ["books"], "removed": [], "changed": []}, doc
            [ticket] = await emit(peer.url, {"title": "after the reload"})
            await d.until(lambda: any(ticket in str(r.messages) for r in chats(gw)))
            d.proc.send_signal(signal.SIGTERM)
            code, _ = await d.wait()
        assert code == 0
        assert [e["era"] for e in d.events("mcp.era") if e.get("server") == "ev"] == ["modern"]
