"""The flag table: every command-line flag agentd has, its type, default source, env and file names.

One table drives argparse (``--help``), the environment layer (``AGENTD_<FLAG>``/``AGENT_<FLAG>``), the
config-file keys, docs/cli.md and the shell completion scripts, so they can never disagree; beside it,
:data:`SUBCOMMANDS` lists the commands (the usage, did-you-mean and completion read it). Default values live in
:mod:`agentd.defaults` (the help text quotes them from there).

A :class:`Flag` is a ``NamedTuple``, not an attrs class: still a frozen value, but this module is all that
``agentd --help``, ``--version`` and the CLI's early ``--log-format`` look-up import, and they must not pay
for importing attrs (docs/design/wiring.md).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from typing import Any, Final, Literal, NamedTuple, NoReturn

from agentd import defaults as D
from agentd.errors import ConfigError

Command = Literal["agentd", "check", "run", "transcript"]
Kind = Literal["str", "int", "duration", "bool", "endpoints", "choice", "secret", "path", "list", "url", "usd"]


class Flag(NamedTuple):
    """One flag. ``dest`` is the Config field (or a pseudo-field the loader folds in)."""

    name: str
    dest: str
    kind: Kind
    help: str
    group: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    #: Read from ``AGENTD_<NAME>`` / ``AGENT_<NAME>`` (the original's flag-only list says no).
    env: bool = True
    #: Accepted as a key in the ``--config`` file (``name`` in snake case).
    file: bool = True
    #: Extra environment names accepted after the standard two (the original's historical spellings).
    env_aliases: tuple[str, ...] = ()
    #: The commands that take this flag: ``agentd``, ``check``, ``run``, ``transcript``. ``agentd check``
    #: also accepts every ``agentd`` flag (one flag set serves both), but its help lists only its own.
    commands: tuple[Command, ...] = ("agentd",)

    @property
    def env_suffix(self) -> str:
        return self.name.removeprefix("--").replace("-", "_").upper()

    @property
    def env_names(self) -> tuple[str, ...]:
        """Names in precedence order: ``AGENTD_X`` wins over ``AGENT_X`` wins over aliases."""
        if not self.env:
            return ()
        return (f"AGENTD_{self.env_suffix}", f"AGENT_{self.env_suffix}", *self.env_aliases)

    @property
    def file_key(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


def flag_named(name: str) -> Flag:
    """The flag called ``name`` (``--state-dir``): where its environment names come from."""
    return next(f for f in FLAGS if f.name == name)


def _s(seconds: float) -> str:
    """A default duration as help text writes it: ``250ms``, ``5s``."""
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g}d"
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


_RUN = "run"
_INTEL = "intelligence"
_MCP = "tools / MCP"
_MODES = "modes"
_BUDGETS = "budgets and subagents"
_SERVE = "self-MCP server"
_LOG = "telemetry"
_CONFIG = "configuration"
_MANIFEST = "agentd run"
_TRANSCRIPT = "agentd transcript"
_AND_RUN: Final[tuple[Command, ...]] = ("agentd", "run")
_AND_CHECK: Final[tuple[Command, ...]] = ("agentd", "check")
_ALL_THREE: Final[tuple[Command, ...]] = ("agentd", "check", "run")

FLAGS: Final[tuple[Flag, ...]] = (
    # run
    Flag("--instruction", "instruction", "str", "what the agent should do", _RUN, "TEXT"),
    Flag("--instruction-file", "instruction_file", "path", "read the instruction from a file ('-' = stdin)", _RUN, "PATH",
         env=False),
    Flag("--output-contract", "output_contract", "str",
         "what the final answer must look like (a JSON answer is parsed)", _RUN, "TEXT"),
    Flag("--run-id", "run_id", "str", "the run id in every event and tools/call _meta (default: time+pid)",
         _RUN, "ID", commands=_ALL_THREE),
    Flag("--state-dir", "state_dir", "path",
         "journal every run under this directory and resume an unfinished run with the same --run-id "
         "(default: off, nothing is written)", _RUN, "PATH"),
    Flag("--journal-keep-for", "journal_keep_for", "duration",
         f"with --state-dir: keep finished runs this long, 0 for no age bound (default {_s(D.JOURNAL_KEEP_FOR)})",
         _RUN, "DURATION"),
    Flag("--journal-keep-runs", "journal_keep_runs", "int",
         f"with --state-dir: keep this many most recently finished runs, 0 for no bound (default {D.JOURNAL_KEEP_RUNS})",
         _RUN, "N"),
    Flag("--ctl-socket", "ctl_socket", "path",
         "serve 'agentd ctl' on this Unix socket, mode 0600 (default: STATE_DIR/ctl.sock with --state-dir, "
         "else none)", _RUN, "PATH"),
    Flag("--cluster", "cluster", "str",
         "join the cluster on this PostgreSQL DSN: shared journal and work queue (no password in it: PGPASSWORD, "
         "~/.pgpass or {{secret:NAME}} in the password position; config cluster.dsn)", _RUN, "DSN"),
    Flag("--cluster-capacity", "cluster_capacity", "int",
         f"cluster: work items this member runs at once; 0 queues work but runs none (default {D.CLUSTER_CAPACITY})",
         _RUN, "N"),
    Flag("--cluster-lease-ttl", "cluster_lease_ttl", "duration",
         f"cluster: lease on claimed work; a dead member's work moves after this (default {_s(D.CLUSTER_LEASE_TTL)})",
         _RUN, "DURATION"),
    # intelligence
    Flag("--intelligence", "intelligence", "endpoints",
         "OpenAI-compatible Chat Completions base URL(s), comma-separated for failover; 'test' = offline model",
         _INTEL, "URL[,URL...]", commands=_ALL_THREE),
    Flag("--intelligence-token", "intelligence_token", "secret",
         "bearer token for the gateway, as '{{secret:NAME}}' or '{{secret-file:PATH}}' (never a literal)",
         _INTEL, "REF", commands=_AND_CHECK),
    Flag("--intelligence-token-file", "intelligence_token_file", "path",
         "read the gateway bearer token from a file (same as --intelligence-token '{{secret-file:PATH}}')",
         _INTEL, "PATH", commands=_AND_CHECK),
    Flag("--model", "model", "str", f"model name sent to the gateway (default: {D.MODEL})", _INTEL, "NAME",
         commands=_ALL_THREE),
    Flag("--models", "models", "list",
         "models a subagent.spawn may choose with its 'model' argument, comma-separated (repeatable; default: "
         "only the parent's own model)", _INTEL, "NAME[,NAME...]", env=False),
    Flag("--price", "prices", "list",
         "a model's price in US dollars per million input / output tokens (repeatable; config prices:)", _INTEL,
         "MODEL=IN/OUT", env=False, file=False),
    Flag("--stream-intelligence", "stream_intelligence", "bool", "stream gateway replies (SSE)", _INTEL),
    # MCP
    Flag("--mcp", "mcp", "list", "declare a remote MCP server (repeatable; Streamable HTTP)", _MCP,
         "NAME=URL", env=False, file=False, commands=_ALL_THREE),
    Flag("--a2a-peer", "a2a_peers", "list",
         "declare an A2A peer to delegate to via a2a.delegate (repeatable; its Agent Card is fetched at start)",
         _MCP, "NAME=URL", env=False, file=False),
    Flag("--mcp-tags", "mcp_tags", "list",
         "Rule of Two: tag a declared server (repeatable; tags untrusted_input, sensitive_data, external_comms; "
         "untagged = untrusted_input)", _MCP, "NAME=TAG[,TAG]", env=False, file=False),
    Flag("--a2a-peer-tags", "a2a_peer_tags", "list",
         "Rule of Two: tag a declared A2A peer (repeatable; untagged = untrusted_input,external_comms)", _MCP,
         "NAME=TAG[,TAG]", env=False, file=False),
    Flag("--mcp-era", "mcp_era", "list",
         "protocol era of a declared server (repeatable; auto: initialize first, server/discover if refused; "
         "legacy or modern: that era only)", _MCP, "NAME=ERA", env=False, file=False),
    Flag("--approve", "approve", "list",
         "a person approves each call of this tool first (repeatable; agentd ctl approvals / approve / deny; "
         "SERVER__* marks every tool of a server)", _MCP, "SERVER__TOOL", env=False, file=False),
    Flag("--mcp-capabilities", "mcp_capabilities", "list",
         "declare client capabilities to a declared server (repeatable; elicitation, sampling, sampling.tools; "
         "default none: capabilities {} and -32601 for both)", _MCP, "NAME=CAP[,CAP]", env=False, file=False),
    Flag("--allow-trifecta", "allow_trifecta", "bool",
         "run although the servers together bring untrusted input, sensitive data and external "
         "communication (audited; never inherited by subagents)", _MCP, env=False),
    Flag("--tls-ca", "tls_ca", "path", "CA bundle trusted instead of the default by https MCP servers and A2A peers without their own tls.ca (default, and always for the gateway: the OS trust store plus SSL_CERT_FILE/SSL_CERT_DIR, certifi's bundle only when there is no OS store)", _MCP, "PATH",
         commands=_AND_CHECK),
    # modes
    Flag("--mode", "mode", "choice", "once (default), loop, schedule or reactive", _MODES,
         choices=("once", "loop", "schedule", "reactive")),
    Flag("--subscribe", "subscribe", "list",
         "reactive: wake on updates of URI (repeatable; 'server:uri' picks the server)", _MODES, "URI",
         env=False),
    Flag("--continue", "continue_uris", "list",
         "reactive: feed updates of URI to one warm session instead of a fresh run (repeatable)", _MODES,
         "URI", env=False),
    Flag("--on-event", "on_events", "list",
         "reactive: wake on the MCP event EVENT of the --mcp server SERVER (repeatable; subscription arguments "
         "through the config file's on_events)", _MODES, "SERVER:EVENT", env=False, file=False),
    Flag("--interval", "interval", "duration", "loop/schedule: time between fires (0 = back to back)",
         _MODES, "DURATION", env=False),
    Flag("--cron", "cron", "str", f"schedule: 5-field cron expression, read in --cron-tz (default {D.CRON_TIME_ZONE})",
         _MODES, "EXPR"),
    Flag("--cron-tz", "cron_tz", "str",
         f"schedule: the time zone --cron is read in, an IANA name such as Europe/Berlin (default {D.CRON_TIME_ZONE})",
         _MODES, "ZONE"),
    Flag("--poll-interval", "poll_interval", "duration",
         "reactive, and a once run's subscribe/await_resource: poll resources/read at this interval when a "
         "server cannot subscribe (default: off)",
         _MODES, "DURATION"),
    Flag("--debounce", "debounce", "duration", f"reactive: coalescing window per URI (default {_s(D.DEBOUNCE)})",
         _MODES, "DURATION"),
    Flag("--max-concurrent-wakes", "max_concurrent_wakes", "int", f"reactive: concurrent wakes (default {D.MAX_CONCURRENT_WAKES})",
         _MODES, "N"),
    Flag("--max-uris-per-wake", "max_uris_per_wake", "int",
         f"reactive: URIs one wake may read when wakes queue for a slot; 1: never batch (default {D.MAX_URIS_PER_WAKE})",
         _MODES, "N"),
    Flag("--max-wakes-per-minute", "max_wakes_per_minute", "int",
         f"reactive: wakes the daemon may start in any 60 s; more wait, coalesced (default {D.MAX_WAKES_PER_MINUTE}, "
         "0 = no limit)",
         _MODES, "N"),
    Flag("--max-wakes-per-uri-per-minute", "max_wakes_per_uri_per_minute", "int",
         "reactive: wakes one URI may start in any 60 s; more wait, coalesced "
         f"(default {D.MAX_WAKES_PER_URI_PER_MINUTE}, 0 = no limit)",
         _MODES, "N"),
    # budgets and subagents
    Flag("--max-steps", "max_steps", "int", f"steps per run (default {D.MAX_STEPS})", _BUDGETS, "N"),
    Flag("--max-tokens", "max_tokens", "int", f"tokens per run (default {D.MAX_TOKENS})", _BUDGETS, "N"),
    Flag("--deadline", "deadline", "duration", f"wall-clock limit per run (default {_s(D.DEADLINE)})", _BUDGETS,
         "DURATION"),
    Flag("--max-depth", "max_depth", "int", f"subagent tree depth (default {D.MAX_DEPTH})", _BUDGETS, "N", env=False),
    Flag("--max-children", "max_children", "int", f"subagents per node (default {D.MAX_CHILDREN})", _BUDGETS, "N"),
    Flag("--max-subagents", "max_subagents", "int", f"subagents in the whole tree (default {D.MAX_SUBAGENTS})", _BUDGETS, "N"),
    Flag("--spawn-rate", "spawn_rate", "int", f"subagent spawns per second, whole tree (default {D.SPAWN_RATE})", _BUDGETS, "N"),
    Flag("--spawn-burst", "spawn_burst", "int", f"subagent spawns at once above the rate (default {D.SPAWN_BURST})", _BUDGETS, "N"),
    Flag("--token-ceiling", "token_ceiling", "int", f"tokens for the whole tree (default {D.TOKEN_CEILING})", _BUDGETS,
         "N"),
    Flag("--budget-usd", "budget_usd", "usd",
         "US dollars for the whole tree, priced by --price (default: no money budget)", _BUDGETS, "AMOUNT"),
    Flag("--budget-tokens-lifetime", "budget_tokens_lifetime", "int",
         "daemon modes: tokens over the process lifetime (default 0 = unbounded)", _BUDGETS, "N",
         env_aliases=("AGENTD_BUDGET_TOKENS", "AGENT_BUDGET_TOKENS")),
    Flag("--budget-exit-code", "budget_exit_code", "int",
         "exit with this code instead of 3 (partial) or 7 (budget exhausted)", _BUDGETS, "CODE", env=False),
    Flag("--cancel-grace", "cancel_grace", "duration",
         f"kill ladder: wait after the cancel message before EOF/SIGTERM (default {_s(D.CANCEL_GRACE)})", _BUDGETS, "DURATION"),
    Flag("--term-grace", "term_grace", "duration", f"kill ladder: wait after SIGTERM before SIGKILL (default {_s(D.TERM_GRACE)})",
         _BUDGETS, "DURATION"),
    Flag("--pong-timeout", "pong_timeout", "duration", "subagent channel: missing pong marks a child stuck "
         f"(default {_s(D.PONG_TIMEOUT)})", _BUDGETS, "DURATION"),
    Flag("--progress-timeout", "progress_timeout", "duration",
         f"subagent channel: no progress marks a child stuck (default {_s(D.PROGRESS_TIMEOUT)})", _BUDGETS, "DURATION"),
    Flag("--drain-timeout", "drain_timeout", "duration",
         f"on SIGTERM/SIGINT, let running work finish this long, then cancel (default {_s(D.DRAIN_TIMEOUT)})", _BUDGETS,
         "DURATION", commands=_AND_RUN),
    # self-MCP
    Flag("--serve-mcp", "serve_mcp", "url", "serve agentd's own MCP at URL (HTTP(S), mTLS/bearer auth)",
         _SERVE, "URL"),
    Flag("--serve-a2a", "serve_a2a", "bool",
         "also serve A2A (Agent Card and JSON-RPC) on the --serve-mcp listener, under /a2a", _SERVE),
    Flag("--serve-tasks", "serve_tasks", "bool",
         "2025-11-25 wire: also serve MCP tasks (tasks capability; subagent.spawn taskSupport optional)", _SERVE),
    Flag("--serve-accept-cancel", "serve_accept_cancel", "bool",
         "2025-11-25 wire: notifications/cancelled for a tools/call in flight ends its run (kill ladder)", _SERVE),
    Flag("--serve-cert", "serve_cert", "path", "server certificate (PEM)", _SERVE, "PATH"),
    Flag("--serve-key", "serve_key", "path", "server private key (PEM)", _SERVE, "PATH"),
    Flag("--serve-client-ca", "serve_client_ca", "path", "require client certificates from this CA (mTLS)",
         _SERVE, "PATH"),
    Flag("--serve-bearer", "serve_bearer", "secret",
         "require this bearer token, as '{{secret:NAME}}' or '{{secret-file:PATH}}'", _SERVE, "REF"),
    Flag("--serve-oauth-issuer", "serve_oauth_issuer", "url",
         "accept OAuth access tokens (JWT) from this authorization server (its issuer URL)", _SERVE, "URL"),
    Flag("--serve-oauth-audience", "serve_oauth_audience", "url",
         "the audience (resource URL) tokens must name (default: the served URL)", _SERVE, "URL"),
    Flag("--serve-oauth-scope", "serve_oauth_scope", "list",
         "a scope every access token must carry (repeatable; missing: 403)", _SERVE, "SCOPE"),
    Flag("--serve-oauth-operator-scope", "serve_oauth_operator_scope", "str",
         "a token with this scope sees every client's handles, tasks and /events lines", _SERVE, "SCOPE"),
    Flag("--serve-max-spawns", "serve_max_spawns", "int", f"concurrent served spawns (default {D.SERVE_MAX_SPAWNS})", _SERVE, "N"),
    Flag("--serve-max-sessions", "serve_max_sessions", "int", f"MCP sessions (default {D.SERVE_MAX_SESSIONS})", _SERVE, "N"),
    Flag("--serve-max-warm", "serve_max_warm", "int", f"warm subagent sessions (default {D.SERVE_MAX_WARM})", _SERVE, "N"),
    Flag("--serve-max-queued", "serve_max_queued", "int",
         f"cluster: served async spawns queued here and not ended (default {D.SERVE_MAX_QUEUED})", _SERVE, "N"),
    Flag("--serve-max-body", "serve_max_body", "int", f"request body limit in bytes (default {D.SERVE_MAX_BODY // 1024 // 1024} MiB)", _SERVE,
         "BYTES"),
    Flag("--serve-keepalive", "serve_keepalive", "duration", f"SSE keepalive interval (default {_s(D.SERVE_KEEPALIVE)})", _SERVE,
         "DURATION"),
    Flag("--serve-retention", "serve_retention", "duration",
         f"keep terminal agent://subagent handles this long (default {_s(D.SERVE_RETENTION)})", _SERVE, "DURATION"),
    Flag("--serve-max-connections", "serve_max_connections", "int",
         f"open connections in total (default {D.SERVE_MAX_CONNECTIONS})", _SERVE, "N"),
    Flag("--serve-max-per-client", "serve_max_per_client", "int",
         f"open connections per client address (default {D.SERVE_MAX_PER_CLIENT})", _SERVE, "N"),
    Flag("--serve-http2", "serve_http2", "bool", "also serve HTTP/2 (h2 over TLS, h2c in clear; default: HTTP/1.1 only)",
         _SERVE),
    # telemetry
    Flag("--log-level", "log_level", "choice", f"debug, info, warn or error (default {D.LOG_LEVEL})", _LOG,
         choices=("debug", "info", "warn", "error"), commands=_ALL_THREE),
    Flag("--log-content", "log_content", "bool", "log bodies and arguments instead of their lengths", _LOG,
         commands=_AND_CHECK),
    Flag("--log-format", "log_format", "choice",
         f"stderr: human (a live view), json (JSON lines) or auto = human at a terminal (default {D.LOG_FORMAT})",
         _LOG, choices=("auto", "human", "json"), commands=_AND_CHECK),
    Flag("--output", "output", "choice",
         "stdout: json (one result document) or human (the result for a person; agentd check: a table); "
         "unset: human at a terminal, json through a pipe", _LOG, choices=("json", "human"),
         commands=_AND_CHECK),
    Flag("--json", "check_json", "bool", "print the JSON report even at a terminal (same as --output json)",
         _LOG, env=False, file=False, commands=("check",)),
    Flag("--otel", "otel", "bool",
         "export OpenTelemetry traces and metrics over OTLP/HTTP (endpoint and headers from the OTEL_* variables)", _LOG),
    Flag("--traceparent", "traceparent", "str",
         "run inside this W3C trace context (a harness's own trace)", _LOG, "TRACEPARENT",
         env_aliases=("TRACEPARENT",)),
    Flag("--metrics-addr", "metrics_addr", "str",
         "serve Prometheus metrics at http://HOST:PORT/metrics (loopback unless the serve auth is set)", _LOG,
         "HOST:PORT"),
    Flag("--health-file", "health_file", "path", "rewrite this JSON health file about every second", _LOG,
         "PATH"),
    Flag("--report-file", "report_file", "path", "write a JSON report of every run tree at exit", _LOG, "PATH"),
    # configuration
    Flag("--config", "config_path", "path",
         "YAML config or host file (mcp_servers, connections, intelligence and any setting below)", _CONFIG, "PATH", file=False,
         commands=("agentd", "check", "run", "transcript")),
    Flag("--validate-config", "validate_config", "bool",
         "check everything, print the effective config, exit 0 or 2; no network", _CONFIG, env=False,
         file=False, commands=_AND_CHECK),
    # agentd run MANIFEST (only)
    Flag("--runtime-module", "runtime_module", "path",
         "a trusted Python module: tool_adapter, connection_credentials, authorize callbacks", _MANIFEST, "PATH",
         env=False, file=False, commands=_AND_RUN),
    Flag("--stream", "stream", "bool", "every event to stdout as JSON lines, then the result", _MANIFEST,
         env=False, file=False, commands=("run",)),
    Flag("--user", "user", "str", "the user this run acts for (given to authorize callbacks and tools)",
         _MANIFEST, "ID", env=False, file=False, commands=("run",)),
    Flag("--tenant", "tenant", "str", "the tenant this run acts for", _MANIFEST, "ID", env=False, file=False,
         commands=("run",)),
    Flag("--transcript", "transcript", "path", "transcript SQLite file (overrides the host config)", _MANIFEST,
         "PATH", env=False, file=False, commands=("run",)),
    Flag("--no-transcript", "no_transcript", "bool", "do not record a durable transcript", _MANIFEST,
         env=False, file=False, commands=("run",)),
    # agentd transcript (only)
    Flag("--db", "db", "path", "the transcript SQLite file to read (default: the host config's, else "
         "$XDG_STATE_HOME/agentd/transcripts.sqlite3)", _TRANSCRIPT, "PATH", env=False, file=False,
         commands=("transcript",)),
)

FLAGS_BY_DEST: Final = {flag.dest: flag for flag in FLAGS}
#: Positional arguments of the subcommands: (dest, metavar, help, required, choices).
POSITIONALS: Final[dict[Command, tuple[tuple[str, str, str, bool, tuple[str, ...]], ...]]] = {
    "agentd": (),
    "check": (),
    "run": (("manifest", "MANIFEST", "the agent manifest (YAML)", True, ()),),
    "transcript": (("action", "{show,list}", "show one run's transcript, or list the recorded runs", True,
                    ("show", "list")),
                   ("run_id", "RUN_ID", "the run to show", False, ())),
}
_DESCRIPTIONS: Final[dict[Command, str]] = {
    "agentd": "agentd: an MCP-native agent daemon on trio.",
    "check": "Connect to every declared MCP server, perform the handshake, list tools and resources, and "
             "print a report (a table at a terminal, one JSON document with --json or when piped).",
    "run": "Run an agent manifest against a host config.",
    "transcript": "Read durable run transcripts.",
}
FLAGS_BY_FILE_KEY: Final = {flag.file_key: flag for flag in FLAGS if flag.file}

class Subcommand(NamedTuple):
    """One ``agentd COMMAND``: how the usage synopsis writes it, and what shell completion offers after it.

    The usage in ``agentd --help``, the did-you-mean for a mistyped command or flag and the completion
    scripts (:mod:`agentd.config.completion`) all read :data:`SUBCOMMANDS`, so none can forget a command.
    ``check``, ``run`` and ``transcript`` take their flags from :data:`FLAGS`; the others list their own
    (``tests/cli/test_completion.py`` checks each list against that command's ``--help``: a flag missing
    here would be refused as mistyped).
    """

    name: str
    #: The synopsis after ``agentd ``, and the one-line summary beside it.
    synopsis: str
    summary: str
    #: The words its first argument takes (``journal list|show|export``), for completion.
    words: tuple[str, ...] = ()
    #: Its own flags as ``--flag`` or ``--flag=METAVAR`` (PATH, FILE, DIR: a file name), for completion;
    #: commands of the flag table take theirs from :data:`FLAGS`.
    flags: tuple[str, ...] = ()
    #: Its first argument is a ``file`` or a ``dir`` (completion offers their names), else ``""``.
    takes: Literal["", "file", "dir"] = ""


SUBCOMMANDS: Final[tuple[Subcommand, ...]] = (
    Subcommand("check", "check --mcp NAME=URL ...", "connect, list tools/resources, print a report"),
    Subcommand("run", "run MANIFEST.yaml ...", "run an agent manifest against a host config", takes="file"),
    Subcommand("transcript", "transcript show|list ...", "show durable run transcripts", words=("show", "list")),
    Subcommand("journal", "journal list|show|export", "read the durable run journal",
               words=("list", "show", "export"), flags=("--state-dir=PATH", "--limit=N", "--status=STATUS", "--json")),
    Subcommand("ctl", "ctl status|pause|resume|...", "a running daemon's operator controls",
               words=("status", "pause", "resume", "lame-duck", "cancel", "reload", "approvals", "approve", "deny",
                      "answer"),
               flags=("--socket=PATH", "--state-dir=PATH", "--off", "--reason=TEXT", "--json", "--timeout=SECONDS")),
    Subcommand("cluster", "cluster migrate|status|submit|show", "the cluster database (the [cluster] extra)",
               words=("migrate", "status", "submit", "show"),
               flags=("--cluster=DSN", "--instruction=TEXT", "--output-contract=TEXT", "--id=ID",
                      "--lease-ttl=SECONDS", "--json")),
    Subcommand("report", "report FILE [--json]", "a --report-file as tables for a person", flags=("--json",),
               takes="file"),
    Subcommand("top", "top URL [--tls-ca PATH]", "a serving daemon's live run tree, in the terminal",
               flags=("--bearer=REF", "--tls-ca=PATH")),
    Subcommand("trace", "trace FILE [--all]", "render a saved JSON-lines event log for a person", flags=("--all",),
               takes="file"),
    Subcommand("init", "init [DIR] [--force]", "write a commented starter DIR/agentd.yaml", flags=("--force",),
               takes="dir"),
    Subcommand("completion", "completion bash|zsh|fish", "print a shell completion script",
               words=("bash", "zsh", "fish")),
)
SUBCOMMAND_NAMES: Final = tuple(command.name for command in SUBCOMMANDS)


def _usage() -> str:
    width = max(len(command.synopsis) for command in SUBCOMMANDS) + 2
    lines = [f"agentd {'[run flags]':<{width}} run (--mode once by default) and print one JSON result"]
    lines += [f"       agentd {command.synopsis:<{width}} {command.summary}" for command in SUBCOMMANDS]
    lines.append("       agentd --version | --help")
    return "\n".join(lines)


USAGE: Final = _usage()

#: What bare ``agentd`` (nothing to do) prints on stderr before exiting 2.
SHORT_USAGE: Final = f"""usage: {USAGE}

