"""Secret references: ``{{secret:NAME}}`` (an environment variable) and ``{{secret-file:PATH}}`` (a file).

Configuration holds references, never values. A reference is resolved at connect time, by the component
that needs the value, through one :class:`SecretResolver`; each value it produces is registered with the
:class:`~agentd.telemetry.events.Redactor` so no event line can carry it. Errors name the reference (``NAME`` or
``PATH``), never a value.

A literal credential where a reference belongs (``Authorization: Bearer eyJ...`` in a header, a token on the
command line) is refused at start-up: see :func:`looks_like_inline_credential`.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, Protocol

import attrs

from agentd import defaults
from agentd.deferred.patterns import Pattern
from agentd.errors import ConfigError

if TYPE_CHECKING:
    from agentd.telemetry.events import Redactor

#: One reference. NAME is an environment variable name; PATH is any path without ``}}``.
_REF: Final = re.compile(r"\{\{\s*(?P<kind>secret|secret-file)\s*:\s*(?P<arg>.*?)\s*\}\}")
_ENV_NAME: Final = Pattern(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Anything that looks like it was meant to be a reference but is not well formed.
_ALMOST_REF: Final = Pattern(r"\{\{|\}\}")


def _read_secret_file(path: str) -> str:
    """A secret file's text: a regular file (opened without blocking, so a FIFO is refused instead of waited on:
    references are resolved on the event loop), at most :data:`~agentd.defaults.SECRET_FILE_MAX_BYTES`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = file.read(defaults.SECRET_FILE_MAX_BYTES + 1)
    if len(data) > defaults.SECRET_FILE_MAX_BYTES:
        raise OSError(errno.EFBIG, f"larger than {defaults.SECRET_FILE_MAX_BYTES} bytes")
    return data.decode("utf-8")


class SecretError(ConfigError):
    """A reference that is malformed or cannot be resolved. The message names the reference only."""


