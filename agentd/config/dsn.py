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

import attrs

from agentd.errors import ConfigError
from agentd.security.secrets import SecretResolver, has_secret_ref
from agentd.telemetry.events import Redactor

#: libpq quotes the token it stumbled on; that token may be a password, so it is never repeated.
_QUOTED = re.compile(r'"[^"]*"')
_LITERAL_PASSWORD = ("the DSN holds a literal password; give it as PGPASSWORD, in ~/.pgpass, "
                     "or as {{secret:NAME}} in the password position")


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


def _params(text: str, where: str) -> dict[str, str]:
    """libpq's own reading of both DSN forms (URL and ``key=value``), through psycopg's public
    :func:`psycopg.conninfo.conninfo_to_dict` (the ``[cluster]`` extra; only a ``--cluster`` run gets here)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(text)
    except psycopg.Error as exc:
        reason = _QUOTED.sub('"…"', str(exc).strip().splitlines()[0] if str(exc).strip() else "")
        raise ConfigError(f"{where}: not a PostgreSQL DSN (postgresql://USER@HOST:PORT/DATABASE or key=value "
                          f"pairs): {reason or 'libpq cannot read it'}") from None
    return {key: str(value) for key, value in params.items() if value is not None}


def parse(text: str, *, where: str = "--cluster") -> Dsn:
    """Validate ``text``; a literal password is refused (without echoing it)."""
    text = text.strip()
    if not text:
        raise ConfigError(f"{where}: empty DSN")
    params = _params(text, where)
    if params.get("password") and not has_secret_ref(params["password"]):
        raise ConfigError(f"{where}: {_LITERAL_PASSWORD}")
    if any("{{" in value for key, value in params.items() if key != "password"):
        # A URL's authority ends at the first "/": postgresql://u:{{secret-file:/run/pg}}@db/x is read with
        # "{{secret-file:" as the port. libpq's reading is the truth, so say how to write it.
        raise ConfigError(f"{where}: a {{{{secret:...}}}} reference is read only in the password position; in a URL "
                          "a path in it must be percent-encoded ({{secret-file:%2Frun%2Fpg}}), or use the "
                          "key=value form: password='{{secret-file:/run/pg}}'")
    if any(not part.isdigit() for part in params.get("port", "").split(",") if part):
        raise ConfigError(f"{where}: the port is not a number (postgresql://USER@HOST:PORT/DATABASE)")
    return Dsn(text, params.get("host", ""), params.get("port", ""), params.get("dbname", ""))


def connect_args(dsn: Dsn, secrets: SecretResolver, env: Mapping[str, str],
                 redactor: Redactor | None = None) -> tuple[str, str | None]:
    """The conninfo to hand to libpq (no password in it) and the password, resolved now (or ``None``: libpq
    looks in its own places, ``~/.pgpass`` or ``PGPASSFILE``). The password is registered with the redactor."""
    from psycopg.conninfo import make_conninfo

    params = _params(dsn.text, "--cluster")
    given = params.pop("password", "")
    password = secrets.resolve(given) if given else None
    if password is None and env.get("PGPASSWORD"):
        password = env["PGPASSWORD"]
    if password and redactor is not None:
        redactor.add(password)
    return make_conninfo("", **params), password
