"""``agentd run MANIFEST --config host.yaml [--runtime-module PATH] [--stream]`` and ``agentd transcript``.

Order of work (docs/connections.md): read and check the host config and the manifest, load the runtime
module and list its tools, bind the manifest to the host (every problem, with its path: exit 2), and only
then open anything: the transcript store, the intelligence, the MCP connections (after the host's
``authorize_connection`` verdicts), then the steps.

stdout: the result document ``{run_id, status, done, partial, result, steps, usage, outputs[, error]}``.
With ``--stream`` every event goes to stdout too, as JSON lines, and the result is the last line.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any, Protocol, TextIO

import attrs
import trio

from agentd import defaults
from agentd.agent.result import RunResult, RunStatus
from agentd.config.endpoints import parse_mcp_flag
from agentd.config.host import AuthClientCredentials, AuthOAuth, Host, load_host
from agentd.config.load import load_command
from agentd.config.model import McpServerConfig
from agentd.config.structure import EnvRef
from agentd.connections.auth import (
    ClientCredentialsAuth,
    ClientCredentialsSettings,
    ConnectionAuthError,
    ProviderAuth,
)
from agentd.connections.model import Manifest
from agentd.connections.plan import BoundConnection, Plan, bind, load_manifest
from agentd.connections.runtime import RuntimeModule, http_client_factory, load_runtime_module
from agentd.connections.steps import Identity, ManifestResult, run_steps
from agentd.connections.transcript import (
    FLUSH_GRACE,
    Transcript,
    default_path,
    list_runs,
    open_transcript,
    read_run,
)
from agentd.errors import AgentdError, ConfigError, McpConnectError, flatten
from agentd.formats.ids import new_run_id
from agentd.formats.jsontext import escape_controls
from agentd.oversight import drain
from agentd.run import (
    Gateway,
    ended,
    is_cancellation,
    open_run,
    outcome_of,
    reraise_if_not_an_outcome,
    started,
)
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog, stream_sink
from agentd.transport.egress import EgressPolicy
from agentd.transport.http_client import tls_context
from agentd.transport.tls import default_context


class ResultPromise(Protocol):
    """What ``agentd.cli`` hands ``agentd run``: told the run id (and the redactor) as soon as they are known,
    it writes the result document, and prints a ``crashed`` one if the run dies before that."""

    def promise(self, run_id: str, redactor: Any = None) -> None: ...

    def write(self, doc: Any, out: Any = None) -> None: ...


def _write_result(promise: ResultPromise | None, doc: Any, out: TextIO) -> None:
    if promise is not None:
        promise.write(doc, out)
        return
    out.write(escape_controls(json.dumps(doc, ensure_ascii=False, default=str)) + "\n")
    out.flush()


def _mcp_flags(values: Sequence[str]) -> tuple[McpServerConfig, ...]:
    servers = []
    for value in values:
        name, url = parse_mcp_flag(value)
        servers.append(McpServerConfig(name=name, url=url))
    return tuple(servers)


@attrs.frozen
class Prepared:
    """Everything ``agentd run`` checked before opening anything (the files, the module, the intelligence)."""

    host: Host
    manifest: Manifest
    manifest_path: str
    runtime: RuntimeModule
    endpoints: list[str]
    model: str
    token: str | None
    identity: Identity
    transcript_path: str | None
    stream: bool
    log_level: str
    env: Mapping[str, str]
    drain_timeout: float = defaults.DRAIN_TIMEOUT


def prepare(args: Sequence[str], env: Mapping[str, str]) -> Prepared:
    """Parse ``agentd run`` arguments (the flag table's ``run`` flags, agentd.config.argv) and read and check
    every file (ConfigError: exit 2)."""
    options = load_command(args, env, "run")
    host = load_host(options.get("config_path"), env, mcp_flags=_mcp_flags(options.get("mcp", ())))
    manifest = load_manifest(options["manifest"])
    runtime = load_runtime_module(options.get("runtime_module"))
    endpoints, model, token = _intelligence(options, host.intelligence, env, f"--config {host.path} $.intelligence.url")
    transcript_path = None
    if not options.get("no_transcript", False) and host.transcript.enabled:
        transcript_path = options.get("transcript") or host.transcript_path or default_path(env)
    identity = Identity(options.get("run_id") or new_run_id(), options.get("user"), options.get("tenant"))
    return Prepared(host, manifest, os.path.abspath(options["manifest"]), runtime, endpoints, model, token,
                    identity, transcript_path, options.get("stream", False), options.get("log_level", defaults.LOG_LEVEL), env,
                    options.get("drain_timeout", defaults.DRAIN_TIMEOUT))  # fmt: skip


async def run_prepared(prepared: Prepared, out: TextIO, promise: ResultPromise | None = None) -> ManifestResult:
    """Bind (exit 2 on any problem, before side effects), then run; the result line is written to ``out``
    (through ``promise``, which then knows it was written: agentd.cli prints a crashed document otherwise)."""
    log = EventLog(sink=stream_sink(out if prepared.stream else sys.stderr), level=prepared.log_level,
                   run_id=prepared.identity.run_id, comp="run")  # fmt: skip
    if promise is not None:
        promise.promise(prepared.identity.run_id, log.redactor)
    tools = await prepared.runtime.list_tools()  # the runtime module's tools, before anything is opened
    plan = bind(prepared.host, prepared.manifest, application_tools=[t.name for t in tools],
                manifest_path=prepared.manifest_path)  # fmt: skip
    result = await execute(plan, prepared.runtime, endpoints=prepared.endpoints, model=prepared.model,
                           token=prepared.token, log=log, env=prepared.env, identity=prepared.identity,
                           transcript_path=prepared.transcript_path, manifest_path=prepared.manifest_path)  # fmt: skip
    log.flush()
    _write_result(promise, result.to_json(), out)
    return result


def run_manifest(
    args: Sequence[str], env: Mapping[str, str] | None = None, promise: ResultPromise | None = None
) -> int:
    """The ``agentd run`` subcommand; returns the exit code (ConfigError propagates: exit 2)."""
    prepared = prepare(args, dict(os.environ) if env is None else dict(env))
    if promise is not None:
        promise.promise(prepared.identity.run_id)
    result = trio.run(run_with_signals, prepared, sys.stdout, promise)
    return int(result.run.exit_code)


async def run_with_signals(prepared: Prepared, out: TextIO, promise: ResultPromise | None = None
                           ) -> ManifestResult:
    """:func:`run_prepared` under SIGTERM/SIGINT as ``agentd`` handles them (agentd.oversight.drain): the first signal
    drains (no new step or model call; running work may finish for ``--drain-timeout``, then it is cancelled,
    exit 0), a second one cancels at once (exit 1)."""
    log = EventLog(sink=stream_sink(out if prepared.stream else sys.stderr), run_id=prepared.identity.run_id,
                   comp="proc")  # fmt: skip
    signalled = await drain.run_with_signals(functools.partial(run_prepared, prepared, out, promise),
                                             drain_timeout=prepared.drain_timeout, log=log)
    result, forced = signalled.result, signalled.forced
    if result is None:
        run = RunResult(run_id=prepared.identity.run_id, status=RunStatus.CANCELLED, partial=True,
                        error="forced by a second signal" if forced else "cancelled at the drain timeout",
                        drained=not forced)  # fmt: skip
        result = ManifestResult(run, (), error_code="cancelled")
        _write_result(promise, result.to_json(), out)
    return result


def _intelligence(
    options: Mapping[str, Any], spec: Any, env: Mapping[str, str], where: str
) -> tuple[list[str], str, str | None]:
    from agentd.intelligence.endpoints import parse_endpoints

    token: str | None = None
    model = options.get("model") or (spec.model if spec is not None else defaults.MODEL)
    if options.get("intelligence"):
        raw: list[str] = list(options["intelligence"])
    elif spec is not None:
        urls = spec.url if isinstance(spec.url, list) else [spec.url]
        raw = []
        from agentd.config.endpoints import check_intelligence_endpoint

        for url in urls:
            if isinstance(url, EnvRef):
                if url.env not in env:
                    raise ConfigError(f"environment variable {url.env} is not set @ $.intelligence.url")
                raw.append(env[url.env])
            else:
                raw.append(url)
            # checked here so the error names the host file's key, not a flag the person did not type
            check_intelligence_endpoint(raw[-1], what=where)
        if spec.key is not None:
            if spec.key.env not in env:
                raise ConfigError(f"environment variable {spec.key.env} is not set @ $.intelligence.key")
            token = spec.key.template()
    else:
        raise ConfigError("no intelligence: set intelligence.url in the host config or pass --intelligence")
    return parse_endpoints(raw), model, token


async def execute(
    plan: Plan,
    runtime: RuntimeModule,
    *,
    endpoints: list[str],
    model: str,
    token: str | None,
    log: EventLog,
    env: Mapping[str, str],
    identity: Identity,
    transcript_path: str | None,
    manifest_path: str | None = None,
) -> ManifestResult:
    """Open the transcript, the intelligence and the bound connections, run the steps, close everything."""
    resolver = SecretResolver(env=env, redactor=log.redactor)
    host = plan.host
    started(log, mode="manifest", servers=[b.alias for b in plan.bound], model=model,
            steps=len(plan.manifest.steps), skipped=list(plan.skipped))  # fmt: skip
    result: ManifestResult
    async with AsyncExitStack() as stack:
        transcript = None
        if transcript_path is not None:
            transcript = await stack.enter_async_context(open_transcript(
                transcript_path, run_id=identity.run_id, policy=host.transcript.data_policy,
                retention_days=host.transcript.retention_days,
                manifest=manifest_path, log=log.bind(comp="transcript"),
            ))  # fmt: skip
        try:
            servers, denied = await _servers(plan, runtime, resolver, log, identity, env)
            result = await _connect_and_run(plan, runtime, servers, denied, endpoints=endpoints,
                                            model=model, token=token, log=log, resolver=resolver,
                                            identity=identity, transcript=transcript)  # fmt: skip
        except BaseException as exc:
            if is_cancellation(exc) and transcript is not None:
                with trio.move_on_after(FLUSH_GRACE, shield=True):
                    await transcript.abort("cancelled")
            reraise_if_not_an_outcome(exc, log)
            raise
        if transcript is not None:
            await transcript.end(result.run.status.value, result.run.result)
    ended(log, result.run)
    return result


#: ``agentd run``'s error codes for the run outcomes that have their own (docs/connections.md).
_ERROR_CODES = {RunStatus.MCP_FAILED: "connection_failed", RunStatus.INTELLIGENCE_FAILED: "intelligence_failed"}


async def _connect_and_run(
    plan: Plan,
    runtime: RuntimeModule,
    servers: list[McpServerConfig],
    denied: McpConnectError | None,
    *,
    endpoints: list[str],
    model: str,
    token: str | None,
    log: EventLog,
    resolver: SecretResolver,
    identity: Identity,
    transcript: Transcript | None,
) -> ManifestResult:
    """Open the intelligence and the MCP pool (agentd.run) and run the steps; what the run ends as by the one
    rule (a connection down, the gateway, the deadline while connecting) becomes the result."""
    gateway = Gateway(tuple(endpoints), model, token)
    try:
        if denied is not None:
            raise denied
        # ``deadlineMs`` bounds the whole run: connecting spends it too; once connected, run_steps owns the rest.
        async with open_run(gateway, servers, log=log, secrets=resolver, run_id=identity.run_id,
                            deadline=plan.manifest.limits.deadline_ms / 1000,
                            egress=plan.host.egress.policy()) as opened:
            return await run_steps(plan, runtime, pool=opened.pool, intel=opened.intel, log=log,
                                   identity=identity, transcript=transcript, deadline=opened.end)  # fmt: skip
    except BaseException as exc:
        leaf = flatten(exc)
        if is_cancellation(exc) or isinstance(leaf, ConfigError) or not isinstance(leaf, AgentdError):
            raise  # not a run outcome (cancellation, a config error), or a bug for the CLI's crash document
        run = outcome_of(exc, run_id=identity.run_id, log=log)
        code = leaf.code if isinstance(leaf, ConnectionAuthError) else _ERROR_CODES.get(run.status)
        return ManifestResult(run, (), error_code=code)


async def _servers(
    plan: Plan,
    runtime: RuntimeModule,
    resolver: SecretResolver,
    log: EventLog,
    identity: Identity,
    env: Mapping[str, str],
) -> tuple[list[McpServerConfig], McpConnectError | None]:
    """Each binding's server entry with its auth, after the host's ``authorize_connection`` verdict."""
    servers: list[McpServerConfig] = []
    for bound in plan.bound:
        decision = await runtime.authorize("connection", {
            "runId": identity.run_id, "user": identity.user, "tenant": identity.tenant,
            "connection": bound.binding.ref, "alias": bound.alias, "mode": bound.mode,
            "tools": list(bound.tools) if bound.tools is not None else None, "url": bound.connection.url,
        })  # fmt: skip
        if not decision.allowed:
            reason = decision.reason or "not authorized"
            log.warn("connection.auth", connection=bound.alias, status="denied", reason=reason)
            if bound.binding.required and bound.connection.required:
                return servers, ConnectionAuthError(
                    f"connection {bound.alias!r} was denied by host policy: {reason}",
                    server=bound.alias, code="connection_denied",
                )  # fmt: skip
            continue
        tls = bound.connection.tls
        factory = http_client_factory(
            runtime.http_policy, connection=bound.binding.ref, alias=bound.alias, url=bound.connection.url,
            verify=tls_context(tls.ca, tls.cert, tls.key) if tls is not None else default_context(),
        )  # fmt: skip
        auth = _auth_for(bound, runtime, resolver, log, identity, env, plan.host.egress.policy())
        servers.append(bound.server_config(auth, factory))
    return servers, None


def _pem(name: str, env: Mapping[str, str], log: EventLog) -> str:
    """A PEM key from the environment (multi-line, so not a header template); every line is redacted."""
    value = env.get(name)
    if value is None:
        raise ConfigError(f"environment variable {name} is not set (privateKey)")
    log.redactor.add(value)
    for line in value.splitlines():
        if len(line) >= 16 and not line.startswith("-----"):
            log.redactor.add(line)
    return value


def _auth_for(
    bound: BoundConnection,
    runtime: RuntimeModule,
    resolver: SecretResolver,
    log: EventLog,
    identity: Identity,
    env: Mapping[str, str],
    egress: EgressPolicy,
) -> object | None:
    auth = bound.connection.auth
    if isinstance(auth, AuthOAuth):
        if runtime.connection_credentials is None:
            raise ConfigError(
                f"connection {bound.binding.ref!r} uses auth type oauth; the runtime module must export "
                "connection_credentials (--runtime-module)"
            )
        return ProviderAuth(runtime.connection_credentials, bound.binding.ref, bound.alias, auth.profile,
                            bound.connection.url, log, run_id=identity.run_id)  # fmt: skip
    if isinstance(auth, AuthClientCredentials):
        settings = ClientCredentialsSettings(
            client_id=resolver.resolve(auth.client_id.template()),
            client_secret=resolver.resolve(auth.client_secret.template()) if auth.client_secret else None,
            private_key_pem=_pem(auth.private_key.env, env, log) if auth.private_key else None,
            scopes=tuple(auth.scopes),
            method=auth.token_endpoint_auth_method,
            signing_algorithm=auth.signing_algorithm,
        )
        return ClientCredentialsAuth(settings, bound.alias, bound.connection.url, log, egress=egress)
    return None


# --- agentd transcript -----------------------------------------------------------------------------------


def transcript_main(args: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """``agentd transcript show RUN_ID`` / ``agentd transcript list`` (``--config host.yaml`` or ``--db``)."""
    env = dict(os.environ) if env is None else dict(env)
    options = load_command(args, env, "transcript")
    path = options.get("db")
    if path is None and options.get("config_path") is not None:
        path = load_host(options["config_path"], env).transcript_path
    path = path or default_path(env)
    if options["action"] == "list":
        print(json.dumps({"runs": list_runs(path)}, default=str))
        return 0
    run_id = options.get("run_id")
    if not run_id:
        raise ConfigError("agentd transcript show: RUN_ID is required")
    doc = read_run(path, run_id)
    if doc is None:
        print(json.dumps({"error": f"no transcript for run {run_id!r}"}))
        return 1
    print(escape_controls(json.dumps(doc, ensure_ascii=False, default=str)))
    return 0


__all__ = ("AgentdError", "execute", "run_manifest", "transcript_main")