@attrs.frozen
class SecretRef:
    """One ``{{secret:NAME}}`` (``kind="env"``) or ``{{secret-file:PATH}}`` (``kind="file"``)."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{{{{secret:{self.name}}}}}" if self.kind == "env" else f"{{{{secret-file:{self.name}}}}}"


def secret_refs(template: str) -> tuple[SecretRef, ...]:
    """Every reference in ``template``, checked for form.

    Raises:
        SecretError: a reference with an empty or invalid name, or stray ``{{``/``}}`` that look like a typo.
    """
    refs: list[SecretRef] = []
    for match in _REF.finditer(template):
        kind, arg = match["kind"], match["arg"]
        if kind == "secret":
            if not _ENV_NAME.match(arg):
                raise SecretError(f"bad secret reference {match[0]!r}: NAME must be an environment variable name")
            refs.append(SecretRef("env", arg))
        else:
            if not arg:
                raise SecretError(f"bad secret reference {match[0]!r}: empty path")
            refs.append(SecretRef("file", arg))
    if _ALMOST_REF.search(_REF.sub("", template)):
        raise SecretError(
            "malformed secret reference: use {{secret:NAME}} or {{secret-file:PATH}} "
            f"(found stray braces in a value of length {len(template)})"
        )
    return tuple(refs)


def referenced_env_names(template: str) -> frozenset[str]:
    """The ``NAME`` of every well-formed ``{{secret:NAME}}`` in ``template`` (any spacing the resolver accepts).

    This is the one place that decides which environment secrets a template needs: the supervisor hands a
    child exactly these values. Unlike :func:`secret_refs` it never raises, so it can be run over any text
    of a configuration (an instruction may hold braces); a malformed reference names nothing here and is
    reported by validation or at resolution.
    """
    return frozenset(
        match["arg"] for match in _REF.finditer(template)
        if match["kind"] == "secret" and _ENV_NAME.match(match["arg"])
    )


def has_secret_ref(template: str) -> bool:
    """True when ``template`` holds at least one ``{{secret:...}}``/``{{secret-file:...}}``."""
    return _REF.search(template) is not None


def check_refs_available(template: str, env: Mapping[str, str]) -> None:
    """Check that every reference in ``template`` could be resolved, without reading any value.

    ``{{secret:NAME}}`` needs ``NAME`` in ``env``; ``{{secret-file:PATH}}`` needs a readable regular file.
    This is what start-up validation and ``--validate-config`` do: a missing secret is exit 2 before any
    connection is attempted, yet no secret value is read into memory by validation.
    """
    for ref in secret_refs(template):
        if ref.kind == "env":
            if ref.name not in env:
                raise SecretError(f"secret {ref} is not set (environment variable {ref.name} is missing)")
        elif not (os.path.isfile(ref.name) and os.access(ref.name, os.R_OK)):
            raise SecretError(f"secret file {ref} does not exist or is not readable")


# --- inline credentials --------------------------------------------------------------------------------

_AUTH_SCHEME: Final = Pattern(r"^(bearer|basic|token|apikey|api-key|digest)\s+(?P<cred>\S+)$", re.IGNORECASE)
_KNOWN_PREFIX: Final = Pattern(
    r"^(sk-|sk_|pk_live_|rk_live_|ghp_|gho_|ghs_|ghu_|github_pat_|glpat-|xox[abpr]-|AKIA|ASIA|AIza|eyJ)"
)
_TOKENISH: Final = Pattern(r"^[A-Za-z0-9_\-+/=.~:]+$")


def _entropy_bits_per_char(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _token_like(text: str) -> bool:
    if _KNOWN_PREFIX.match(text) and len(text) >= 12:
        return True
    if len(text) < 20 or not _TOKENISH.match(text):
        return False
    classes = sum(bool(re.search(p, text)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]"))
    return classes >= 2 and _entropy_bits_per_char(text) >= 3.0


_UUID: Final = Pattern(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
#: Header names whose value is a credential whatever it looks like.
_CREDENTIAL_NAME: Final = Pattern(
    r"(authorization|authentication|(^|[-_])auth([-_]|$)|token|secret|passw|api[-_]?key|(^|[-_])key$|cookie)",
    re.IGNORECASE,
)


def looks_like_inline_credential(value: str, *, name: str | None = None) -> bool:
    """True when ``value`` looks like a credential written inline instead of referenced.

    Catches ``Bearer <token>``/``Basic <b64>``-style values, well-known key prefixes (``sk-``, ``ghp_``,
    ``AKIA``, JWTs ...) and long high-entropy token strings. When the header ``name`` is credential-like
    (``Authorization``, ``X-Api-Key``, ``*-Token``, ``Cookie`` ...) any literal of 8+ characters counts, so a
    low-entropy password is caught too; under other names a UUID is taken for an identifier (a tenant or
    request id), not a credential. A value holding a secret reference (``Bearer {{secret:TOKEN}}``) is never
    inline. Ordinary text (``application/json``, ``en-US``, a sentence) is not credential-like.
    """
    if has_secret_ref(value):
        return False
    value = value.strip()
    scheme = _AUTH_SCHEME.match(value)
    if scheme is not None:
        return len(scheme["cred"]) >= 8
    if name is not None and _CREDENTIAL_NAME.search(name):
        return len(value) >= 8
    if _UUID.match(value):
        return False
    return _token_like(value)


# --- resolution ----------------------------------------------------------------------------------------


class TemplateResolver(Protocol):
    """What a connecting component needs: expand the references in one template. :class:`SecretResolver`
    is the standard implementation; a host can plug in its own (a vault, a per-tenant store)."""

    def resolve(self, template: str) -> str: ...


class SecretResolver:
    """Expands references at the moment a value is needed, registering each value with the redactor.

    ``env`` defaults to the live process environment; any mapping works, so a secret store can stand
    behind ``{{secret:NAME}}``. ``redactor`` defaults to none (library use). The resolver caches nothing:
    a rotated file or variable is picked up at the next connect.
    """

    def __init__(self, env: Mapping[str, str] | None = None, redactor: Redactor | None = None) -> None:
        self._env = os.environ if env is None else env
        self._redactor = redactor

    def resolve(self, template: str) -> str:
        """``template`` with every reference replaced by its value.

        Raises:
            SecretError: a reference is malformed, its variable is unset, or its file cannot be read.
        """
        secret_refs(template)  # form check first, so a typo is reported as such
        return _REF.sub(self._value_of, template)

    def resolve_headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """Resolve every header value; names are never secret."""
        return {name: self.resolve(value) for name, value in headers.items()}

    def _value_of(self, match: re.Match[str]) -> str:
        kind, arg = match["kind"], match["arg"]
        if kind == "secret":
            try:
                value = self._env[arg]
            except KeyError:
                raise SecretError(f"secret {{{{secret:{arg}}}}} is not set (environment variable {arg} is missing)")
        else:
            try:
                value = _read_secret_file(arg)
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
                raise SecretError(f"secret file {{{{secret-file:{arg}}}}} cannot be read: {reason}") from None
            value = value.removesuffix("\n").removesuffix("\r")
        if any(c in value for c in "\r\n"):
            # A value with a line break would allow header injection; never send it.
            raise SecretError(f"secret {match[0]} contains a line break")
        if self._redactor is not None:
            self._redactor.add(value)
        return value
