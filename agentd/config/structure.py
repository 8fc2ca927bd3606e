"""The one strict converter for every agentd file (config, host config, manifest): cattrs with path errors.

YAML keys are as written (``mcp_servers``, ``readTools``, ``connectTimeoutMs``); attrs fields carry the
camelCase ones as aliases. Unknown keys are errors, nothing is coerced (``yes`` is not ``true``, ``8443``
is not a name), and every error names its JSON path (``$.connections.docs.auth.token``,
``$.mcp_servers[1].url``) through cattrs' error transformation. Durations (``10s``, ``250ms``) are
:data:`Duration` fields.

A secret is only ever an environment *reference*, ``{env: NAME}``; the value is read when a connection is
made, through :class:`agentd.security.secrets.SecretResolver` (so it is registered with the redactor), never here.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, NewType, TypeVar

import attrs
import cattrs
import cattrs.v

from agentd.config.durations import parse_duration
from agentd.errors import ConfigError

T = TypeVar("T")

#: A duration as written in a file (``10s``, ``1.5m``, ``250ms`` or a number of seconds), as float seconds.
Duration = NewType("Duration", float)

_ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@attrs.frozen
class EnvRef:
    """``{env: NAME}``: a value taken from the environment when it is needed."""

    env: str

    def template(self) -> str:
        """The ``{{secret:NAME}}`` template the rest of agentd resolves (and redacts)."""
        return f"{{{{secret:{self.env}}}}}"


class FieldError(ValueError):
    """A value of the wrong shape; the message is shown as is, followed by its path."""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _strict(kind: type[T], label: str) -> Callable[[Any, Any], T]:
    def hook(value: Any, _: Any) -> T:
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise FieldError(f"expected {label}, got {type(value).__name__} {_short(value)}")
        return value

    return hook


def env_ref(value: Any, what: str = "a secret") -> EnvRef:
    """Structure ``{env: NAME}``; a literal (string, number) is refused without echoing it."""
    if isinstance(value, Mapping):
        extra = sorted(str(k) for k in value if k != "env")
        if extra:
            raise FieldError(f"an environment reference has only the key 'env' (found {', '.join(extra)})")
        name = value.get("env")
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise FieldError("expected {env: NAME} with NAME an environment variable name")
        return EnvRef(name)
    raise FieldError(
        f"{what} must be an environment reference {{env: NAME}}, not a literal {type(value).__name__} "
        "(literal secrets are not accepted)"
    )


def str_or_env(value: Any, _: Any = None) -> str | EnvRef:
    """A plain value that may also come from the environment (``url: {env: DOCS_URL}``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return env_ref(value, "a value")
    raise FieldError(f"expected a string or {{env: NAME}}, got {type(value).__name__} {_short(value)}")


def _duration(value: Any, _: Any) -> Duration:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise FieldError(f"expected a duration (250ms, 10s, 2m), got {type(value).__name__} {_short(value)}")
    try:
        return Duration(parse_duration(value))
    except (ValueError, ConfigError) as exc:
        raise FieldError(str(exc)) from None


def _non_negative_int(value: Any, _: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise FieldError(f"expected an integer, got {type(value).__name__} {_short(value)}")
    if value < 0:
        raise FieldError(f"expected a non-negative integer, got {value}")
    return value


converter: Final = cattrs.Converter(forbid_extra_keys=True, use_alias=True)
converter.register_structure_hook(str, _strict(str, "a string"))
converter.register_structure_hook(bool, _strict(bool, "true or false"))
converter.register_structure_hook(int, _non_negative_int)
converter.register_structure_hook(Duration, _duration)
converter.register_structure_hook(EnvRef, lambda v, _: env_ref(v))
converter.register_structure_hook(str | EnvRef, str_or_env)


def _format(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, FieldError | ConfigError) and str(exc):
        return str(exc)
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, AttributeError) and re.search(r"has no attribute '(keys|items|get)'", str(exc)):
        # cattrs read a section's keys from something that is not a mapping (``- foo`` where ``foo:`` was meant)
        found = re.match(r"'(\w+)' object", str(exc))
        return f"expected a mapping (key: value lines), got {found[1] if found else 'something else'}"
    if " not in literal " in str(exc):
        allowed = ", ".join(repr(a) for a in typing.get_args(type_))
        return f"expected one of {allowed}, got {str(exc).split(' not in literal ', 1)[0]!r}"
    return cattrs.v.format_exception(exc, type_)


#: attrs field name -> the key as written (``read_tools`` -> ``readTools``), so paths name what the user wrote.
_ALIASES: Final[dict[str, str]] = {}
_SEGMENT: Final = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)(?=[.\[]|$)")


def register_aliases(*classes: type[Any]) -> None:
    for cls in classes:
        for field in attrs.fields(cls):
            if field.alias and field.alias != field.name and not field.name.startswith("_"):
                _ALIASES[field.name] = field.alias


def error_paths(exc: BaseException, path: str) -> list[str]:
    """Every problem in a cattrs error as ``message @ $.path`` (with the keys as written)."""
    lines = cattrs.transform_error(exc, path=path, format_exception=_format)
    out = []
    for line in lines:
        message, sep, where = line.rpartition(" @ ")
        if sep:
            where = _SEGMENT.sub(lambda m: "." + _ALIASES.get(m[1], m[1]), where)
            line = f"{message} @ {where}"
        out.append(line)
    return out


def structure(raw: Any, type_: type[T], *, path: str = "$") -> T:
    """Structure ``raw`` as ``type_``; every problem becomes one ``message @ $.path`` in a ConfigError."""
    try:
        return converter.structure(raw, type_)
    except Exception as exc:
        raise ConfigError("; ".join(error_paths(exc, path))) from None
