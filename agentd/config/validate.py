"""Whole-config checks, all before any side effect: every failure is one :class:`ConfigError` line (exit 2).

Secret references are checked for availability (the variable is set, the file is readable) but never read.
"""

from __future__ import annotations

import functools
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final, Literal

from agentd.config.endpoints import (
    OFFLINE_MODEL,
    check_endpoint,
    check_intelligence_endpoint,
    check_server_name,
    is_loopback_host,
)
from agentd.config.extras import require
from agentd.config.model import Config, McpServerConfig, flat_settings
from agentd.deferred.patterns import Pattern
from agentd.errors import ConfigError
from agentd.security.rule_of_two import SERVER_TAGS, catalogue_tags, check_trifecta
from agentd.security.secrets import check_refs_available, looks_like_inline_credential, secret_refs

if TYPE_CHECKING:
    from agentd.transport.egress import EgressPolicy

Purpose = Literal["run", "check"]


@functools.cache
def _managed_headers() -> frozenset[str]:
    """Headers agentd sets itself; a configured value would break the protocol or smuggle a second body.
    (The transport's module is imported only once some server configures a header.)"""
    from agentd.mcp.streamable_http import MCP_HEADERS

    return frozenset({"accept", "content-type", "content-length", "host", "transfer-encoding", "connection",
                      *(name.lower() for name in MCP_HEADERS)})


