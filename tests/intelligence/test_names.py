"""ToolNameMap: injective, exact round trip, gateway alphabet, order-independent, readable when it can be."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from agentd.intelligence.names import WIRE_NAME, ToolNameMap

names = st.text(min_size=0, max_size=80)
tame = st.text(alphabet="abcxyz._-/", min_size=0, max_size=70)
keys = st.tuples(st.one_of(st.none(), names, tame), st.one_of(names, tame))


@settings(max_examples=300, deadline=None)
@given(st.lists(keys, max_size=30))
def test_injective_round_trip_and_alphabet(entries: list[tuple[str | None, str]]) -> None:
    mapping = ToolNameMap(entries)
    wire = {key: mapping.to_wire(*key) for key in entries}
    assert len(set(wire.values())) == len(set(entries))
    for key, name in wire.items():
        assert WIRE_NAME.match(name), name
        assert mapping.from_wire(name) == key


@settings(max_examples=150, deadline=None)
@given(st.lists(keys, max_size=20), st.randoms(use_true_random=False))
def test_names_depend_on_the_set_not_the_order(
    entries: list[tuple[str | None, str]], rnd: random.Random
) -> None:
    shuffled = list(entries)
    rnd.shuffle(shuffled)
    assert dict(ToolNameMap(entries).items()) == dict(ToolNameMap(shuffled).items())


def test_readable_names_stay_readable() -> None:
    mapping = ToolNameMap(
        [("files", "read_file"), (None, "resource.read"), (None, "subagent.spawn"), ("gh", "x")]
    )
    assert mapping.to_wire("files", "read_file") == "files__read_file"
    assert mapping.to_wire(None, "resource.read") == "resource_read"
    assert mapping.to_wire(None, "subagent.spawn") == "subagent_spawn"
    assert mapping.from_wire("resource_read") == (None, "resource.read")
    assert mapping.from_wire("nope") is None


def test_clashes_get_a_stable_hash_suffix() -> None:
    entries = [("s", "a.b"), ("s", "a_b"), ("s", "a/b")]
    mapping = ToolNameMap(entries)
    assert mapping.to_wire("s", "a_b") == "s__a_b"  # the exact name wins the plain spelling
    dotted, slashed = mapping.to_wire("s", "a.b"), mapping.to_wire("s", "a/b")
    assert dotted.startswith("s__a_b-") and slashed.startswith("s__a_b-") and dotted != slashed
    assert ToolNameMap(reversed(entries)).to_wire("s", "a.b") == dotted
    # A server name holding the separator cannot make two keys share a name.
    twins = ToolNameMap([("a__b", "c"), ("a", "b__c")])
    assert twins.to_wire("a__b", "c") != twins.to_wire("a", "b__c")


def test_long_names_are_cut_with_a_suffix() -> None:
    long_tool = "x" * 100
    mapping = ToolNameMap([("server", long_tool), ("server", long_tool + "y")])
    first, second = mapping.to_wire("server", long_tool), mapping.to_wire("server", long_tool + "y")
    assert len(first) == len(second) == 64
    assert first != second
    assert first.startswith("server__xxx")
    assert mapping.from_wire(first) == ("server", long_tool)
    exact = "s__" + "y" * 61
    assert ToolNameMap([("s", "y" * 61)]).to_wire("s", "y" * 61) == exact
