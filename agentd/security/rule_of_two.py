"""The Rule of Two: no run may combine untrusted input, sensitive data and external communication.

An agent that reads attacker-controlled text (``untrusted_input``), can see private data
(``sensitive_data``) and can send data out (``external_comms``) can be steered by a prompt injection into
exfiltrating that data. Each MCP server carries the properties the operator tagged it with (an untagged
server counts as ``untrusted_input``); an A2A peer (``--a2a-peer``) is another agent, whose answers are
untrusted input and which can carry what it is told anywhere, so an untagged peer counts as ``untrusted_input``
and ``external_comms`` (:func:`peer_tags`; tags override it as for a server). A set of servers and peers that brings all three is refused unless the
operator says ``--allow-trifecta``. The check is a pure function over ``server -> tags`` so the same code
decides at start-up (agentd.config.validate) and at every spawn over the child's narrowed scope
(agentd.supervisor.caps). A leaf: a subagent's start-up path imports it without loading the config layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import attrs

#: The three properties; a server without tags counts as untrusted_input.
SERVER_TAGS: Final[tuple[str, ...]] = ("untrusted_input", "sensitive_data", "external_comms")


#: What an untagged A2A peer brings.
PEER_DEFAULT_TAGS: Final[tuple[str, ...]] = ("untrusted_input", "external_comms")


def peer_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    """An A2A peer's tags as the check reads them: its own, or :data:`PEER_DEFAULT_TAGS` when it has none."""
    return PEER_DEFAULT_TAGS if tags is None else tuple(tags)


def catalogue_tags(servers: Iterable[tuple[str, Sequence[str] | None]],
                   peers: Iterable[tuple[str, Sequence[str] | None]] = ()) -> dict[str, Sequence[str] | None]:
    """``name -> tags`` for :func:`check_trifecta` over MCP servers and A2A peers (names are distinct)."""
    out: dict[str, Sequence[str] | None] = dict(servers)
    out.update((name, peer_tags(tags)) for name, tags in peers)
    return out


def properties_of(tags: Iterable[str] | None) -> frozenset[str]:
    """The properties a server brings: its tags, or ``untrusted_input`` when it has none."""
    return frozenset({"untrusted_input"}) if tags is None else frozenset(tags)


@attrs.frozen
class TrifectaVerdict:
    """Which servers bring each property (sorted names, by property in SERVER_TAGS order)."""

    sources: Mapping[str, tuple[str, ...]]

    @property
    def complete(self) -> bool:
        """All three properties are present: the lethal trifecta."""
        return all(self.sources.get(tag) for tag in SERVER_TAGS)

    def describe(self) -> str:
        return "; ".join(f"{tag}: {', '.join(self.sources.get(tag, ())) or '-'}" for tag in SERVER_TAGS)


def check_trifecta(servers: Mapping[str, Iterable[str] | None]) -> TrifectaVerdict:
    """The verdict for a catalogue made of ``servers`` (name -> tags, None = untagged)."""
    sources: dict[str, list[str]] = {tag: [] for tag in SERVER_TAGS}
    for name, tags in sorted(servers.items()):
        for tag in properties_of(tags):
            if tag in sources:
                sources[tag].append(name)
    return TrifectaVerdict({tag: tuple(names) for tag, names in sources.items()})