example: agentd --instruction "Summarise the open TODOs" --intelligence test
Run 'agentd --help' (or 'agentd COMMAND --help') for the flags."""

EPILOG: Final = """environment: every flag marked [env] is also read from AGENTD_<FLAG> (AGENT_<FLAG> accepted);
precedence: defaults < --config file < environment < flags. Durations: 250ms, 1.5s, 10m, 2h or seconds.
exit codes: 0 ok / clean drain, 1 failure, 2 bad config or usage, 3 partial, 4 intelligence, 5 refused,
6 required MCP server failed, 7 budget exhausted. See docs/cli.md."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`ConfigError` (one line, exit 2) instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def build_parser(prog: str = "agentd", *, description: str | None = None,
                 command: Command = "agentd") -> argparse.ArgumentParser:
    """The parser for ``command`` (``agentd`` also serves ``agentd check``): its flags from the one table."""
    parser = _Parser(
        prog=prog,
        usage=USAGE if prog == "agentd" else None,
        description=description or _DESCRIPTIONS[command],
        epilog=EPILOG,
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if command == "agentd":
        parser.add_argument("--version", action="store_true", help="print the version and exit")
    for dest, metavar, help_text, required, choices in POSITIONALS[command]:
        parser.add_argument(dest, metavar=metavar, help=help_text, nargs=None if required else "?",
                            choices=choices or None)
    groups: dict[str, Any] = {}
    for flag in FLAGS:
        hidden = command == "check" and "check" not in flag.commands and "agentd" in flag.commands
        if command not in flag.commands and not hidden:
            continue
        group = groups.get(flag.group) or groups.setdefault(flag.group, parser.add_argument_group(flag.group))
        # ``agentd check`` accepts the run flags (one flag set serves both) without listing them.
        help_text = argparse.SUPPRESS if hidden else flag.help + (" [env]" if flag.env else "")
        if flag.kind == "bool" and flag.name.startswith("--no-"):
            group.add_argument(flag.name, dest=flag.dest, action="store_true", help=help_text)
        elif flag.kind == "bool":
            group.add_argument(flag.name, dest=flag.dest, action=argparse.BooleanOptionalAction, help=help_text)
        elif flag.kind == "list":
            group.add_argument(flag.name, dest=flag.dest, action="append", metavar=flag.metavar, help=help_text)
        elif flag.kind == "choice":
            group.add_argument(flag.name, dest=flag.dest, choices=flag.choices, help=help_text)
        else:
            group.add_argument(flag.name, dest=flag.dest, metavar=flag.metavar, help=help_text)
    return parser


def subcommand_parser(name: str, description: str, *, epilog: str | None = None) -> argparse.ArgumentParser:
    """The argparse parser of a small ``agentd NAME`` command: its errors are one exit-2 line too."""
    return _Parser(prog=f"agentd {name}", description=description, epilog=epilog, allow_abbrev=False)


def parse_subcommand(parser: argparse.ArgumentParser, name: str, args: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(args)``, but an unknown flag is named with the closest of the command's own flags
    (:data:`SUBCOMMANDS`), and an unexpected word is counted, not shown."""
    namespace, extras = parser.parse_known_args(list(args))
    if extras:
        raise _unknown(name, [item for item in extras if item.startswith("-")],
                       sum(1 for item in extras if not item.startswith("-")))
    return namespace


def check_subcommand_flags(name: str, args: Sequence[str]) -> None:
    """Before a command with its own parser (``journal``, ``ctl``, ...) is imported: a ``--flag`` it does not
    take is exit 2 with the closest one it does (its own parser would say only "unrecognized")."""
    entry = next(command for command in SUBCOMMANDS if command.name == name)
    known = {flag.partition("=")[0] for flag in entry.flags} | {"--help"}
    unknown = []
    for item in args:
        if item == "--":
            break
        if item.startswith("--") and item.split("=", 1)[0] not in known:
            unknown.append(item)
    if unknown:
        raise _unknown(name, unknown, 0)


def _unknown(name: str, flags: Sequence[str], others: int) -> ConfigError:
    import difflib

    entry = next(command for command in SUBCOMMANDS if command.name == name)
    known = [flag.partition("=")[0] for flag in entry.flags] + ["--help"]
    parts = []
    for item in flags:
        flag = item.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.7)
        parts.append(f"unknown flag {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
    if others:
        parts.append(f"{others} unexpected argument{'s' if others > 1 else ''} (values not shown)")
    return ConfigError("; ".join(parts) + f" (see agentd {name} --help)")


@functools.cache
def _cached_parser(command: Command) -> argparse.ArgumentParser:
    # Building 50 arguments costs ~2 ms; parse_args does not mutate the parser, so one per command is enough.
    return build_parser(PROGS[command], command=command)


PROGS: Final[dict[Command, str]] = {"agentd": "agentd", "check": "agentd check", "run": "agentd run",
                                    "transcript": "agentd transcript"}


def suggest(name: str, command: Command = "agentd") -> str | None:
    """The flag of ``command`` closest to a mistyped ``name`` (``--max-step`` -> ``--max-steps``), if any
    is close. A suggestion only: the mistyped flag is still an error."""
    import difflib

    known = [flag.name for flag in FLAGS if command in flag.commands]
    if command == "agentd":
        known += ["--version", "--help"]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    return close[0] if close else None


def unknown_command(word: str) -> ConfigError:
    """The error for ``agentd WORD`` where WORD is no command (bare ``agentd`` takes no positional). The
    word is named only when it is close to a command: an unrelated word may be a value typed in the wrong
    place (a token), and error lines never carry values."""
    import difflib

    close = difflib.get_close_matches(word, SUBCOMMAND_NAMES, n=1, cutoff=0.6)
    if close:
        return ConfigError(f"unknown command {word!r} (did you mean {close[0]}?) (see agentd --help)")
    return ConfigError(f"unexpected argument (value not shown): the commands are {', '.join(SUBCOMMAND_NAMES)} "
                       "(see agentd --help)")


def parse_flags(argv: Sequence[str], *, command: Command = "agentd") -> dict[str, Any]:
    """The flags (and positionals) actually given, by dest, as raw strings/bools/lists (conversion happens
    in ``load``).

    Unknown arguments are reported by name only: a mistyped ``--intelligence-tokn sk-...`` must not put
    the token into an error line.
    """
    namespace, extras = _cached_parser(command).parse_known_args(list(argv))
    if extras:
        flags = [item.split("=", 1)[0] for item in extras if item.startswith("-")]
        others = len(extras) - len(flags)
        named = []
        for flag in flags:
            close = suggest(flag, command)
            named.append(f"{flag} (did you mean {close}?)" if close else flag)
        parts = [f"unknown flag{'s' if len(flags) > 1 else ''} {', '.join(named)}"] if flags else []
        if others:
            parts.append(f"{others} unexpected argument{'s' if others > 1 else ''} (values not shown)")
        raise ConfigError("; ".join(parts) + f" (see {PROGS[command]} --help)")
    return vars(namespace)
