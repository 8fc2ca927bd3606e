import json
import struct

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentd.supervisor.framing import MAX_FRAME, FrameDecoder, FrameError, encode_frame
from agentd.supervisor.messages import (
    Admit,
    Cancel,
    MessageError,
    MetricsDelta,
    Ping,
    Result,
    RunPayload,
    Spawn,
    Usage,
    from_frame,
    to_frame,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=5), max_size=5), st.integers(1, 7))
def test_frames_roundtrip_whatever_the_chunking(objs, chunk):
    data = b"".join(encode_frame(o) for o in objs)
    decoder = FrameDecoder()
    out = []
    for i in range(0, len(data), chunk):
        decoder.feed(data[i : i + chunk])
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    decoder.close()
    assert out == objs


def test_header_is_big_endian_length():
    frame = encode_frame({"a": 1})
    assert frame[:4] == struct.pack(">I", len(frame) - 4)
    assert json.loads(frame[4:]) == {"a": 1}


def test_oversized_length_is_refused_before_the_body_arrives():
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">I", MAX_FRAME + 1))
    with pytest.raises(FrameError, match="exceeds"):
        decoder.next_frame()


def test_a_small_cap_applies_to_encoding_too():
    with pytest.raises(FrameError):
        encode_frame({"x": "y" * 100}, max_frame=50)


@pytest.mark.parametrize("body", [b"\xff\xfe", b"{not json", b"[1, 2]", b'"text"'])
def test_garbage_bodies_are_frame_errors(body):
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">I", len(body)) + body)
    with pytest.raises(FrameError):
        decoder.next_frame()


def test_eof_inside_a_frame_is_an_error_and_at_a_boundary_is_not():
    decoder = FrameDecoder()
    decoder.feed(encode_frame({"a": 1})[:-1])
    assert decoder.next_frame() is None
    with pytest.raises(FrameError, match="inside a frame"):
        decoder.close()
    FrameDecoder().close()


def test_messages_roundtrip():
    payload = RunPayload(handle="0.1", depth=1, instruction="do it", secrets={"K": "v"}, tool_scope=["fs"])
    for message in [Spawn(payload), Ping(seq=3), Cancel(reason="x"), Usage(prompt_tokens=1, completion_tokens=2),
                    Result(status="completed", result={"a": [1]}), Admit(ref=1, caller="0.1", tool_scope=None),
                    MetricsDelta(depth=2, observations=[["step", 10, 5], ["tool", "fs", "result"]])]:
        assert from_frame(json.loads(json.dumps(to_frame(message)))) == message


@given(json_values, json_values)
def test_a_frame_is_the_same_json_as_attrs_asdict_makes(config, result):
    # to_frame takes fields as they are (no deep copy): byte for byte what attrs.asdict + json gave.
    payload = RunPayload(handle="0.1", depth=1, instruction="i", context=[result], config={"x": config},
                         supervision={"graces": {"cancel": 1.5}}, test={"steps": [["echo"]]})
    for message in [Spawn(payload), Result(status="completed", result=result), Usage(prompt_tokens=2)]:
        assert encode_frame(to_frame(message)) == encode_frame(to_frame(message, deep=True))
        assert encode_frame(to_frame(message, deep=True)) == encode_frame(
            {"jsonrpc": "2.0", "method": message.METHOD, "params": attrs.asdict(message)})


async def test_a_result_json_cannot_take_as_it_is_goes_out_as_attrs_asdict_converts_it():
    # An attrs value inside a turn's result: JSON refuses it, so the channel falls back to the deep
    # conversion instead of failing the send.
    import trio

    from agentd.supervisor.channel import ControlChannel

    send, receive = trio.testing.memory_stream_one_way_pair()
    sender, receiver = ControlChannel(send, trio.testing.MemoryReceiveStream()), ControlChannel(
        trio.testing.MemorySendStream(), receive)
    message = Result(status="completed", result={"tags": ["b"], "usage": Usage(prompt_tokens=1)})
    await sender.send(message)
    await send.aclose()
    got = await receiver.receive()
    assert got == Result(status="completed", result={"tags": ["b"], "usage": {"prompt_tokens": 1,
                                                                               "completion_tokens": 0,
                                                                               "estimated_tokens": 0,
                                                                               "cost": None}})


def test_payload_repr_hides_secrets():
    payload = RunPayload(handle="0.1", depth=1, instruction="i", secrets={"K": "hunter2-secret"})
    assert "hunter2-secret" not in repr(payload)


@pytest.mark.parametrize("frame", [
    {"method": "nope"},
    {"params": {}},
    {"method": "ping", "params": {"seq": "one"}},
    {"method": "ping", "params": []},
    {"method": "spawn", "params": {"payload": {"handle": "0.1"}}},
    {"method": "result", "params": {}},
    {"method": "metrics", "params": {"depth": "1"}},
    {"method": "metrics", "params": {"depth": 1, "observations": {"step": 1}}},
])
def test_malformed_messages_are_rejected(frame):
    with pytest.raises(MessageError):
        from_frame(frame)
