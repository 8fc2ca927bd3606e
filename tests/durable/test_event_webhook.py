"""MCP events by webhook (real agentd processes serving HTTPS with generated certificates, the events-extension
peer delivering ``alert.raised`` by signed POSTs over real TLS, the scripted gateway): a delivery wakes the daemon
once; a forged signature, a stale timestamp or no signature is refused (401) and wakes nothing; a replayed
``webhook-id`` wakes nothing; after a SIGKILL the restarted daemon subscribes again from its journaled cursor and
the events delivered while it was down wake it once each; a drained daemon unsubscribes. The secret is never in
agentd's logs."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from agentd.mcp.events import subscription_key
from tests.durable.daemons import daemon, daemon_until, event_cursor, wait_until, wakes_with
from tests.modes.events_peer import emit, side
from tests.peers import launch
from tests.peers.gateway import scripted_gateway, text
from tests.selfmcp.certs import make_pki

pytestmark = pytest.mark.interop

KEY = subscription_key("ev", "alert.raised", {})


def _cursor(state: Path) -> Any:
    return event_cursor(state, KEY)


def _seen(url: str) -> dict[str, Any]:
    seen: dict[str, Any] = httpx.get(url.removesuffix("/mcp") + "/_test/events").json()
    return seen


def _argv(gw_url: str, peer_url: str, state: Path, pki: Any) -> list[str]:
    return [sys.executable, "-m", "agentd", "--mode", "reactive", "--intelligence", gw_url,
            "--mcp", f"ev={peer_url}", "--on-event", "ev:alert.raised", "--instruction", "Handle alerts.",
            "--run-id", "alerts", "--state-dir", str(state), "--log-level", "info",
            "--serve-mcp", "https://127.0.0.1:0/mcp", "--serve-cert", str(pki.server.cert),
            "--serve-key", str(pki.server.key)]


async def test_webhook_deliveries_wake_once_forgeries_and_replays_wake_nothing_and_a_sigkill_loses_nothing(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    pki = make_pki(tmp_path / "pki")
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv(webhook_ca=pki.ca)) as peer:
        argv = _argv(gw.url, peer.url, state, pki)

        # First start: subscribed from now (verification challenge answered), the watermark journaled.
        async with daemon(argv, tmp_path / "1.stderr") as proc:
            await wait_until(proc, tmp_path / "1.stderr", lambda: _cursor(state) == {"cursor": "c0"})
            [subscribe] = _seen(peer.url)["subscribes"]
            assert subscribe["cursor"] is None and subscribe["url"].startswith("https://127.0.0.1:")
            assert "/_agentd/webhooks/events/" in subscribe["url"]

            [first] = await emit(peer.url, {"title": "disk full"}, name="alert.raised")
            await wait_until(proc, tmp_path / "1.stderr",
                             lambda: wakes_with(gw, first) == 1 and _cursor(state) == {"cursor": "c1"})

            assert (await side(peer.url, "/_test/webhook/forge", kind="signature"))["status"] == 401
            assert (await side(peer.url, "/_test/webhook/forge", kind="stale"))["status"] == 401
            assert (await side(peer.url, "/_test/webhook/forge", kind="unsigned"))["status"] == 401
            replay = await side(peer.url, "/_test/webhook/replay")
            assert replay == {"status": 200, "webhook_id": first}  # accepted as a duplicate, dropped

            # A later delivery wakes once, carrying neither the forgeries nor the replay.
            [second] = await emit(peer.url, {"title": "cpu hot"}, name="alert.raised")
            await wait_until(proc, tmp_path / "1.stderr",
                             lambda: wakes_with(gw, second) == 1 and _cursor(state) == {"cursor": "c2"})
            assert wakes_with(gw, first) == 1
            assert not any("evt-forged" in str(r.messages) for r in gw.requests)
        # (SIGKILLed: no unsubscribe)

        # While down: two alerts (the old callback URL is dead; the peer gives up on it).
        missed = await emit(peer.url, {"title": "while down"}, name="alert.raised", count=2)

        # Restart: subscribed again from the journaled cursor; each missed alert wakes once.
        await daemon_until(argv, tmp_path / "2.stderr",
                           lambda: all(wakes_with(gw, i) == 1 for i in missed) and _cursor(state) == {"cursor": "c4"})
        subscribes = _seen(peer.url)["subscribes"]
        assert [s["cursor"] for s in subscribes] == [None, "c2"]
        assert subscribes[0]["url"] != subscribes[1]["url"]  # a new route (and secret) per subscription
        assert [wakes_with(gw, i) for i in (first, second, *missed)] == [1, 1, 1, 1]

        # Refused POSTs were logged without the secret; no secret is in any log.
        log1 = (tmp_path / "1.stderr").read_text()
        refused = [line for line in log1.splitlines() if '"webhook.refused"' in line]
        assert len(refused) == 3 and "no webhook-signature matches" in refused[0]
        assert "outside the 300 s window" in refused[1] and "missing webhook-id" in refused[2]
        assert '"webhook.duplicate"' in log1
        secrets = (await side(peer.url, "/_test/webhook/secrets"))["secrets"]
        assert len(set(secrets)) == 2
        for log in (log1, (tmp_path / "2.stderr").read_text()):
            assert not any(secret in log or secret.removeprefix("whsec_") in log for secret in secrets)


async def test_a_drained_daemon_unsubscribes_and_refreshes_before_the_grant_lapses(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv(webhook_ca=pki.ca, webhook_ttl=2.0)) as peer:
        argv = _argv(gw.url, peer.url, tmp_path / "state", pki)
        async with daemon(argv, tmp_path / "1.stderr") as proc:
            # A 2 s grant: refreshed half-way, with the same URL (the same subscription) and the last cursor.
            await wait_until(proc, tmp_path / "1.stderr", lambda: len(_seen(peer.url)["subscribes"]) >= 3)
            subscribes = _seen(peer.url)["subscribes"]
            assert [s["refresh"] for s in subscribes[:3]] == [False, True, True]
            assert len({s["url"] for s in subscribes}) == 1 and subscribes[1]["cursor"] == "c0"
            # The route is bounded and POST only; an unknown route is 404 (none of these needs the bearer).
            url = subscribes[0]["url"]
            async with httpx.AsyncClient(verify=pki.client_context()) as client:
                assert (await client.post(url, content=b"{" * (256 * 1024 + 1))).status_code == 413
                assert (await client.get(url)).status_code == 405
                assert (await client.post(url + "x", content=b"{}")).status_code == 404
                assert (await client.post(url, content=b"{}")).status_code == 401
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                await proc.wait()
        [gone] = _seen(peer.url)["unsubscribes"]
        assert gone["url"] == subscribes[0]["url"]


async def test_a_gap_envelope_wakes_with_a_gap_and_a_terminated_subscription_is_subscribed_again(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    pki = make_pki(tmp_path / "pki")
    async with scripted_gateway(default=text("handled")) as gw, \
            launch.peer_server(launch.events_server_argv(webhook_ca=pki.ca)) as peer:
        async with daemon(_argv(gw.url, peer.url, state, pki), tmp_path / "1.stderr") as proc:
            await wait_until(proc, tmp_path / "1.stderr", lambda: _cursor(state) == {"cursor": "c0"})
            await emit(peer.url, {"title": "skipped"}, name="ticket.created", count=3)  # moves the log, not us
            assert (await side(peer.url, "/_test/webhook/envelope", type="gap"))["status"] == 200
            await wait_until(proc, tmp_path / "1.stderr", lambda: _cursor(state) == {"cursor": "c3"})
            [prompt] = [str(r.messages) for r in gw.requests]
            assert "GAP" in prompt

            assert (await side(peer.url, "/_test/webhook/envelope", type="terminated"))["status"] == 200
            await wait_until(proc, tmp_path / "1.stderr", lambda: len(_seen(peer.url)["subscribes"]) == 2)
            again = _seen(peer.url)["subscribes"][1]
            assert again["refresh"] is False and again["cursor"] == "c3"  # a new subscription, from the cursor
            [alert] = await emit(peer.url, {"title": "after the re-subscribe"}, name="alert.raised")
            await wait_until(proc, tmp_path / "1.stderr", lambda: wakes_with(gw, alert) == 1)
        ended = [line for line in (tmp_path / "1.stderr").read_text().splitlines() if "access revoked" in line]
        assert ended and '"events.poll_failed"' in ended[0]
