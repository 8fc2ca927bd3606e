"""Properties of distillation: bounded, marked when cut, and exact for JSON that fits."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from agentd.agent.distill import distill, parse_json_answer

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12_000), st.integers(min_value=20, max_value=9000))
def test_text_results_are_bounded_and_cut_is_partial(text: str, limit: int) -> None:
    d = distill(text, limit=limit)
    assert len(d.value) <= limit
    assert d.partial == (len(text) > limit)
    if not d.partial:
        assert d.value == text


@settings(max_examples=200, deadline=None)
@given(json_values.filter(lambda v: isinstance(v, dict | list)))
def test_json_answers_round_trip_bare_and_fenced(value: object) -> None:
    text = json.dumps(value)
    assert parse_json_answer(text) == (True, value)
    assert parse_json_answer(f"Here you go:\n```json\n{text}\n```") == (True, value)
    assert distill(text, output_contract="anything").value == value
