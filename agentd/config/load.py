"""Putting the layers together: defaults < config file < environment < flags, then validation.

Each value is converted where it enters (so an error can name its origin: ``--max-steps``,
``$AGENTD_MAX_STEPS`` or ``agentd.yaml $.max_steps``), then :mod:`agentd.config.validate` checks the whole.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from agentd.config.a2a import merge_peers
from agentd.config.argv import FLAGS_BY_DEST, Command, Flag, parse_flags
from agentd.config.durations import parse_duration
from agentd.config.endpoints import (
    check_intelligence_endpoint,
    merge_declared,
    parse_mcp_flag,
    split_endpoints,
)
from agentd.config.env import read_env
from agentd.config.model import (
    Config,
    McpServerConfig,
    TlsConfig,
    check_approve,
    check_capabilities,
    check_era,
    from_flat,
)
from agentd.config.validate import Purpose, validate
from agentd.errors import ConfigError
from agentd.formats.tool_separator import SEPARATOR
from agentd.prices import Price, parse_price_flag, parse_usd
from agentd.security.secrets import has_secret_ref, secret_refs

if TYPE_CHECKING:
    from agentd.config.file import FileLayer

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})

#: Settings that are two spellings of one thing: a layer may give one of them; a higher layer's choice wins.
_EXCLUSIVE: Final = (("instruction", "instruction_file"), ("intelligence_token", "intelligence_token_file"))

Layer = dict[str, Any]  # dest -> converted value


def default_run_id() -> str:
    """Time plus pid, like the original (sortable, readable in a log), plus a short random tag so two
    Configs built in one process within a second still name different runs."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}-{secrets.token_hex(3)}"


