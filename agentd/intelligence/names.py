"""Tool names between agentd and the gateway: ``(server, tool)`` <-> ``^[a-zA-Z0-9_-]{1,64}$``.

MCP tool names may hold dots, slashes or non-ASCII and be long; gateways accept only the alphabet above.
A server tool is offered as ``<server>__<tool>``, a control tool (``resource.read``) as its own name, each
with invalid characters replaced by ``_``. That candidate is used as is when it is unambiguous: it fits in
64 characters and no other entry of the map produces the same candidate, or this entry is the only one
whose candidate needed no replacement. Every other entry gets a stable suffix, ``-`` and the first hex
digits of a SHA-256 of its exact identity, after its candidate is cut to fit.

So the mapping is injective and exact on the way back, and the name of an entry depends only on the *set*
of entries (never on their order): the same catalogue always produces the same names.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Final

from agentd.formats.tool_separator import SEPARATOR

MAX_LEN: Final = 64
WIRE_NAME: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_INVALID: Final = re.compile(r"[^a-zA-Z0-9_-]")

Key = tuple[str | None, str]


def _candidate(key: Key) -> str:
    server, tool = key
    raw = tool if server is None else f"{server}{SEPARATOR}{tool}"
    return _INVALID.sub("_", raw)


def _is_clean(key: Key) -> bool:
    server, tool = key
    raw = tool if server is None else f"{server}{SEPARATOR}{tool}"
    return _INVALID.sub("_", raw) == raw


def _digest(key: Key) -> str:
    server, tool = key
    identity = f"\x01{tool}" if server is None else f"\x00{server}\x00{tool}"
    return hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()


def _suffixed(key: Key, digits: int) -> str:
    suffix = "-" + _digest(key)[:digits]
    return _candidate(key)[: MAX_LEN - len(suffix)] + suffix


class ToolNameMap:
    """An injective map between ``(server, tool)`` keys (``server=None`` for control tools) and wire names."""

    def __init__(self, keys: Iterable[Key] = ()) -> None:
        unique = sorted(set(keys), key=lambda k: (k[0] is not None, k[0] or "", k[1]))
        groups: dict[str, list[Key]] = {}
        for key in unique:
            groups.setdefault(_candidate(key), []).append(key)
        plain: dict[Key, str] = {}
        for candidate, members in groups.items():
            clean = [key for key in members if _is_clean(key)]
            if 1 <= len(candidate) <= MAX_LEN and (len(members) == 1 or len(clean) == 1):
                keeper = members[0] if len(members) == 1 else clean[0]
                plain[keeper] = candidate
        self._to_wire: dict[Key, str] = {}
        taken = set(plain.values())
        for key in unique:
            if key in plain:
                self._to_wire[key] = plain[key]
                continue
            # A suffixed name equal to a plain one (or another suffixed one) needs a longer digest;
            # with 8 hex digits that is astronomically rare, but injectivity must not rest on luck.
            for digits in (8, 16, 32, 56):
                name = _suffixed(key, digits)
                if name not in taken:
                    break
            else:  # pragma: no cover - a SHA-256 prefix collision at 56 hex digits
                raise ValueError(f"cannot give tool {key!r} a unique wire name")
            taken.add(name)
            self._to_wire[key] = name
        self._from_wire: dict[str, Key] = {name: key for key, name in self._to_wire.items()}

    @classmethod
    def build(cls, keys: Iterable[Key]) -> ToolNameMap:
        return cls(keys)

    def to_wire(self, server: str | None, tool: str) -> str:
        """The wire name of a known tool; ``KeyError`` if the map was not built with it."""
        return self._to_wire[(server, tool)]

    def from_wire(self, name: str) -> tuple[str | None, str] | None:
        """The ``(server, tool)`` a wire name stands for, or ``None`` for a name the map never issued."""
        return self._from_wire.get(name)

    def __contains__(self, key: object) -> bool:
        return key in self._to_wire

    def __len__(self) -> int:
        return len(self._to_wire)

    def items(self) -> list[tuple[Key, str]]:
        return list(self._to_wire.items())
