"""Who is calling the served listener, and what of the served state is theirs: the one ownership rule.

Why one module: the self-MCP (agentd.selfmcp.surface), the served A2A endpoint (agentd.selfmcp.a2a), the
legacy sessions (agentd.transport.asgi_server) and ``/events`` all answer the same question -- may this
caller see that handle, task, session or event line? -- and must answer it the same way.

A :class:`Principal` is decided per request from what the listener authenticated:

- an OAuth access token (``--serve-oauth-issuer``): the issuer and the token's ``sub`` (else its
  ``client_id``/``azp``, else the token itself); with ``--serve-oauth-operator-scope SCOPE`` a token carrying
  that scope is an *operator*, who sees every principal's handles and event lines;
- the static ``--serve-bearer``, mTLS, or a loopback listener without credentials: the listener has one
  principal (every holder of the one credential, every certificate of the one CA, is the same trusted
  party), :data:`LOCAL`, which is an operator. Beside OAuth the static bearer is the operator's key.

Everything served belongs to the principal that created it (:attr:`Principal.key`, journaled with a served
handle so it survives a restart). For any other, non-operator principal it does not exist: the answers are
exactly those for a handle never issued. :class:`Owners` is the shared registry of served handles' owners,
which ``/events`` consults to show a principal only the lines of its own runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

import attrs

#: The owner key of the listener's single principal (and of handles journaled before owners were kept).
LOCAL_KEY: Final = ""


@attrs.frozen
class Principal:
    """One caller. ``key`` owns what it creates; ``operator`` sees what every principal owns."""

    key: str
    operator: bool = False

    def owns(self, owner: str) -> bool:
        """The ownership rule: a principal sees what it created; an operator sees everything."""
        return self.operator or owner == self.key

    @property
    def bounded(self) -> bool:
        """Counted against per-principal limits (sessions, listen streams): every principal but the
        listener's single one, which is every client of a single-principal listener at once."""
        return self.key != LOCAL_KEY


#: The principal of a listener without OAuth (static bearer, mTLS, unauthenticated loopback).
LOCAL: Final = Principal(LOCAL_KEY, operator=True)


def oauth_principal(issuer: str, subject: str | None, client_id: str | None, scopes: frozenset[str],
                    token: str, operator_scope: str | None) -> Principal:
    """An accepted access token's principal: issuer + ``sub`` (a token without one: its client, else itself)."""
    if subject:
        who = "sub " + subject
    elif client_id:
        who = "client " + client_id
    else:
        who = "token " + hashlib.sha256(token.encode()).hexdigest()[:32]
    return Principal(f"oauth {issuer} {who}", operator=operator_scope is not None and operator_scope in scopes)


class Owners:
    """Served handle -> owner key, for the handles the surface and the A2A endpoint track right now."""

    __slots__ = ("_owner",)

    def __init__(self) -> None:
        self._owner: dict[str, str] = {}

    def claim(self, handle: str, owner: str) -> None:
        self._owner[handle] = owner

    def forget(self, handle: str) -> None:
        self._owner.pop(handle, None)

    def claims(self, owner: str) -> Claims:
        """A recorder of the handles one spawn is admitted under (the supervisor's ``on_admitted``): each is
        ``owner``'s from the moment it is minted, before the child logs its first line."""
        return Claims(self, owner)

    def owner_of(self, handle: str) -> str | None:
        return self._owner.get(handle)

    def visible(self, principal: Principal, handle: str) -> bool:
        owner = self._owner.get(handle)
        return owner is not None and principal.owns(owner)

    def sees_line(self, principal: Principal, line: Mapping[str, Any]) -> bool:
        """Whether an ``/events`` line is this principal's: a line of one of its runs (the node path in
        ``agent_path``, or a ``tree.node``'s ``handle``, under a handle it owns). Lines of the daemon itself
        and of runs no principal owns are an operator's only."""
        if principal.operator:
            return True
        path = line.get("handle") if line.get("event") == "tree.node" else line.get("agent_path")
        owner = self.owner_of_path(path) if isinstance(path, str) else None
        return owner is not None and principal.owns(owner)

    def owner_of_path(self, path: str | None) -> str | None:
        """The owner of the served handle a node path (``1.2.3``) is under, or None (no tracked handle: the
        daemon's own runs, or a handle no longer tracked)."""
        if not path:
            return None
        parts = path.split(".")
        for end in range(1, len(parts) + 1):
            owner = self._owner.get(".".join(parts[:end]))
            if owner is not None:
                return owner
        return None


class Claims:
    """The handles one spawn was admitted under, claimed for ``owner`` as they are minted."""

    __slots__ = ("handles", "owner", "owners")

    def __init__(self, owners: Owners, owner: str) -> None:
        self.owners, self.owner = owners, owner
        self.handles: list[str] = []

    def __call__(self, handle: str) -> None:
        self.handles.append(handle)
        self.owners.claim(handle, self.owner)

    def release(self) -> None:
        """The spawn was refused after its admission (no process): its handles are nobody's."""
        for handle in self.handles:
            self.owners.forget(handle)


__all__ = ["LOCAL", "LOCAL_KEY", "Claims", "Owners", "Principal", "oauth_principal"]
