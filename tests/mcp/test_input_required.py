"""The sans-io follow-up rule for ``input_required`` results (agentd.mcp.input_required)."""

from __future__ import annotations

from typing import Any

import pytest

from agentd.mcp.client_session import ResultTypeError
from agentd.mcp.input_required import MAX_ROUNDS, STATE_ONLY_DELAY_CAP, FollowUp, follow_up

CALL = {"name": "t", "arguments": {"a": 1}}


@pytest.mark.parametrize("result", [{}, {"resultType": "complete"}, {"content": [], "requestState": "ignored"}])
def test_a_final_result_needs_no_follow_up(result: dict[str, Any]) -> None:
    assert follow_up("tools/call", CALL, result, 0) is None


def test_the_follow_up_answers_every_key_and_echoes_the_state() -> None:
    step = follow_up("tools/call", CALL, {"resultType": "input_required", "requestState": "opaque", "inputRequests": {
        "a": {"method": "elicitation/create", "params": {}}, "b": {"method": "roots/list"}}}, 0)
    assert step == FollowUp({"name": "t", "arguments": {"a": 1}, "requestState": "opaque",
                             "inputResponses": {"a": {"action": "decline"}, "b": {"roots": []}}}, 0.0)


def test_a_later_round_replaces_the_previous_rounds_fields() -> None:
    previous = {**CALL, "inputResponses": {"a": {"action": "decline"}}, "requestState": "old"}
    step = follow_up("prompts/get", previous, {"resultType": "input_required"}, 3)
    assert step is not None and step.params == CALL and 0 < step.delay <= STATE_ONLY_DELAY_CAP


@pytest.mark.parametrize(("method", "result", "match"), [
    ("tools/list", {"resultType": "input_required", "requestState": "s"}, "not an answer to tools/list"),
    ("tools/call", {"resultType": "weird"}, "unknown resultType"),
    ("tools/call", {"resultType": "input_required", "requestState": 7}, "requestState must be a string"),
    ("tools/call", {"resultType": "input_required", "inputRequests": ["x"]}, "inputRequests must be an object"),
    ("tools/call", {"resultType": "input_required", "inputRequests": {"k": {"method": "sampling/createMessage"}}},
     "sampling/createMessage"),
    ("tools/call", {"resultType": "input_required", "inputRequests": {"k": "garbage"}}, "without a method"),
])
def test_results_agentd_cannot_act_on_are_refused(method: str, result: dict[str, Any], match: str) -> None:
    with pytest.raises(ResultTypeError, match=match):
        follow_up(method, CALL, result, 0)


def test_rounds_are_capped() -> None:
    asking = {"resultType": "input_required", "requestState": "s"}
    assert follow_up("resources/read", {"uri": "u"}, asking, MAX_ROUNDS - 1) is not None
    with pytest.raises(ResultTypeError, match="rounds"):
        follow_up("resources/read", {"uri": "u"}, asking, MAX_ROUNDS)
