"""What a cut model call counts (agentd.intelligence.tally): the usage the stream reported, else an estimate of
the request and of what was streamed, marked; nothing for a call the gateway never began to answer."""

from __future__ import annotations

from agentd.intelligence.tally import CallTally, CutUsage, current_tally, tallying
from agentd.intelligence.wire import StreamAssembler, Usage


def _chunk(**delta: object) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def test_a_call_cut_before_the_gateway_answered_counts_nothing() -> None:
    tally = CallTally()
    assert tally.cut() == CutUsage()
    tally.attempt(4000)
    assert tally.cut() == CutUsage()


def test_a_cut_stream_without_usage_is_estimated_from_the_request_and_the_streamed_text() -> None:
    tally = CallTally()
    tally.attempt(1001)  # 251 tokens at 4 characters a token, rounded up
    assembler = StreamAssembler()
    tally.began(assembler)
    assembler.feed(_chunk(role="assistant", content=""))
    assembler.feed(_chunk(content="x" * 30))
    assembler.feed(_chunk(tool_calls=[{"index": 0, "id": "c1", "function": {"name": "abcd", "arguments": "{\"a\""}}]))
    cut = tally.cut()
    assert cut == CutUsage(251, 10, estimated=True)  # 30 + 4 + 4 characters
    assert cut.usage() == Usage(251, 10, 261)


def test_a_cut_stream_counts_the_usage_the_gateway_had_sent() -> None:
    tally = CallTally()
    tally.attempt(1001)
    assembler = StreamAssembler()
    tally.began(assembler)
    assembler.feed({"choices": [], "usage": {"prompt_tokens": 70, "completion_tokens": 3}})
    assembler.feed(_chunk(content="y" * 400))
    assert tally.cut() == CutUsage(70, 3)
    assert tally.cut().usage().estimated_tokens == 0


def test_a_retry_starts_afresh_and_a_plain_reply_counts_its_request() -> None:
    tally = CallTally()
    tally.attempt(10)
    tally.began(StreamAssembler())
    tally.attempt(400)  # the first attempt failed: its reply was never given
    assert tally.cut() == CutUsage()
    tally.began()  # a JSON reply whose body was not read yet
    assert tally.cut() == CutUsage(100, 0, estimated=True)


def test_the_tally_is_found_only_inside_its_block() -> None:
    tally = CallTally()
    assert current_tally() is None
    with tallying(tally):
        assert current_tally() is tally
    assert current_tally() is None
