"""Distillation: bounded results, JSON answers under an output contract."""

from __future__ import annotations

import json

from agentd.agent.distill import MAX_RESULT_CHARS, contract_instruction, distill, parse_json_answer


def test_plain_text_is_the_result() -> None:
    d = distill("the answer is 42")
    assert (d.value, d.partial, d.parsed) == ("the answer is 42", False, True)


def test_long_text_is_cut_and_partial() -> None:
    d = distill("x" * (MAX_RESULT_CHARS + 500))
    assert d.partial
    assert len(d.value) == MAX_RESULT_CHARS
    assert d.value.endswith("[truncated]")


def test_contract_parses_bare_fenced_and_embedded_json() -> None:
    assert distill('{"a": 1}', output_contract="an object").value == {"a": 1}
    assert distill('Here:\n```json\n{"a": [1, 2]}\n```\n', output_contract="x").value == {"a": [1, 2]}
    assert distill('Sure! The result is {"ok": true} as asked.', output_contract="x").value == {"ok": True}
    assert distill("[1, 2, 3]", output_contract="x").value == [1, 2, 3]


def test_contract_without_json_keeps_text_unparsed() -> None:
    d = distill("I could not do it", output_contract="an object")
    assert (d.value, d.parsed, d.partial) == ("I could not do it", False, False)


def test_oversized_json_is_cut_to_a_partial_string() -> None:
    big = {"items": ["y" * 100] * 200}
    d = distill(json.dumps(big), output_contract="x")
    assert d.partial and isinstance(d.value, str) and len(d.value) == MAX_RESULT_CHARS


def test_no_final_text() -> None:
    assert distill(None).value is None


def test_parse_json_answer_rejects_prose() -> None:
    assert parse_json_answer("no json here { not closed") == (False, None)


def test_contract_instruction_quotes_the_contract() -> None:
    text = contract_instruction('{"summary": string}')
    assert '{"summary": string}' in text and "JSON" in text