_HEADER_NAME: Final = Pattern(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_RUN_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")

#: (field, flag, minimum) for the numbers that must be at least 1 (0 would make the setting useless).
_AT_LEAST_ONE: Final = (
    ("max_steps", "--max-steps"), ("max_tokens", "--max-tokens"),
    ("max_concurrent_wakes", "--max-concurrent-wakes"), ("max_uris_per_wake", "--max-uris-per-wake"),
    ("token_ceiling", "--token-ceiling"),
    ("serve_max_spawns", "--serve-max-spawns"), ("serve_max_sessions", "--serve-max-sessions"),
    ("serve_max_queued", "--serve-max-queued"),
    ("serve_max_body", "--serve-max-body"), ("serve_max_connections", "--serve-max-connections"),
    ("serve_max_per_client", "--serve-max-per-client"),
    ("spawn_rate", "--spawn-rate"), ("spawn_burst", "--spawn-burst"),
)
_POSITIVE_DURATIONS: Final = (
    ("deadline", "--deadline"), ("pong_timeout", "--pong-timeout"), ("progress_timeout", "--progress-timeout"),
    ("serve_keepalive", "--serve-keepalive"),
)


def validate(config: Config, env: Mapping[str, str] | None = None, *, purpose: Purpose = "run") -> None:
    """Check ``config`` as a whole. ``purpose="check"`` is ``agentd check``: servers only, no run settings."""
    env = os.environ if env is None else env
    _check_servers(config.mcp, env)
    _check_servers(config.a2a_peers, env, kind="a2a peer")  # same rules: headers' secrets, TLS files
    _check_distinct_names(config)
    _check_file(config.tls_ca, "--tls-ca")
    _check_credentials(config)
    _check_operator_egress(config)
    if purpose == "check":
        if not config.mcp and not config.intelligence.endpoints:
            raise ConfigError("agentd check: give something to check: a server (--mcp NAME=URL or mcp_servers) "
                              "or the gateway (--intelligence URL)")
        return
    _check_run(config, env)
    _check_trifecta(config)
    _check_modes(config)
    _check_numbers(config)
    _check_serve(config, env)
    _check_telemetry(config, env)
    _check_cluster(config)


def _check_credentials(config: Config) -> None:
    """An ``auth: oauth`` connection needs the runtime module whose provider serves it (the file must exist)."""
    _check_file(config.runtime_module, "--runtime-module")
    for server in config.mcp:
        if server.credentials is not None and server.credentials.type == "oauth" and config.runtime_module is None:
            raise ConfigError(f"connection {server.name!r} uses auth type oauth: give --runtime-module PATH (a "
                              "module exporting connection_credentials)")


def _check_cluster(config: Config) -> None:
    if config.cluster.dsn is None:
        return
    from agentd.config.dsn import parse  # libpq's reading of the DSN: psycopg, so after the extra's check

    if config.journal.state_dir is not None:
        raise ConfigError("--cluster and --state-dir are mutually exclusive (a member journals in the cluster "
                          "database)")
    require("cluster", "--cluster")
    parse(config.cluster.dsn)
    if config.cluster.capacity < 0:
        raise ConfigError(f"--cluster-capacity must be >= 0, not {config.cluster.capacity}")
    if not config.cluster.lease_ttl >= 1:
        raise ConfigError(f"--cluster-lease-ttl must be at least 1s, not {config.cluster.lease_ttl}")


_TRACEPARENT = Pattern(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def _check_telemetry(config: Config, env: Mapping[str, str]) -> None:
    if config.telemetry.otel:
        from agentd.telemetry.settings import sdk_disabled

        if not sdk_disabled(env):  # OTEL_SDK_DISABLED=true: nothing of OpenTelemetry is imported
            require("otel", "--otel")
    if config.telemetry.traceparent is not None:
        value = config.telemetry.traceparent.strip()
        if not _TRACEPARENT.match(value) or value.split("-")[1] == "0" * 32 or value.split("-")[2] == "0" * 16:
            raise ConfigError("--traceparent: not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")
    if config.telemetry.metrics_addr is not None:
        host, _ = split_host_port(config.telemetry.metrics_addr, what="--metrics-addr")
        if not is_loopback_host(host) and config.serve.client_ca is None and config.serve.bearer is None:
            raise ConfigError(
                f"--metrics-addr {config.telemetry.metrics_addr}: a non-loopback listener needs mTLS (--serve-client-ca) "
                "or --serve-bearer, as the self-MCP server does"
            )
        if config.serve.client_ca is not None and (config.serve.cert is None or config.serve.key is None):
            raise ConfigError("--metrics-addr with --serve-client-ca needs --serve-cert and --serve-key")


def split_host_port(value: str, *, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6); port 0 picks a free one."""
    host, sep, port = value.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} {value!r}: expected HOST:PORT")
    return host, int(port)


def _check_run(config: Config, env: Mapping[str, str]) -> None:
    if config.instruction is not None and not config.instruction.strip():
        raise ConfigError("--instruction is empty")
    if config.instruction is None and config.serve.mcp is None and config.cluster.dsn is None:
        raise ConfigError("--instruction (or --instruction-file) is required unless --serve-mcp or --cluster is given")
    if config.instruction is None and config.mode != "once":
        # A serving daemon without an instruction would be a pure worker that silently ignores its mode.
        raise ConfigError(f"--mode {config.mode} needs --instruction (or --instruction-file): every fire runs it")
    if not config.intelligence.endpoints:
        raise ConfigError("--intelligence is required (a Chat Completions base URL, or 'test')")
    for endpoint in config.intelligence.endpoints:
        check_intelligence_endpoint(endpoint)
    if OFFLINE_MODEL in config.intelligence.endpoints and len(config.intelligence.endpoints) > 1:
        raise ConfigError("--intelligence: 'test' (the offline model) cannot be combined with other endpoints")
    if config.intelligence.token is not None:
        _check_secret_setting(config.intelligence.token, "--intelligence-token", env)
    if not config.intelligence.model.strip():
        raise ConfigError("--model is empty")
    if not _RUN_ID.match(config.run_id):
        raise ConfigError(
            f"--run-id {config.run_id!r}: use 1-128 of letters, digits and ._:@+- (starting with a letter or digit)"
        )


def _check_trifecta(config: Config) -> None:
    """The Rule of Two at start-up (docs/security.md): refused unless --allow-trifecta."""
    verdict = check_trifecta(catalogue_tags(((s.name, s.tags) for s in config.mcp),
                                            ((p.name, p.tags) for p in config.a2a_peers)))
    if verdict.complete and not config.allow_trifecta:
        what = "the MCP servers and A2A peers" if config.a2a_peers else "the MCP servers"
        flags = "--mcp-tags, --a2a-peer-tags" if config.a2a_peers else "--mcp-tags"
        raise ConfigError(
            f"{what} together bring untrusted input, sensitive data and external communication "
            f"(Rule of Two; {verdict.describe()}); narrow the servers, fix their tags ({flags}), "
            "or pass --allow-trifecta"
        )


def _check_distinct_names(config: Config) -> None:
    """A subagent's tool_scope names MCP servers and A2A peers alike, so one name cannot mean both."""
    shared = sorted({s.name for s in config.mcp} & {p.name for p in config.a2a_peers})
    if shared:
        raise ConfigError(
            f"{shared[0]!r} names both an MCP server and an A2A peer; give them different names "
            "(a subagent's tool_scope refers to either by name)"
        )


def _check_operator_egress(config: Config) -> None:
    """Operator endpoints are trusted, except that a metadata, private or other non-public address (not
    loopback) needs an explicit egress.allow."""
    policy = config.egress.policy()
    endpoints = [(f"mcp server {s.name!r}", s.url) for s in config.mcp]
    endpoints += [(f"a2a peer {p.name!r}", p.url) for p in config.a2a_peers]
    endpoints += [("--intelligence", url) for url in config.intelligence.endpoints if url != OFFLINE_MODEL]
    for what, url in endpoints:
        check_operator_egress(what, url, policy)


def check_operator_egress(what: str, url: str, policy: EgressPolicy) -> None:
    """Raise the start-up error for an operator endpoint ``url`` written as an address egress refuses."""
    from agentd.transport.egress import operator_refusal

    refused = operator_refusal(url, policy)
    if refused is None:
        return
    if refused.reason == "metadata":
        raise ConfigError(
            f"{what}: {refused.origin} is a link-local/cloud metadata address; "
            "list it in the config file's egress.allow to use it"
        )
    raise ConfigError(
        f"{what}: {refused.origin} is a {refused.reason} (not public) address; egress there is opt-in: name it "
        "in the config file's egress: {allow: [CIDR]} (for example egress: {allow: [10.0.0.0/8]})"
    )


def _check_modes(config: Config) -> None:
    mode = config.mode
    if mode == "reactive" and not (config.modes.subscribe or config.modes.continue_uris or config.modes.on_events):
        raise ConfigError("--mode reactive needs at least one --subscribe URI (or --continue URI, or --on-event)")
    if mode != "reactive" and (config.modes.subscribe or config.modes.continue_uris or config.modes.on_events):
        flag = "--subscribe" if config.modes.subscribe else "--continue" if config.modes.continue_uris else "--on-event"
        raise ConfigError(f"{flag} needs --mode reactive (the mode is {mode})")
    names = {server.name for server in config.mcp}
    if config.modes.on_events:
        from agentd.config.on_events import check as check_on_events

        check_on_events(config.modes.on_events, names, (server.name for server in config.mcp if server.era == "legacy"))
    for value in config.modes.subscribe:
        split_subscription(value, names)
    for value in config.modes.continue_uris:
        split_subscription(value, names, flag="--continue")
    if mode == "reactive" and not config.mcp and config.serve.mcp is None:
        # No server owns the URIs (the daemon would warn reactive.unowned and keep serving), and there is
        # nothing to serve: it would idle forever.
        flag, value = ("--subscribe", config.modes.subscribe[0]) if config.modes.subscribe else ("--continue",
                                                                                     config.modes.continue_uris[0])
        raise ConfigError(f"{flag} {value!r}: no MCP server is declared to own it (--mcp NAME=URL), and with "
                          "no --serve-mcp nothing else would run")
    if mode == "schedule":
        if config.modes.interval is None and config.modes.cron is None:
            raise ConfigError("--mode schedule needs --interval or --cron")
        if config.modes.interval is not None and config.modes.cron is not None:
            raise ConfigError("--interval and --cron are mutually exclusive")
        if config.modes.interval is not None and config.modes.interval <= 0:
            raise ConfigError("--mode schedule needs --interval > 0 (or --cron)")
    elif config.modes.cron is not None:
        raise ConfigError(f"--cron needs --mode schedule (the mode is {mode})")
    elif config.modes.interval is not None and mode != "loop":
        raise ConfigError(f"--interval needs --mode loop or schedule (the mode is {mode})")
    if config.modes.cron_tz is not None and config.modes.cron is None:
        raise ConfigError("--cron-tz needs --cron (an --interval keeps its own pace, whatever the zone)")
    if config.modes.cron is not None:
        _check_cron_fires(config.modes.cron, config.modes.cron_tz)
    if config.modes.poll_interval is not None and config.modes.poll_interval <= 0:
        raise ConfigError("--poll-interval must be > 0 (leave it unset to disable polling)")


def _check_cron_fires(expression: str, tz_name: str | None) -> None:
    """Parse ``--cron`` in its zone and refuse one that never fires (``0 0 30 2 *``) here, so the daemon
    fails with exit 2 before it opens a connection instead of after."""
    import datetime as dt  # the calendar: only for a --cron

    from agentd.config.cron import CronSchedule

    schedule = CronSchedule.parse(expression, tz_name)
    try:
        schedule.next_after(dt.datetime.now(dt.UTC))
    except ValueError:
        raise ConfigError(f"--cron {expression!r} never fires (no such date in the calendar)") from None


def split_subscription(value: str, servers: Iterable[str], *, flag: str = "--subscribe") -> tuple[str | None, str]:
    """``server:uri`` -> ``(server, uri)`` when ``server`` is declared and the rest is itself a URI;
    otherwise ``(None, value)``: the owning server is found from the catalogues at run time.

    A URI template (``{...}``) is refused: templates are not subscribable, only concrete URIs are."""
    if not value.strip():
        raise ConfigError(f"{flag}: empty URI")
    head, sep, rest = value.partition(":")
    if sep and head in set(servers) and urllib.parse.urlsplit(rest).scheme:
        server, uri = head, rest
    elif not urllib.parse.urlsplit(value).scheme:
        raise ConfigError(f"{flag} {value!r}: not a URI (expected scheme:..., or server:scheme:...)")
    else:
        server, uri = None, value
    if "{" in uri or "}" in uri:
        raise ConfigError(f"{flag} {value!r}: a URI template is not subscribable; subscribe a concrete URI "
                          "(fill in every {...})")
    return server, uri


def _check_numbers(config: Config) -> None:
    settings = flat_settings(config)
    for field, flag in _AT_LEAST_ONE:
        if settings[field] < 1:
            raise ConfigError(f"{flag} must be at least 1, got {settings[field]}")
    if config.budgets.exit_code is not None and not 0 <= config.budgets.exit_code <= 255:
        raise ConfigError(f"--budget-exit-code must be 0-255, got {config.budgets.exit_code}")
    for field, flag in _POSITIVE_DURATIONS:
        if settings[field] <= 0:
            raise ConfigError(f"{flag} must be > 0")
    _check_money(config)


def _check_money(config: Config) -> None:
    """``--models`` names real models; a money budget prices every model the tree may call (a model without a
    price would count as free: the budget could never stop it)."""
    for name in config.intelligence.models:
        if not name or len(name) > 256 or any(c.isspace() or not c.isprintable() for c in name):
            raise ConfigError(f"--models: {name[:64]!r} is not a model name")
    if config.budgets.usd is None:
        return
    if config.budgets.usd <= 0:
        raise ConfigError("--budget-usd must be more than 0")
    unpriced = [m for m in config.usable_models() if m not in config.intelligence.prices]
    if unpriced:
        raise ConfigError(
            f"--budget-usd: model {unpriced[0]!r} has no price; give one with --price {unpriced[0]}=IN/OUT "
            "(US dollars per million input / output tokens) or in the config file's prices:")


def _check_serve(config: Config, env: Mapping[str, str]) -> None:
    for path, flag in ((config.serve.cert, "--serve-cert"), (config.serve.key, "--serve-key"),
                       (config.serve.client_ca, "--serve-client-ca")):
        _check_file(path, flag)
    if config.serve.bearer is not None:
        _check_secret_setting(config.serve.bearer, "--serve-bearer", env)
    if config.serve.mcp is None:
        given = [f for f, v in (("--serve-cert", config.serve.cert), ("--serve-key", config.serve.key),
                                ("--serve-client-ca", config.serve.client_ca),
                                ("--serve-bearer", config.serve.bearer),
                                ("--serve-oauth-issuer", config.serve.oauth_issuer),
                                ("--serve-oauth-audience", config.serve.oauth_audience),
                                ("--serve-oauth-scope", config.serve.oauth_scope or None),
                                ("--serve-oauth-operator-scope", config.serve.oauth_operator_scope)) if v is not None]
        if config.serve.a2a:
            given.append("--serve-a2a")
        if config.serve.tasks:
            given.append("--serve-tasks")
        if config.serve.accept_cancel:
            given.append("--serve-accept-cancel")
        if given:
            raise ConfigError(f"{given[0]} needs --serve-mcp")
        return
    url = check_endpoint(config.serve.mcp, what="--serve-mcp", listen=True)
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.query:
        raise ConfigError(f"--serve-mcp {url!r}: a listen URL has no query")
    if parts.scheme == "https":
        if config.serve.cert is None or config.serve.key is None:
            raise ConfigError(f"--serve-mcp {url}: https needs --serve-cert and --serve-key")
    elif config.serve.cert or config.serve.key or config.serve.client_ca:
        raise ConfigError(f"--serve-mcp {url}: --serve-cert/--serve-key/--serve-client-ca need https://")
    _check_serve_oauth(config)
    if (not is_loopback_host(host) and config.serve.client_ca is None and config.serve.bearer is None
            and config.serve.oauth_issuer is None):
        raise ConfigError(
            f"--serve-mcp {url}: a non-loopback listener needs mTLS (--serve-client-ca) or --serve-bearer "
            "(or --serve-oauth-issuer)"
        )


def _check_serve_oauth(config: Config) -> None:
    """The issuer is https (http only on loopback), without query or fragment; the audience an http(s) URL;
    scopes are single printable tokens (they go into the ``WWW-Authenticate`` header)."""
    issuer = config.serve.oauth_issuer
    if issuer is None:
        for flag, value in (("--serve-oauth-audience", config.serve.oauth_audience),
                            ("--serve-oauth-scope", config.serve.oauth_scope or None),
                            ("--serve-oauth-operator-scope", config.serve.oauth_operator_scope)):
            if value is not None:
                raise ConfigError(f"{flag} needs --serve-oauth-issuer")
        return
    parts = urllib.parse.urlsplit(issuer)
    try:
        _ = parts.port
    except ValueError:
        raise ConfigError(f"--serve-oauth-issuer {issuer!r}: invalid port") from None
    if not parts.hostname or parts.scheme not in ("http", "https") or parts.query or parts.fragment \
            or parts.username is not None or '"' in issuer:
        raise ConfigError(f"--serve-oauth-issuer {issuer!r}: expected https://host[:port][/path], "
                          "without query or fragment")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise ConfigError(f"--serve-oauth-issuer {issuer!r}: the authorization server must be https "
                          "(http only on loopback)")
    audience = config.serve.oauth_audience
    bind_host = (urllib.parse.urlsplit(config.serve.mcp or "").hostname or "").strip("[]")
    if audience is None and bind_host in ("0.0.0.0", "::"):
        raise ConfigError("--serve-oauth-issuer on a wildcard bind needs --serve-oauth-audience (the URL clients "
                          "use, which tokens must name)")
    if audience is not None:
        aparts = urllib.parse.urlsplit(audience)
        if aparts.scheme not in ("http", "https") or not aparts.hostname or aparts.query or aparts.fragment \
                or '"' in audience:
            raise ConfigError(f"--serve-oauth-audience {audience!r}: expected an http(s) URL without query "
                              "or fragment")
    named = [("--serve-oauth-scope", scope) for scope in config.serve.oauth_scope]
    if config.serve.oauth_operator_scope is not None:
        named.append(("--serve-oauth-operator-scope", config.serve.oauth_operator_scope))
    for flag, scope in named:
        if not scope or any(c in scope for c in ' "\\') or not scope.isprintable() or not scope.isascii():
            raise ConfigError(f"{flag} {scope!r}: a scope is one printable ASCII word "
                              "(no spaces, quotes or backslashes)")


def _check_servers(servers: Iterable[McpServerConfig], env: Mapping[str, str], *, kind: str = "mcp server") -> None:
    seen: set[str] = set()
    for server in servers:
        what = f"{kind} {server.name!r}"
        check_server(server, what=what)
        if server.name in seen:
            raise ConfigError(f"duplicate {kind} name {server.name!r}")
        seen.add(server.name)
        for value in server.headers.values():
            check_refs_available(value, env)
        if server.tls is not None:
            for path, label in ((server.tls.ca, "tls.ca"), (server.tls.cert, "tls.cert"),
                                (server.tls.key, "tls.key")):
                _check_file(path, f"{what}: {label}")


def check_server(server: McpServerConfig, *, what: str) -> None:
    """The checks that need neither the environment nor the file system (the file loader runs them too,
    so its errors carry the entry's path)."""
    check_server_name(server.name, what=what)
    check_endpoint(server.url, what=what)
    for name, value in server.headers.items():
        if not _HEADER_NAME.match(name):
            raise ConfigError(f"{what}: bad header name {name!r}")
        if name.lower() in _managed_headers():
            raise ConfigError(f"{what}: header {name!r} is set by agentd and cannot be configured")
        if any(c in value for c in "\r\n\0"):
            raise ConfigError(f"{what}: header {name!r} contains a line break")
        if looks_like_inline_credential(value, name=name):
            raise ConfigError(
                f"{what}: header {name!r} holds an inline credential; "
                "use {{secret:NAME}} or {{secret-file:PATH}} instead"
            )
        try:
            secret_refs(value)
        except ConfigError as exc:
            raise ConfigError(f"{what}: header {name!r}: {exc}") from None
    for timeout, label in ((server.connect_timeout, "connect_timeout"), (server.call_timeout, "call_timeout")):
        if timeout <= 0:
            raise ConfigError(f"{what}: {label} must be > 0")
    for tag in server.tags or ():
        if tag not in SERVER_TAGS:
            raise ConfigError(f"{what}: unknown tag {tag!r} (expected {', '.join(SERVER_TAGS)})")
    if server.tls is not None and (server.tls.cert is None) != (server.tls.key is None):
        raise ConfigError(f"{what}: tls needs both cert and key for a client certificate")


def _check_secret_setting(template: str, flag: str, env: Mapping[str, str]) -> None:
    if not secret_refs(template):
        raise ConfigError(f"{flag}: a literal secret is not accepted; use '{{{{secret:NAME}}}}' or "
                          "'{{secret-file:PATH}}'")
    try:
        check_refs_available(template, env)
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def _check_file(path: str | None, what: str) -> None:
    if path is not None and not (os.path.isfile(path) and os.access(path, os.R_OK)):
        raise ConfigError(f"{what} {path}: no such readable file")
