import pytest

from agentd.supervisor.caps import Admission, Caps, Refusal, TokenBucket, TreeLedger, depth_of, is_within


def ledger(**caps):
    return TreeLedger(Caps(**caps), root_scope=frozenset({"fs", "web"}))


def admit_chain(led, depth):
    """Admit 0.1, 0.1.1, ... down to the given depth; returns the deepest handle."""
    handle = "0"
    for _ in range(depth):
        got = led.admit(handle, None, 0.0)
        assert isinstance(got, Admission), got
        handle = got.handle
    return handle


def test_depth_is_minted_from_the_caller_handle():
    led = ledger(spawn_burst=100)
    deepest = admit_chain(led, 3)
    assert deepest == "0.1.1.1" and depth_of(deepest) == 3
    got = led.admit(deepest, None, 0.0)
    assert got == Refusal("spawn refused: max_depth=4 reached at handle 0.1.1.1", cap="max_depth")


def test_the_spec_example_message():
    led = ledger()
    led._live.update({"0.2": frozenset(), "0.2.1": frozenset(), "0.2.1.3": frozenset()})
    assert led.admit("0.2.1.3", None, 0.0).message == "spawn refused: max_depth=4 reached at handle 0.2.1.3"


def test_handles_name_the_tree_path_and_count_per_parent():
    led = ledger()
    assert led.admit("0", None, 0.0).handle == "0.1"
    assert led.admit("0", None, 0.0).handle == "0.2"
    assert led.admit("0.2", None, 0.0).handle == "0.2.1"
    assert led.admit("0", None, 0.0, served=True).handle == "served.1"
    assert led.admit("served.1", None, 0.0).handle == "served.1.1"


def test_unknown_callers_are_refused():
    assert "unknown caller" in ledger().admit("0.7", None, 0.0).message


def test_max_children_counts_live_children_and_frees_on_release():
    led = ledger(max_children=2)
    a, b = led.admit("0", None, 0.0), led.admit("0", None, 0.0)
    refused = led.admit("0", None, 0.0)
    assert refused == Refusal("spawn refused: max_children=2 reached at handle 0", retryable=True,
                             cap="max_children")
    led.release(a.handle)
    assert isinstance(led.admit("0", None, 0.0), Admission)
    assert b.handle in led.live


def test_max_subagents_counts_the_whole_tree_and_release_takes_descendants():
    led = ledger(max_subagents=3)
    child = led.admit("0", None, 0.0).handle
    led.admit(child, None, 0.0)
    led.admit(child, None, 0.0)
    assert led.admit("0", None, 0.0).message == "spawn refused: max_subagents=3 reached at handle 0"
    led.release(child)
    assert led.live == frozenset()


def test_token_ceiling():
    led = ledger(token_ceiling=100)
    assert led.add_tokens(60) is False
    assert led.add_tokens(50) is True
    assert led.admit("0", None, 0.0).message == "spawn refused: token_ceiling=100 reached (the tree used 110 tokens)"


def test_tool_scope_narrows_monotonically():
    led = ledger()
    narrow = led.admit("0", ["fs"], 0.0)
    assert narrow.scope == frozenset({"fs"})
    inherit = led.admit(narrow.handle, None, 0.0)
    assert inherit.scope == frozenset({"fs"})
    widen = led.admit(narrow.handle, ["fs", "web"], 0.0)
    assert widen == Refusal(f"spawn refused: tool_scope names servers outside the scope of handle {narrow.handle}: web",
                           cap="tool_scope")
    assert "nope" in led.admit("0", ["nope"], 0.0).message
    assert led.admit("0", [], 0.0).scope == frozenset()


def test_rate_bucket_burst_then_two_per_second():
    bucket = TokenBucket(burst=8, rate=2.0)
    assert [bucket.take(0.0) for _ in range(8)] == [0.0] * 8
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.25) == pytest.approx(0.25)
    assert bucket.take(0.5) == 0.0
    assert bucket.take(10.0) == 0.0  # refills, but never above the burst
    assert [bucket.take(10.0) for _ in range(8)].count(0.0) == 7


def test_rate_refusal_is_retryable_and_does_not_mint():
    led = ledger(spawn_burst=1, spawn_rate=2.0)
    assert isinstance(led.admit("0", None, 0.0), Admission)
    refused = led.admit("0", None, 0.1)
    assert refused.retryable and refused.retry_after == pytest.approx(0.4)
    assert refused.message.startswith("spawn refused: spawn rate limit (burst 1, 2/s) at handle 0")
    assert led.admit("0", None, 1.0).handle == "0.2"


def test_a_resumed_runs_child_is_readmitted_under_its_handle():
    """A resumed run's async child comes back under the handle the model holds: only the caller's own child,
    only when not live, past the spawn rate (it is not new work), and later handles are minted after it."""
    led = ledger(spawn_burst=1, spawn_rate=0.001)
    led.mint_after("0", 3)  # the resumed run's numbering is past its journaled children
    again = led.admit("0", None, 0.0, handle="0.2")
    assert isinstance(again, Admission) and (again.handle, again.depth) == ("0.2", 1), again
    assert led.admit("0", None, 0.0, handle="0.7").handle == "0.7"  # the bucket is empty: not asked
    for caller, handle in (("0", "0.2"), ("0", "0.1.1"), ("0.2", "0.3"), ("0", "0.x")):
        refused = led.admit(caller, None, 0.0, handle=handle)
        assert isinstance(refused, Refusal) and refused.cap == "caller", (caller, handle, refused)
    led.release("0.7")
    led._bucket = TokenBucket(8, 2.0)
    assert led.admit("0", None, 0.0).handle == "0.8"


def test_draining_refuses_everything():
    led = ledger()
    led.draining = True
    assert "draining" in led.admit("0", None, 0.0).message


def test_is_within_is_by_whole_components():
    assert is_within("0.1.2", "0.1") and is_within("0.1", "0.1")
    assert not is_within("0.12", "0.1")