def load_config(argv: Sequence[str], env: Mapping[str, str] | None = None, *, purpose: Purpose = "run") -> Config:
    """Exactly what the CLI does: defaults < ``--config`` file < environment < flags, then validation.

    ``env`` defaults to ``os.environ``. Reads the config file and ``--instruction-file`` but opens no socket
    and starts no process. ``purpose="check"`` validates for ``agentd check`` (servers only). Each source has
    its own parser (argv: agentd.config.argv, the file: agentd.config.file, the environment:
    agentd.config.env); each gives settings by flat name (the flag table's ``dest``), converted here, and
    :func:`agentd.config.model.from_flat` puts them in their groups.

    Raises:
        ConfigError: one line naming the bad value (exit 2).
    """
    env = os.environ if env is None else env
    flags_raw = parse_flags(argv, command="check" if purpose == "check" else "agentd")
    flags_raw.pop("version", None)
    if flags_raw.pop("check_json", False):
        flags_raw["output"] = "json"

    layers: list[Layer] = []
    env_values = read_env(env)
    config_path = flags_raw.get("config_path")
    if config_path is None and "config_path" in env_values:
        config_path = env_values["config_path"].value
    file_layer: FileLayer | None = None
    if config_path is not None:
        from agentd.config.file import load_file  # cattrs and PyYAML only when there is a file

        file_layer = load_file(os.path.expanduser(config_path), env)
        layers.append(
            {
                dest: _convert(flag, raw, f"--config {file_layer.path} $.{flag.file_key}", from_file=True)
                for dest, (flag, raw) in file_layer.settings.items()
            }
        )
    layers.append(
        {
            dest: _convert(item.flag, item.value, f"${item.variable}", env_variable=item.variable)
            for dest, item in env_values.items()
        }
    )
    layers.append(
        {
            dest: _convert(FLAGS_BY_DEST[dest], raw, FLAGS_BY_DEST[dest].name, env=env)
            for dest, raw in flags_raw.items()
        }
    )

    merged: dict[str, Any] = {}
    for layer in layers:
        for group in _EXCLUSIVE:
            given = [dest for dest in group if dest in layer]
            if len(given) > 1:
                names = " and ".join(FLAGS_BY_DEST[d].name for d in given)
                raise ConfigError(f"{names} are mutually exclusive")
            if given:
                for dest in group:
                    merged.pop(dest, None)
        merged.update(layer)

    token_file = merged.pop("intelligence_token_file", None)
    if token_file is not None:
        merged["intelligence_token"] = f"{{{{secret-file:{token_file}}}}}"
    if merged.get("instruction_file") is not None:
        merged["instruction"] = _read_instruction(merged["instruction_file"])

    merged["mcp"] = _apply_approve(_apply_capabilities(_apply_era(_apply_tags(
        merge_declared(file_layer.mcp_servers if file_layer else (), merged.pop("mcp", ()) or (), flag="--mcp",
                       section="mcp_servers", kind="server", parse=parse_mcp_flag, make=lambda name, url: McpServerConfig(name=name, url=url)),
        merged.pop("mcp_tags", ()) or (),
    ), merged.pop("mcp_era", ()) or ()), merged.pop("mcp_capabilities", ()) or ()), merged.pop("approve", ()) or ())
    if file_layer is not None:
        merged["config_path"] = file_layer.path
        if file_layer.egress is not None:
            merged["egress"] = file_layer.egress
    if merged.get("tls_ca") is not None:
        merged["mcp"] = tuple(_with_default_ca(server, merged["tls_ca"]) for server in merged["mcp"])
    # A2A peers: the file's a2a_peers section, then --a2a-peer flags (agentd/config/a2a.py).
    merged["a2a_peers"] = _per_server(merge_peers(
        file_layer.a2a_peers if file_layer else (), merged.pop("a2a_peers", ()) or (), merged.get("tls_ca")
    ), merged.pop("a2a_peer_tags", ()) or (), flag="--a2a-peer-tags", expected="tag,tag", field="tags", parse=_tags,
        kind="A2A peer (declare it with --a2a-peer or a2a_peers)")
    flags_on_events = merged.pop("on_events", ()) or ()
    if flags_on_events or (file_layer is not None and file_layer.on_events):
        from agentd.config.on_events import merge as merge_on_events

        merged["on_events"] = merge_on_events(file_layer.on_events if file_layer else (), flags_on_events)
    merged["prices"] = _prices(file_layer.prices if file_layer else {}, merged.pop("prices", ()) or ())
    if merged.get("models"):
        merged["models"] = tuple(dict.fromkeys(name.strip() for item in merged["models"] for name in item.split(",")
                                               if name.strip()))
    if not merged.get("run_id"):
        merged["run_id"] = default_run_id()
    config = from_flat(merged)
    validate(config, env, purpose=purpose)
    return config


def load_command(argv: Sequence[str], env: Mapping[str, str] | None, command: Command) -> dict[str, Any]:
    """``agentd run`` / ``agentd transcript`` settings through the same flag table as ``agentd``: the
    command's flags (and positionals) from argv over its flags' environment variables, each converted where it
    enters (durations, endpoints, choices), by dest. No config-file layer: ``--config`` names the host file,
    which the command reads itself (agentd.config.host).

    Raises:
        ConfigError: one line naming the flag or variable (exit 2).
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for dest, item in read_env(env).items():
        if command in item.flag.commands:
            values[dest] = _convert(item.flag, item.value, f"${item.variable}", env_variable=item.variable)
    for dest, raw in parse_flags(argv, command=command).items():
        flag = FLAGS_BY_DEST.get(dest)
        values[dest] = raw if flag is None else _convert(flag, raw, flag.name)
    return values


def _prices(table: Mapping[str, Price], flags: Sequence[str]) -> dict[str, Price]:
    """The config file's ``prices:``, then each ``--price MODEL=IN/OUT`` (a flag replaces that model's entry)."""
    prices = dict(table)
    seen: set[str] = set()
    for item in flags:
        model, price = parse_price_flag(item)
        if model in seen:
            raise ConfigError(f"--price: {model!r} given twice")
        seen.add(model)
        prices[model] = price
    return prices


def _read_instruction(path: str) -> str:
    """The instruction file's text; ``-`` reads standard input (``generate-task | agentd --instruction-file -``)."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as file:
                text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise ConfigError(f"--instruction-file {path}: cannot read ({reason})") from None
    if not text.strip():
        raise ConfigError(f"--instruction-file {path}: the file is empty")
    return text


