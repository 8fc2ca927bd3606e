"""The I/O-free A2A values: card validation (interfaces, origin, caps), task/event parsing, observations."""

from __future__ import annotations

from typing import Any

import pytest

from agentd.a2a import types as a2a

BASE = "https://peer.example:8443"


def card(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "peer",
        "supportedInterfaces": [{"url": BASE + "/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
    }
    body.update(extra)
    return body


def test_a_1_0_card_is_preferred_to_0_3() -> None:
    parsed = a2a.parse_card(card(supportedInterfaces=[
        {"url": BASE + "/old", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        {"url": BASE + "/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
        {"url": BASE + "/new", "protocolBinding": "JSONRPC", "protocolVersion": "1.0.1"},
    ]), BASE)
    assert (parsed.rpc_url, parsed.version) == (BASE + "/new", "1.0")


def test_a_0_3_card() -> None:
    parsed = a2a.parse_card({"name": "old", "url": BASE + "/", "protocolVersion": "0.3.0",
                             "capabilities": {"streaming": True}}, BASE)
    assert (parsed.rpc_url, parsed.version, parsed.streaming) == (BASE + "/", "0.3", True)


@pytest.mark.parametrize(("body", "error"), [
    ([], "not an object"),
    ({"supportedInterfaces": []}, "no 'name'"),
    (card(name="  "), "empty name"),
    (card(supportedInterfaces=[{"url": BASE, "protocolBinding": "GRPC"}]), "no JSON-RPC interface"),
    (card(supportedInterfaces=[{"url": BASE, "protocolBinding": "JSONRPC", "protocolVersion": "2.0"}]),
     "offered: 2.0"),
    (card(supportedInterfaces=[{"url": "https://evil.example/rpc", "protocolBinding": "JSONRPC"}]), "another origin"),
    (card(supportedInterfaces=[{"url": "http://peer.example:8443/", "protocolBinding": "JSONRPC"}]), "another origin"),
    (card(skills="all"), "not a list"),
])
def test_invalid_cards(body: Any, error: str) -> None:
    with pytest.raises(a2a.A2aShapeError, match=error):
        a2a.parse_card(body, BASE)


def test_card_text_is_capped() -> None:
    skills = [{"id": f"s{i}", "name": "n", "description": "word " * 500, "tags": ["t"] * 20} for i in range(100)]
    parsed = a2a.parse_card(card(description="x" * 10_000, skills=skills), BASE)
    assert len(parsed.skills) == a2a.MAX_SKILLS and len(parsed.description) == a2a.MAX_TEXT
    assert all(len(s.description) <= a2a.MAX_TEXT and len(s.tags) <= 8 for s in parsed.skills)


def test_tasks_and_events_of_both_versions() -> None:
    new = a2a.parse_result({"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_INPUT_REQUIRED",
                            "message": {"parts": [{"text": "which file?"}]}}}})
    assert isinstance(new, a2a.Task) and new.interrupted and new.status_parts[0].text == "which file?"
    old = a2a.parse_event({"kind": "status-update", "taskId": "t", "contextId": "c",
                           "status": {"state": "input-required"}, "final": True})
    assert isinstance(old, a2a.StatusUpdate) and old.state == "input_required"
    art = a2a.parse_event({"kind": "artifact-update", "taskId": "t", "contextId": "c",
                           "artifact": {"artifactId": "a", "parts": [{"kind": "file", "file": {"uri": "https://f/x",
                                                                       "name": "x", "mimeType": "text/csv"}}]}})
    assert isinstance(art, a2a.ArtifactUpdate) and art.artifact.parts[0].url == "https://f/x"
    with pytest.raises(a2a.A2aShapeError, match="unknown task state"):
        a2a.parse_task({"id": "t", "status": {"state": "TASK_STATE_EXPLODED"}})
    with pytest.raises(a2a.A2aShapeError, match="has no 'id'"):
        a2a.parse_task({"status": {"state": "TASK_STATE_WORKING"}})
    with pytest.raises(a2a.A2aShapeError, match="neither a task nor a message"):
        a2a.parse_result({"something": 1})


def test_observation_rendering() -> None:
    task = a2a.Task("t", "c", "completed", artifacts=(a2a.Artifact("a", "report", (
        a2a.Part("text", text="hello"), a2a.Part("data", data={"b": 1, "a": [2]}),
        a2a.Part("file", raw_size=300, filename="blob.bin", media_type="application/octet-stream"),
    )),), metadata={"usage": {"prompt_tokens": 5, "total_tokens": 9, "note": "x", "flag": True}})
    assert a2a.render_outcome(task) == (
        "[task t: completed; context_id=c]\n## report\nhello\n{\"a\": [2], \"b\": 1}\n"
        "[file blob.bin (application/octet-stream), 300 bytes inline (not shown); not fetched]"
    )
    assert a2a.reported_usage(task) == {"prompt_tokens": 5, "total_tokens": 9}


def test_messages_per_version() -> None:
    assert a2a.message_json("1.0", "m", "hi", context_id="c") == {
        "messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}], "contextId": "c"}
    assert a2a.message_json("0.3", "m", "hi")["parts"] == [{"kind": "text", "text": "hi"}]
    assert a2a.send_params("0.3", {}, return_immediately=True)["configuration"] == {"blocking": False}
