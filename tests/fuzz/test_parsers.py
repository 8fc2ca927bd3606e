"""The parser fuzz targets under hypothesis, short and deterministic (the CI budget), plus corpus replay.

Every target in :mod:`tests.fuzz.targets` runs on structured inputs (near-valid messages, streams and frames
with mutations) and raw bytes; ``derandomize=True`` makes a run reproducible, and a per-example deadline
turns a hang into a failure. Each file in ``tests/fuzz/corpus/<target>/`` (seeds plus every input the
longer atheris run, ``scripts/fuzz``, found interesting) is replayed as an explicit example, once plainly and
once under ``tracemalloc`` to bound the allocation a bounded input may cause.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.targets import TARGETS, TargetRejected
from tests.ownclock import own_time

CORPUS = Path(__file__).parent / "corpus"
CI = settings(derandomize=True, max_examples=300, deadline=2000, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def run(target: str, data: bytes) -> bool:
    """Run one target; True when the input was accepted, False when refused with the documented error."""
    try:
        TARGETS[target](data)
    except TargetRejected:
        return False
    return True


# -- structured inputs ------------------------------------------------------------------------------------------

SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True)
           | st.text(max_size=12))
JSONISH = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
KEYS = st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error", "code", "message", "data"])


@st.composite
def rpc_objects(draw: st.DrawFn) -> object:
    message: dict[str, object] = {}
    for key in draw(st.lists(KEYS, max_size=6, unique=True)):
        if key == "jsonrpc":
            message[key] = draw(st.sampled_from(["2.0", "2.0", "1.0", 2.0, None]))
        elif key == "error":
            message[key] = draw(st.fixed_dictionaries({"code": st.integers() | st.booleans() | st.text(max_size=3)},
                                                      optional={"message": SCALARS, "data": JSONISH}) | JSONISH)
        elif key == "method":
            message[key] = draw(st.sampled_from(["ping", "tools/call", "initialize", ""]) | st.text(max_size=6)
                                | SCALARS)
        else:
            message[key] = draw(JSONISH)
    return message


@st.composite
def rpc_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.binary(max_size=200))
    obj = draw(rpc_objects())
    if kind == 1:
        obj = [obj, *draw(st.lists(rpc_objects(), max_size=3))]
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    if kind == 3 and text:  # cut or splice: near-valid garbage
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(["", "]", "}", '"', "\\u", "\\ud800\"", "[" * 50, "1e999"])) + text[at:]
    if kind == 4:
        depth = draw(st.integers(1, 5000))
        text = "[" * depth + text + "]" * draw(st.integers(0, depth))
    return text.encode("utf-8", errors="surrogatepass")


SSE_LINES = st.sampled_from([b"data: x", b"data:", b"data", b": comment", b"id: 7", b"id: a\x00b", b"retry: 100",
                             b"retry: x", b"event: e", b"event", b"", b"\xef\xbb\xbf", b"\xff\xfe", b"data: " + b"a" * 600,
                             b": " + b"k" * 700, b"data: {\"jsonrpc\":\"2.0\"}"]) | st.binary(max_size=20)


@st.composite
def sse_streams(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(SSE_LINES, max_size=20))
    ends = draw(st.lists(st.sampled_from([b"\n", b"\r\n", b"\r"]), min_size=len(lines), max_size=len(lines)))
    return bytes([draw(st.integers(0, 255))]) + b"".join(line + end for line, end in zip(lines, ends, strict=True))


@st.composite
def frame_streams(draw: st.DrawFn) -> bytes:
    out = bytearray([draw(st.integers(0, 255))])
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            body = json.dumps(draw(st.dictionaries(st.text(max_size=6), JSONISH, max_size=4))).encode()
        elif kind == 1:
            body = draw(st.binary(max_size=40))
        else:
            body = json.dumps(draw(JSONISH)).encode()
        length = len(body) if kind != 3 else draw(st.integers(0, 2**32 - 1))
        out += struct.pack(">I", length) + body
    if draw(st.booleans()):
        out += draw(st.binary(max_size=8))
    return bytes(out)


PARTS = st.fixed_dictionaries({}, optional={"text": SCALARS, "data": JSONISH, "kind": st.sampled_from(["text", "data", "file"]),
                                          "file": st.fixed_dictionaries({}, optional={"uri": SCALARS, "name": SCALARS})})
A2A_OBJECTS = (
    st.fixed_dictionaries({}, optional={
        "id": SCALARS, "contextId": SCALARS, "kind": st.sampled_from(["task", "message", "status-update"]),
        "status": st.fixed_dictionaries({}, optional={"state": st.sampled_from(["TASK_STATE_COMPLETED", "working",
                                                                                 "failed", "x"]) | SCALARS,
                                                      "message": st.fixed_dictionaries({}, optional={
                                                          "parts": st.lists(PARTS, max_size=3)})}),
        "artifacts": st.lists(st.fixed_dictionaries({}, optional={"parts": st.lists(PARTS, max_size=3),
                                                                   "artifactId": SCALARS}), max_size=2),
        "parts": st.lists(PARTS, max_size=3), "task": JSONISH, "statusUpdate": JSONISH, "artifactUpdate": JSONISH,
        "message": JSONISH, "name": SCALARS, "url": SCALARS,
        "supportedInterfaces": st.lists(st.fixed_dictionaries({}, optional={
            "url": st.sampled_from(["https://peer.example/a2a", "http://x/", "nope"]) | SCALARS,
            "protocolBinding": st.sampled_from(["JSONRPC", "GRPC"]) | SCALARS,
            "protocolVersion": st.sampled_from(["1.0", "0.3", "2"]) | SCALARS}), max_size=2),
    })
    | JSONISH
)

SCHEMAS = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "boolean", "object", "array", 3])},
                          optional={"x-mcp-header": st.text(max_size=8) | st.sampled_from(["Foo\n", "a b", "X"])}),
    lambda inner: st.fixed_dictionaries({}, optional={
        "properties": st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
        "items": inner, "anyOf": st.lists(inner, max_size=2), "$defs": st.dictionaries(st.text(max_size=3), inner,
                                                                                       max_size=2)}),
    max_leaves=8)

INPUTS = {
    "jsonrpc_body": rpc_bodies(),
    "sse_stream": sse_streams() | st.binary(max_size=300),
    "sse_roundtrip": st.binary(max_size=300) | st.text(max_size=100).map(lambda t: t.encode(errors="ignore")),
    "header_rules": st.binary(max_size=100) | st.text(max_size=40).map(lambda t: t.encode(errors="ignore"))
    | SCHEMAS.map(lambda s: json.dumps(s).encode()),
    "frames": frame_streams() | st.binary(max_size=300),
    "ctl_request": st.binary(max_size=200) | st.integers(0, 3000).map(lambda n: b"[" * n)
    | st.fixed_dictionaries({"op": SCALARS}, optional={"run": JSONISH, "on": JSONISH}).map(
        lambda d: json.dumps(d).encode() + b"\n"),
    "a2a_message": st.tuples(st.integers(0, 3), A2A_OBJECTS | st.integers(0, 3000).map(lambda n: [[]] if n < 2 else
                                                                                         "[" * n)).map(
        lambda t: bytes([t[0]]) + (t[1].encode() if isinstance(t[1], str) else json.dumps(t[1]).encode()))
    | st.binary(max_size=300),
}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_target_under_hypothesis(target: str) -> None:
    @CI
    @given(INPUTS[target])
    def check(data: bytes) -> None:
        run(target, data)

    check()


# -- the committed corpus -----------------------------------------------------------------------------------------


def _corpus() -> list[tuple[str, Path]]:
    return [(target, path) for target in sorted(TARGETS) for path in sorted((CORPUS / target).glob("*"))
            if path.is_file()]


def test_every_target_has_a_corpus() -> None:
    for target in TARGETS:
        assert len(list((CORPUS / target).glob("*"))) >= 3, target


@pytest.mark.parametrize(("target", "path"), _corpus(), ids=lambda v: v.name if isinstance(v, Path) else v)
def test_corpus_replays_within_bounds(target: str, path: Path) -> None:
    """Each corpus input passes its target, in bounded time and bounded allocation (a generous constant
    factor of the input's size: what an unbounded or quadratic allocation would break)."""
    data = path.read_bytes()
    started = own_time()  # the thread's own time: what the parse cost, not how busy the machine was
    run(target, data)
    assert own_time() - started < 2.0
    tracemalloc.start()
    try:
        run(target, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 200 * len(data) + 4 * 1024 * 1024, (peak, len(data))
