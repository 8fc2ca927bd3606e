"""The Rule of Two: no run may combine untrusted input, sensitive data and external communication.

An agent that reads attacker-controlled text (``untrusted_input``), can see private data
(``sensitive_data``) and can send data out (``external_comms``) can be steered by a prompt injection into
exfiltrating that data. Each MCP server carries the properties the operator tagged it with (an untagged
server counts as ``untrusted_input``); a set of servers that brings all three is refused unless the
operator says ``--allow-trifecta``. The check is a pure function over ``server -> tags`` so the same code
decides at start-up (agentd.config.validate) and at every spawn over the child's narrowed scope
(agentd.supervisor.caps). A leaf: a subagent's start-up path imports it without loading the config layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import attrs

#: The three properties; a server without tags counts as untrusted_input.
SERVER_TAGS: Final[tuple[str, ...]] = ("untrusted_input", "sensitive_data", "external_comms")


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
