"""The config-file layer: YAML (safe-loaded) with ``mcp_servers`` and any scalar setting.

::

    mcp_servers:
      - name: fs
        url: https://mcp-fs.internal/mcp
        required: true                       # default
        headers: {Authorization: "Bearer {{secret:FS_TOKEN}}"}
        tls: {ca: certs/ca.pem, cert: certs/client.pem, key: certs/client.key}
        connect_timeout: 10s
        call_timeout: 60s
    max_steps: 20                            # any flag marked "file" in the flag table, snake_case

A host file's keys are accepted too (``version``, ``intelligence: {url, model, key}``, ``connections:``,
``transcript``; agentd.connections.plain, docs/config.md): each connection becomes a server entry with its
tool allowlist, so plain ``agentd --config host.yaml`` runs what ``agentd run`` would.

Unknown keys are errors naming their path (``$.mcp_servers[0].hedaers``). Relative paths (TLS files,
``--serve-*`` files, ``{{secret-file:...}}``) are relative to the config file's directory.

Extending the format: add a loader to :data:`SECTIONS` (``name -> loader(raw, base_dir) -> value``); the
loaded value lands in ``Config.sections[name]``. Loaders raise :class:`ConfigError` (or let cattrs errors
through :func:`structure` to get path-named messages).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, NewType, TypeVar

import attrs
import cattrs
import cattrs.v
import yaml

from agentd.config.argv import FLAGS_BY_DEST, FLAGS_BY_FILE_KEY, Flag
from agentd.config.durations import parse_duration
from agentd.config.model import McpServerConfig, TlsConfig
from agentd.errors import ConfigError

T = TypeVar("T")

#: Extension point: top-level section name -> loader(raw value, config file directory).
SectionLoader = Callable[[Any, str], object]
SECTIONS: Final[dict[str, SectionLoader]] = {}

Duration = NewType("Duration", float)


@attrs.frozen
class _TlsEntry:
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


@attrs.frozen
class _ServerEntry:
    """``mcp_servers[]`` as written; converted to :class:`McpServerConfig` after structuring."""

    name: str
    url: str
    required: bool = True
    headers: dict[str, str] = attrs.field(factory=dict)
    tls: _TlsEntry | None = None
    connect_timeout: Duration = Duration(10.0)
    call_timeout: Duration = Duration(60.0)


class _WrongType(TypeError):
    pass


def _strict(kind: type[T], label: str) -> Callable[[Any, Any], T]:
    def hook(value: Any, _: Any) -> T:
        # YAML's "yes"/1 are not booleans and 8443 is not a name: refuse instead of coercing silently.
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise _WrongType(f"expected {label}, got {type(value).__name__} {_short(value)}")
        return value

    return hook


def _duration(value: Any, _: Any) -> Duration:
    return Duration(parse_duration(value))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_converter = cattrs.Converter(forbid_extra_keys=True)
_converter.register_structure_hook(str, _strict(str, "a string"))
_converter.register_structure_hook(bool, _strict(bool, "true or false"))
_converter.register_structure_hook(Duration, _duration)


def _format(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, _WrongType | ValueError | ConfigError) and str(exc):
        return str(exc)
    return cattrs.v.format_exception(exc, type_)


def structure(raw: Any, type_: type[T], *, path: str) -> T:
    """cattrs structuring with one-line errors naming the JSON path (``... @ $.mcp_servers[1].url``)."""
    try:
        return _converter.structure(raw, type_)
    except Exception as exc:
        messages = cattrs.transform_error(exc, path=path, format_exception=_format)
        raise ConfigError("; ".join(messages)) from None


@attrs.frozen
class FileLayer:
    """What one config file says. ``settings`` are raw YAML values by Config field, converted in ``load``."""

    path: str
    settings: Mapping[str, tuple[Flag, Any]]
    mcp_servers: tuple[McpServerConfig, ...]
    sections: Mapping[str, object]


class _StrictLoader(yaml.SafeLoader):
    """``safe_load`` that refuses a key given twice in one mapping (YAML would silently keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                continue  # unhashable: let the base class report it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


#: A host file's own keys (agentd.connections.plain), accepted here so one host file serves both commands.
HOST_KEYS: Final = ("version", "connections", "transcript")


def load_file(path: str, env: Mapping[str, str] | None = None) -> FileLayer:
    """Read and check one config file (``env``: for the host keys' ``{env: NAME}`` references).

    Raises:
        ConfigError: unreadable or not YAML, not a mapping, an unknown key, or a bad ``mcp_servers`` or
            ``connections`` entry.
    """
    env = os.environ if env is None else env
    try:
        with open(path, encoding="utf-8") as file:
            raw = yaml.load(file, Loader=_StrictLoader)  # a SafeLoader subclass: safe_load semantics
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        detail = f" ({problem})" if isinstance(problem, str) and problem.startswith("duplicate key") else ""
        raise ConfigError(f"--config {path}: not valid YAML{where}{detail}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path}: the top level must be a mapping, got {type(raw).__name__}")
    base_dir = os.path.dirname(os.path.abspath(path))
    settings: dict[str, tuple[Flag, Any]] = {}
    servers: tuple[McpServerConfig, ...] = ()
    connections: tuple[McpServerConfig, ...] = ()
    sections: dict[str, object] = {}
    for key, value in raw.items():
        try:
            if value is None and isinstance(key, str) and (key == "mcp_servers" or key in FLAGS_BY_FILE_KEY):
                continue  # `key:` with nothing after it (everything commented out) means "not set"
            if key == "mcp_servers":
                servers = _load_servers(value, base_dir)
            elif isinstance(key, str) and key in SECTIONS:  # a registered extension wins over a built-in key
                sections[key] = SECTIONS[key](value, base_dir)
            elif key == "telemetry" and isinstance(value, dict):
                # ``telemetry: {otel: true, metrics_addr: ..., log_level: ...}``: the telemetry flags, grouped
                for sub, setting in value.items():
                    flag = FLAGS_BY_FILE_KEY.get(sub) if isinstance(sub, str) else None
                    if flag is None or flag.group != "telemetry":
                        raise ConfigError(f"unknown key {sub!r} @ $.telemetry.{sub}")
                    if setting is not None:
                        settings[flag.dest] = (flag, _rebase_setting(flag, setting, base_dir))
            elif key in HOST_KEYS or (key == "intelligence" and isinstance(value, dict)):
                connections = _host_key(key, value, env, settings) or connections
            elif isinstance(key, str) and key in FLAGS_BY_FILE_KEY:
                flag = FLAGS_BY_FILE_KEY[key]
                settings[flag.dest] = (flag, _rebase_setting(flag, value, base_dir))
            else:
                raise ConfigError(f"unknown key {key!r} @ $.{key}{_suggest(key)}")
        except ConfigError as exc:
            raise ConfigError(f"--config {path}: {exc}") from None
    for index, server in enumerate(servers):
        if any(other.name == server.name for other in connections):
            raise ConfigError(
                f"--config {path}: connection {server.name!r} is declared twice "
                f"($.mcp_servers[{index}] and $.connections.{server.name})"
            )
    return FileLayer(path, settings, (*connections, *servers), sections)


def _host_key(
    key: str, value: Any, env: Mapping[str, str], settings: dict[str, tuple[Flag, Any]]
) -> tuple[McpServerConfig, ...] | None:
    """A host file's key: ``connections`` gives server entries; the others fill settings or are checked."""
    from agentd.connections import plain

    if key == "connections":
        return plain.load_connections(value, env)
    if key == "intelligence":
        for dest, raw in plain.intelligence_settings(value, env).items():
            flag = FLAGS_BY_DEST[dest]
            settings[flag.dest] = (flag, raw)
    elif key == "version":
        plain.check_version(value)
    else:
        plain.check_transcript(value)
    return None


def _suggest(key: object) -> str:
    known = ["mcp_servers", *HOST_KEYS, *SECTIONS, *FLAGS_BY_FILE_KEY]
    close = difflib.get_close_matches(str(key), known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _load_servers(raw: Any, base_dir: str) -> tuple[McpServerConfig, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"expected a list of servers @ $.mcp_servers, got {type(raw).__name__}")
    from agentd.config.validate import check_server

    servers: list[McpServerConfig] = []
    for index, item in enumerate(raw):
        entry = structure(item, _ServerEntry, path=f"$.mcp_servers[{index}]")
        tls = None
        if entry.tls is not None:
            tls = TlsConfig(*(_rebase(p, base_dir) for p in (entry.tls.ca, entry.tls.cert, entry.tls.key)))
        headers = {name: rebase_secret_files(value, base_dir) for name, value in entry.headers.items()}
        server = McpServerConfig(
            name=entry.name,
            url=entry.url,
            required=entry.required,
            headers=headers,
            tls=tls,
            connect_timeout=entry.connect_timeout,
            call_timeout=entry.call_timeout,
        )
        what = f"$.mcp_servers[{index}]"
        check_server(server, what=what)
        if any(other.name == server.name for other in servers):
            raise ConfigError(f"{what}: duplicate server name {server.name!r}")
        servers.append(server)
    return tuple(servers)


def _rebase(path: str | None, base_dir: str) -> str | None:
    if path is None or path == "-":
        return path
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(base_dir, path)


_SECRET_FILE: Final = re.compile(r"(\{\{\s*secret-file\s*:\s*)(.*?)(\s*\}\})")


def rebase_secret_files(template: str, base_dir: str) -> str:
    """Make ``{{secret-file:rel}}`` references relative to ``base_dir`` (the config file's directory)."""
    return _SECRET_FILE.sub(lambda m: f"{m[1]}{_rebase(m[2], base_dir)}{m[3]}" if m[2] else m[0], template)


def _rebase_setting(flag: Flag, value: Any, base_dir: str) -> Any:
    if flag.kind == "path" and isinstance(value, str):
        return _rebase(value, base_dir)
    if flag.kind == "secret" and isinstance(value, str):
        return rebase_secret_files(value, base_dir)
    return value
