"""The MCP events a reactive daemon wakes on: ``--on-event SERVER:EVENT`` and the config file's ``on_events:``.

Why it exists: a flag names a subscription (a declared server and an event type); the file can also give the
subscription's ``arguments`` (the server's filters, sent on every ``events/poll``). Both become
:class:`~agentd.config.model.EventSubscriptionConfig` values here; which servers exist is checked with the rest of
the configuration (agentd.config.validate), so every mistake is exit 2 before anything starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from agentd.config.model import EventSubscriptionConfig, McpServerConfig
from agentd.errors import ConfigError

_KEYS = ("server", "event", "arguments", "delivery")
#: What ``on_events[].delivery`` may ask for.
DELIVERIES = ("poll", "push", "webhook")


def parse_flag(value: str) -> EventSubscriptionConfig:
    """``SERVER:EVENT`` (an event name may hold further colons: only the first one splits)."""
    server, sep, event = value.partition(":")
    if not sep or not server.strip() or not event.strip():
        raise ConfigError(f"--on-event {value!r}: expected SERVER:EVENT (SERVER the --mcp name, EVENT an event "
                          "type the server lists in events/list)")
    return EventSubscriptionConfig(server.strip(), event.strip())


def load_section(raw: Any) -> tuple[EventSubscriptionConfig, ...]:
    """``on_events: [{server, event, arguments}]`` (``arguments`` optional, an object)."""
    if not isinstance(raw, list):
        raise ConfigError("on_events must be a list of {server, event, arguments} @ $.on_events")
    out: list[EventSubscriptionConfig] = []
    for index, entry in enumerate(raw):
        where = f"@ $.on_events[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"an on_events entry must be a mapping {where}")
        unknown = sorted(str(k) for k in entry if k not in _KEYS)
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r} {where} (expected {', '.join(_KEYS)})")
        server, event, arguments = entry.get("server"), entry.get("event"), entry.get("arguments", {})
        if not isinstance(server, str) or not server.strip():
            raise ConfigError(f"on_events: 'server' must name a declared MCP server {where}")
        if not isinstance(event, str) or not event.strip():
            raise ConfigError(f"on_events: 'event' must be an event type name {where}")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            raise ConfigError(f"on_events: 'arguments' must be a mapping {where}")
        delivery = entry.get("delivery")
        if delivery is not None and delivery not in DELIVERIES:
            raise ConfigError(f"on_events: 'delivery' must be one of {', '.join(DELIVERIES)} {where}")
        out.append(EventSubscriptionConfig(server.strip(), event.strip(), arguments, delivery))
    return tuple(out)


def merge(from_file: Sequence[EventSubscriptionConfig], flags: Iterable[str]) -> tuple[EventSubscriptionConfig, ...]:
    """The file's subscriptions, then the flags' (a flag naming the same server and event as a file entry is the
    file entry, with its arguments)."""
    merged = list(from_file)
    seen = {(s.server, s.event) for s in merged}
    for value in flags:
        sub = parse_flag(value)
        if (sub.server, sub.event) not in seen:
            merged.append(sub)
            seen.add((sub.server, sub.event))
    return tuple(merged)


def check(subscriptions: Sequence[EventSubscriptionConfig], servers: Iterable[str],
          legacy: Iterable[str] = ()) -> None:
    """Every subscription names a declared server that may speak 2026-07-28 (not in ``legacy``: ``era:
    legacy``), and no subscription is given twice."""
    names = set(servers)
    pinned = set(legacy)
    seen: set[tuple[str, str, str]] = set()
    for sub in subscriptions:
        if sub.server not in names:
            known = ", ".join(sorted(names)) or "none"
            raise ConfigError(f"--on-event {sub.shown!r}: no MCP server named {sub.server!r} is declared "
                              f"(declared: {known})")
        if sub.server in pinned:
            raise ConfigError(f"--on-event {sub.shown!r}: server {sub.server!r} is pinned to the 2025-11-25 protocol "
                              "(era: legacy), and MCP events need 2026-07-28; drop the pin or the subscription")
        key = (sub.server, sub.event, repr(sorted(sub.arguments.items())))
        if key in seen:
            raise ConfigError(f"on_events: {sub.shown!r} is given twice with the same arguments")
        seen.add(key)


def speaking_events(servers: Sequence[McpServerConfig], subscriptions: Sequence[EventSubscriptionConfig]
                    ) -> tuple[McpServerConfig, ...]:
    """``servers`` as the daemon connects them: one that an ``--on-event`` subscription names, with ``era:
    auto``, starts on the 2026-07-28 wire. MCP events exist only there, and ``auto`` sends ``initialize``
    first, so a server that speaks both eras (agentd itself) would settle on 2025-11-25, without events."""
    watched = {sub.server for sub in subscriptions}
    return tuple(attrs.evolve(server, era="modern") if server.name in watched and server.era == "auto" else server
                 for server in servers)
