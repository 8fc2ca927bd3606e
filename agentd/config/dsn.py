"""The cluster DSN: configured secret-free, resolved at connect time, and shown without any password.

Why: a DSN is the kind of string that ends up in logs, events, error messages and process listings. So the
configured ``--cluster`` value may not carry a literal password; the password comes from the standard
PostgreSQL environment (``PGPASSWORD``, ``PGPASSFILE``/``~/.pgpass``, ``PGSERVICE``...) which libpq reads
itself, or from a ``{{secret:NAME}}`` / ``{{secret-file:PATH}}`` reference in the password position
(``postgresql://agentd:{{secret:PG_PASSWORD}}@db/agentd``), resolved only when connecting and registered
with the log's redactor. :func:`describe` is the only form of a DSN that messages and events carry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

import attrs

from agentd.errors import ConfigError
from agentd.events import Redactor
from agentd.secrets import SecretResolver, has_secret_ref

_SCHEMES = ("postgresql://", "postgres://")
#: ``key=value`` DSN pairs (libpq's other form); values may be single-quoted.
_PAIR = re.compile(r"\s*(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")


@attrs.frozen
class Dsn:
    """A validated, secret-free DSN as configured (``text`` may hold a ``{{secret:...}}`` reference)."""

    text: str
    host: str
    port: str
    database: str

    def __str__(self) -> str:
        return describe_parts(self.host, self.port, self.database)


def describe_parts(host: str, port: str, database: str) -> str:
    return f"{host or 'localhost'}:{port or '5432'}/{database or '(default)'}"


def parse(text: str, *, where: str = "--cluster") -> Dsn:
    """Validate ``text``; a literal password is refused (without echoing it)."""
    text = text.strip()
    if not text:
        raise ConfigError(f"{where}: empty DSN")
    if text.startswith(_SCHEMES):
        try:
            parts = urlsplit(text)
            _ = parts.port
        except ValueError:
            raise ConfigError(f"{where}: not a PostgreSQL URL (postgresql://USER@HOST:PORT/DATABASE)") from None
        password = parts.password
        if password is not None and not has_secret_ref(unquote(password)) and password != "":
            raise ConfigError(f"{where}: the DSN holds a literal password; give it as PGPASSWORD, in ~/.pgpass, "
                              "or as {{secret:NAME}} in the password position")
        netloc = parts.netloc.rpartition("@")[2]
        host, _, port = netloc.rpartition(":") if netloc.count(":") == 1 else (netloc, "", "")
        query = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
        if "password" in query and not has_secret_ref(unquote(query["password"])):
            raise ConfigError(f"{where}: the DSN holds a literal password; give it as PGPASSWORD, in ~/.pgpass, "
                              "or as {{secret:NAME}} in the password position")
        return Dsn(text, unquote(host or query.get("host", "")), port or query.get("port", ""),
                   unquote(parts.path.lstrip("/")) or query.get("dbname", ""))
    pairs = {k: v.strip("'") for k, v in _PAIR.findall(text)}
    if not pairs:
        raise ConfigError(f"{where}: not a PostgreSQL DSN (postgresql://USER@HOST:PORT/DATABASE or key=value pairs)")
    if "password" in pairs and not has_secret_ref(pairs["password"]):
        raise ConfigError(f"{where}: the DSN holds a literal password; give it as PGPASSWORD, in ~/.pgpass, "
                          "or as {{secret:NAME}} in the password position")
    return Dsn(text, pairs.get("host", ""), pairs.get("port", ""), pairs.get("dbname", ""))


def connect_args(dsn: Dsn, secrets: SecretResolver, env: Mapping[str, str],
                 redactor: Redactor | None = None) -> tuple[str, str | None]:
    """The conninfo to hand to libpq (no password in it) and the password, resolved now (or ``None``: libpq
    looks in its own places, ``~/.pgpass`` or ``PGPASSFILE``). The password is registered with the redactor."""
    text, password = dsn.text, None
    if text.startswith(_SCHEMES):
        parts = urlsplit(text)
        userinfo, _, hostpart = parts.netloc.rpartition("@")
        user, _, secret = userinfo.partition(":")
        if secret:
            password = secrets.resolve(unquote(secret))
        query = [p for p in parts.query.split("&") if p and not p.startswith("password=")]
        found = [p.split("=", 1)[1] for p in parts.query.split("&") if p.startswith("password=")]
        if found and password is None:
            password = secrets.resolve(unquote(found[0]))
        netloc = f"{user}@{hostpart}" if userinfo else hostpart
        text = urlunsplit((parts.scheme, netloc, parts.path, "&".join(query), parts.fragment))
    else:
        pairs = _PAIR.findall(text)
        kept = [f"{k}={v}" for k, v in pairs if k != "password"]
        given: str | None = next((str(v).strip("'") for k, v in pairs if k == "password"), None)
        if given is not None:
            password = secrets.resolve(given)
        text = " ".join(kept)
    if password is None and env.get("PGPASSWORD"):
        password = env["PGPASSWORD"]
    if password and redactor is not None:
        redactor.add(password)
    return text, password
