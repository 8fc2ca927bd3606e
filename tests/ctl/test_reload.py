"""Reload with a real daemon: ``agentd ctl reload`` and SIGHUP re-read the config file; the model change
applies from the next model call; a change only a restart can make, an invalid file, or a configuration
that breaks the Rule of Two changes nothing."""

from __future__ import annotations

import signal

import pytest

from tests.ctl.daemon import ctl, daemon
from tests.durable.peer import counting_peer
from tests.peers.gateway import ScriptedGateway, scripted_gateway, text

pytestmark = pytest.mark.interop


def models(gw: ScriptedGateway) -> list[str]:
    return [str(r.body.get("model")) for r in gw.requests if r.path.endswith("/chat/completions")
            and isinstance(r.body, dict)]


def config(model: str, origin: str, tags: str = "[sensitive_data]", mode: str = "loop", level: str = "info") -> str:
    return (f"mode: {mode}\ninterval: 200ms\nmodel: {model}\nlog_level: {level}\n"
            f"mcp_servers:\n  - name: pay\n    url: {origin}/mcp\n    tags: {tags}\n")


async def test_reload_applies_the_model_and_refuses_what_needs_a_restart(tmp_path):
    sock = str(tmp_path / "agentd.sock")
    file = tmp_path / "agentd.yaml"
    async with scripted_gateway(default=text("tick")) as gw, counting_peer() as peer:
        file.write_text(config("m1", peer.origin))
        argv = ["--config", str(file), "--intelligence", gw.url,
                "--instruction", "Tick.", "--ctl-socket", sock]
        async with daemon(argv, tmp_path) as d:
            await d.until(lambda: "m1" in models(gw))

            file.write_text(config("m2", peer.origin, level="warn"))
            code, doc = await ctl("reload", "--socket", sock)
            assert code == 0 and doc["reloaded"] is True and doc["reloads"] == 1
            assert doc["changed"] == ["log_level", "model"]
            starts = len(d.events("loop.start"))
            await d.until(lambda: models(gw).count("m2") >= 2)
            assert len(d.events("loop.start")) == starts  # info events are off from the reload on

            # the mode is restart-only: refused, nothing else applied either
            file.write_text(config("m3", peer.origin, mode="schedule", level="warn"))
            code, doc = await ctl("reload", "--socket", sock)
            assert code == 1 and doc["outcome"] == "refused" and doc["refused"] == ["mode"]
            # the Rule of Two is checked again: a trifecta is invalid, nothing changes
            file.write_text(config("m3", peer.origin, tags="[untrusted_input, sensitive_data, external_comms]", level="warn"))
            code, doc = await ctl("reload", "--socket", sock)
            assert code == 1 and doc["outcome"] == "invalid" and "Rule of Two" in doc["error"]
            file.write_text("model: [m3\n")  # not YAML
            code, doc = await ctl("reload", "--socket", sock)
            assert code == 1 and doc["outcome"] == "invalid"
            seen = len(models(gw))
            await d.until(lambda: len(models(gw)) >= seen + 2)
            assert set(models(gw)[seen:]) == {"m2"}  # the running config was kept

            file.write_text(config("m4", peer.origin, level="warn"))
            d.proc.send_signal(signal.SIGHUP)  # what systemd's ExecReload sends
            await d.until(lambda: "m4" in models(gw))
            code, status = await ctl("status", "--socket", sock)
            assert code == 0 and status["config"]["reloads"] == 2

            d.proc.send_signal(signal.SIGTERM)
            code, result = await d.wait()
        assert code == 0 and result["status"] == "completed"
        reloads = d.events("ctl.reload")
        assert [(e["outcome"], e["trigger"]) for e in reloads] == [
            ("applied", "ctl"), ("refused", "ctl"), ("invalid", "ctl"), ("invalid", "ctl"), ("applied", "SIGHUP")]