def _per_server(
    servers: tuple[McpServerConfig, ...], flags: Sequence[str], *, flag: str, expected: str, field: str,
    parse: Callable[[str, str], Any], kind: str = "MCP server (declare it with --mcp or mcp_servers)",
) -> tuple[McpServerConfig, ...]:
    """``FLAG name=value`` (once per server) replaces that server's ``field`` (from its config-file entry, if any)."""
    values: dict[str, Any] = {}
    names = {server.name for server in servers}
    for item in flags:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep:
            raise ConfigError(f"{flag}: missing '=' in {item!r} (expected name={expected})")
        if name not in names:
            raise ConfigError(f"{flag} {name}: no such {kind}")
        if name in values:
            raise ConfigError(f"{flag}: {name!r} given twice")
        values[name] = parse(text, name)
    return tuple(attrs.evolve(s, **{field: values[s.name]}) if s.name in values else s for s in servers)


def _apply_tags(servers: tuple[McpServerConfig, ...], flags: Sequence[str]) -> tuple[McpServerConfig, ...]:
    """``--mcp-tags name=tag,tag`` replaces that server's tags."""
    return _per_server(servers, flags, flag="--mcp-tags", expected="tag,tag", field="tags", parse=_tags)


def _tags(text: str, _name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _apply_era(servers: tuple[McpServerConfig, ...], flags: Sequence[str]) -> tuple[McpServerConfig, ...]:
    """``--mcp-era name=auto|legacy|modern`` replaces that server's era."""
    return _per_server(servers, flags, flag="--mcp-era", expected="auto|legacy|modern", field="era",
                       parse=lambda text, name: check_era(text.strip(), f"--mcp-era {name}"))


def _apply_capabilities(servers: tuple[McpServerConfig, ...], flags: Sequence[str]) -> tuple[McpServerConfig, ...]:
    """``--mcp-capabilities name=elicitation,sampling,sampling.tools`` replaces that server's opted-in client capabilities."""
    return _per_server(servers, flags, flag="--mcp-capabilities", expected="elicitation,sampling,sampling.tools",
                       field="capabilities",
                       parse=lambda text, name: check_capabilities(_tags(text, name), f"--mcp-capabilities {name}"))


def _apply_approve(servers: tuple[McpServerConfig, ...], flags: Sequence[str]) -> tuple[McpServerConfig, ...]:
    """``--approve SERVER__TOOL`` adds TOOL to that server's ``approve`` list (the file's entries stay)."""
    added: dict[str, list[str]] = {}
    names = {server.name for server in servers}
    for item in flags:
        server, sep, tool = item.strip().partition(SEPARATOR)
        if not sep or not server or not tool:
            raise ConfigError(f"--approve {item!r}: expected SERVER{SEPARATOR}TOOL (the tool's name as the model "
                              f"sees it, e.g. fs{SEPARATOR}delete_file)")
        if server not in names:
            raise ConfigError(f"--approve {server}: no such MCP server (declare it with --mcp or mcp_servers)")
        added.setdefault(server, []).append(tool)
    return tuple(attrs.evolve(s, approve=check_approve((*s.approve, *added[s.name]), f"--approve {s.name}"))
                 if s.name in added else s for s in servers)


def _with_default_ca(server: McpServerConfig, ca: str) -> McpServerConfig:
    """``--tls-ca`` is every https server's CA unless its config-file entry names its own ``tls.ca``."""
    if not server.url.lower().startswith("https://"):
        return server
    if server.tls is None:
        return attrs.evolve(server, tls=TlsConfig(ca=ca))
    if server.tls.ca is None:
        return attrs.evolve(server, tls=attrs.evolve(server.tls, ca=ca))
    return server


def _convert(
    flag: Flag, value: Any, origin: str, *, from_file: bool = False, env_variable: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Any:
    """One raw value (argv/env string, or a YAML value) into the model's type; errors name ``origin``.

    ``env`` (argv values only) lets a refused literal secret name the variable it was expanded from."""
    try:
        converted = _convert_kind(flag, value, from_file=from_file, env_variable=env_variable, env=env)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    if flag.kind == "endpoints":  # checked here, so the error names the file key or variable the URL came from
        for endpoint in converted:
            check_intelligence_endpoint(endpoint, what=origin)
    return converted


def _convert_kind(flag: Flag, value: Any, *, from_file: bool, env_variable: str | None,
                  env: Mapping[str, str] | None = None) -> Any:
    kind = flag.kind
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and not from_file and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"expected true or false, got {value!r}")
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and not from_file:
            try:
                number = int(value.strip().replace("_", ""))
            except ValueError:
                raise ConfigError(f"expected a whole number, got {value!r}") from None
        else:
            raise ConfigError(f"expected a whole number, got {value!r}")
        if number < 0:
            raise ConfigError(f"must be >= 0, got {number}")
        return number
    if kind == "usd":
        if isinstance(value, bool) or not isinstance(value, str | int | float) or (
                not from_file and not isinstance(value, str)):
            raise ConfigError(f"expected a number of US dollars, got {value!r}")
        return parse_usd(value, "")
    if kind == "duration":
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ConfigError(f"expected a duration, got {value!r}")
        return parse_duration(value)
    if kind == "endpoints":
        if from_file and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return split_endpoints(",".join(value))
        if isinstance(value, str):
            return split_endpoints(value)
        raise ConfigError("expected an endpoint or a list of endpoints")
    if kind == "list":
        if isinstance(value, str) and from_file:
            value = [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError("expected a list of strings")
    if not isinstance(value, str):
        raise ConfigError(f"expected a string, got {type(value).__name__}")
    if kind == "choice" and value not in flag.choices:
        raise ConfigError(f"invalid choice {value!r} (choose from {', '.join(flag.choices)})")
    if kind == "path":
        if not value:
            raise ConfigError("empty path")
        return os.path.expanduser(value)
    if kind == "secret":
        return _secret_setting(value, env_variable, flag=flag.name, env=env)
    return value


def _secret_setting(value: str, env_variable: str | None, *, flag: str = "",
                    env: Mapping[str, str] | None = None) -> str:
    """A secret setting holds a reference. From the environment a literal is fine: it becomes a reference
    to the variable it came from, so the Config still never holds the value.

    A literal on the command line is refused, deliberately: it is in the process list. The refusal says
    exactly what to type instead; when the literal is the value of an environment variable (the shell
    expanded ``"$REVIEWER_TOKEN"``), it names that variable (never the value)."""
    if has_secret_ref(value):
        secret_refs(value)  # form check
        return value
    if env_variable is not None:
        return f"{{{{secret:{env_variable}}}}}"
    names = sorted(name for name, held in (env or {}).items() if value and held == value)[:3]
    typed = f"{flag} " if flag else ""
    if names:
        hint = " or ".join(f"{typed}'{{{{secret:{name}}}}}'" for name in names)
        hint += " (in single quotes, so the shell passes the reference and not the token)"
    else:
        hint = (f"{typed}'{{{{secret:NAME}}}}' where NAME is the environment variable holding it, "
                f"or {typed}'{{{{secret-file:PATH}}}}'")
    raise ConfigError(
        "a literal secret is not accepted here (it would be visible in the process list and config); type "
        + hint
    )


def with_changes(config: Config, env: Mapping[str, str] | None = None, **changes: Any) -> Config:
    """``attrs.evolve`` plus re-validation, for harnesses that tweak a parsed Config."""
    evolved = attrs.evolve(config, **changes)
    validate(evolved, os.environ if env is None else env)
    return evolved

