"""The command line: argv -> Config -> ``trio.run(agentd.daemon.main, cfg)`` -> one JSON line and an exit code.

::

    agentd [run flags]              run (--mode once by default); stdout: {run_id, status, done, partial, ...}
    agentd check [flags]            connect to every declared server and print what an agent could use
    agentd run MANIFEST [...]       an agent manifest against a host config (agentd.connections)
    agentd transcript ...           durable transcripts (agentd.connections)
    agentd journal list|show|export the durable run journal (agentd.journal)
    agentd report FILE              a --report-file as tables for a person (the one command whose stdout is text)

stdout carries exactly one JSON document; stderr carries JSON event lines only. Exit codes are the
original agentd's (docs/cli.md): errors map through ``AgentdError.exit_code``; anything unexpected is 1.

Start-up stays cheap: this module imports only the standard library and attrs at the top, so ``--help`` and the
subagent re-exec (``AGENT_SUBAGENT=1``, dispatched before any parsing) never load httpx, hypercorn or
jsonschema.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from agentd.config import Config
    from agentd.events import EventLog

#: The original agentd's re-exec marker: a subagent child is ``python -m agentd`` with this set to 1.
SUBAGENT_ENV = "AGENT_SUBAGENT"


def console_main() -> None:
    """Entry point of the ``agentd`` console script and ``python -m agentd``."""
    sys.exit(main(sys.argv[1:]))


def main(argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run the command line and return the exit code (never raises, except SystemExit from --help)."""
    env = dict(os.environ) if env is None else env
    if env.get(SUBAGENT_ENV) == "1":
        return _subagent()
    argv = list(argv)
    try:
        if argv and argv[0] == "check":
            return _check(argv[1:], env)
        if argv and argv[0] in ("run", "transcript"):
            return _delegate(argv[0], argv[1:])
        if argv and argv[0] == "report":
            return _report(argv[1:])
        if argv and argv[0] == "journal":
            from agentd.journal.cli import journal_main

            return journal_main(argv[1:], env)
        return _run(argv, env)
    except SystemExit:
        raise
    except BaseException as raised:
        from agentd.errors import AgentdError

        exc = _leaf(raised)
        if isinstance(exc, KeyboardInterrupt):
            _fail("interrupted", 1)
            return 1
        if isinstance(exc, AgentdError):
            _fail(str(exc), int(exc.exit_code), config=int(exc.exit_code) == 2)
            return int(exc.exit_code)
        _fail(f"unexpected {type(exc).__name__}: {exc}", 1)
        return 1


def _leaf(exc: BaseException) -> BaseException:
    """The error to report from a (possibly nested) exception group: the first agentd error, else the first
    leaf. trio wraps whatever escapes a nursery in a group; the exit code belongs to what is inside."""
    from agentd.errors import AgentdError

    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for inner in e.exceptions:
                walk(inner)
        else:
            leaves.append(e)

    walk(exc)
    for leaf in leaves:
        if isinstance(leaf, AgentdError | KeyboardInterrupt):
            return leaf
    return leaves[0] if leaves else exc


# --- subcommands -------------------------------------------------------------------------------------


def _subagent() -> int:
    """The hidden control mode: the supervisor's child entry, before any argv parsing."""
    child_main = _optional("agentd.supervisor.child", "child_main")
    if child_main is None:
        _fail("subagent mode is not available in this build", 1)
        return 1
    code = child_main()
    return int(code) if isinstance(code, int) else 0


def _run(argv: list[str], env: dict[str, str]) -> int:
    if "--help" in argv or "-h" in argv:
        from agentd.config.argv import build_parser

        build_parser().print_help()
        return 0
    if "--version" in argv:
        from agentd._version import __version__

        print(f"agentd {__version__}")
        return 0
    from agentd.config.load import load_config

    config = load_config(argv, env)
    log = _root_log(config)
    if config.validate_config:
        _print_json({"valid": True, "config": effective_config(config)})
        return 0
    log.info("config.loaded", mode=config.mode, servers=[s.name for s in config.mcp],
             config_path=config.config_path)
    daemon_main = _optional("agentd.daemon", "main")
    if daemon_main is None:
        _fail("agentd.daemon is not available in this build", 1)
        return 1
    outcome = _trio_run_with_drain(daemon_main, config, log)
    result = outcome.result
    if result is None:
        # Cancelled by the drain timeout (a clean drain, 0) or by a second signal (forced, 1).
        _print_json(_cancelled_doc(config))
        code = 1 if outcome.forced else 0
    else:
        _print_json(result.to_json() if hasattr(result, "to_json") else result)
        code = int(getattr(result, "exit_code", 1))
        if outcome.drained and not outcome.forced and str(getattr(result, "status", "")) == "cancelled":
            code = 0  # the run was cancelled *because* we asked it to drain: that is success
        if code in (3, 7) and config.budget_exit_code is not None:
            code = config.budget_exit_code
    log.info("proc.exit", exit_code=code)
    return code


def _check(argv: list[str], env: dict[str, str]) -> int:
    if "--help" in argv or "-h" in argv:
        from agentd.config.argv import build_parser

        build_parser("agentd check", description="Connect to every declared MCP server, perform the "
                     "handshake, list tools and resources, and print one JSON report.").print_help()
        return 0
    from agentd.config.load import load_config

    config = load_config(argv, env, purpose="check")
    log = _root_log(config)
    if config.validate_config:
        _print_json({"valid": True, "config": effective_config(config)})
        return 0
    run_check = _optional("agentd.client.check", "run_check")
    if run_check is None:
        _fail("agentd check is not available in this build", 2)
        return 2
    import inspect

    import trio

    from agentd.secrets import SecretResolver

    secrets = SecretResolver(env, log.redactor)

    async def check() -> tuple[dict[str, Any], int]:
        outcome = run_check(config.mcp, log=log, secrets=secrets)  # async in agentd.client.check
        return await outcome if inspect.isawaitable(outcome) else outcome  # type: ignore[no-any-return]

    doc, code = trio.run(check)
    _print_json(doc)
    return int(code)


def _report(args: list[str]) -> int:
    """``agentd report FILE [--json]``: a ``--report-file`` as tables for a person (``--json``: the documents)."""
    import argparse

    from agentd.telemetry.report import load, render

    parser = argparse.ArgumentParser(prog="agentd report", description="Render a --report-file for a person.")
    parser.add_argument("file", help="the file --report-file wrote")
    parser.add_argument("--json", action="store_true", help="print the documents as one JSON object instead")
    options = parser.parse_args(args)
    try:
        docs = load(options.file)
    except (OSError, ValueError) as exc:
        _fail(f"agentd report {options.file}: cannot read ({getattr(exc, 'strerror', None) or exc})", 2)
        return 2
    if options.json:
        _print_json({"trees": docs})
    else:
        sys.stdout.write(render(docs))
        sys.stdout.flush()
    return 0


def _delegate(command: str, args: list[str]) -> int:
    """``agentd run`` / ``agentd transcript`` belong to agentd.connections (host config, manifests)."""
    entry = {"run": "run_manifest", "transcript": "transcript_main"}[command]
    function = _optional("agentd.connections.cli", entry)
    if function is None:
        _fail(f"agentd {command}: not available in this build", 2)
        return 2
    import inspect

    if inspect.iscoroutinefunction(function):
        import trio

        outcome = trio.run(function, args)
    else:
        outcome = function(args)
    return int(outcome) if isinstance(outcome, int) else 0


def _optional(module: str, attribute: str) -> Callable[..., Any] | None:
    """``module.attribute`` if that part is built yet; a *broken* import inside it still raises."""
    import importlib

    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            return None
        raise
    found = getattr(loaded, attribute, None)
    return found if callable(found) else None


# --- running the daemon under signals -------------------------------------------------------------------


@attrs.frozen
class DrainOutcome:
    """What ``daemon_main`` returned (None if it was cancelled), and whether a drain or a force happened."""

    result: Any
    drained: bool
    forced: bool


def _trio_run_with_drain(daemon_main: Callable[..., Any], config: Config, log: EventLog) -> DrainOutcome:
    """``trio.run(daemon_main, config)`` with SIGTERM/SIGINT turned into a drain (see agentd.drain)."""
    import trio

    from agentd.drain import run_with_signals

    main = functools.partial(daemon_main, config)
    run = trio.run(functools.partial(run_with_signals, main, drain_timeout=config.drain_timeout, log=log))
    return DrainOutcome(run.result, drained=run.drained, forced=run.forced)


# --- output ------------------------------------------------------------------------------------------


def effective_config(config: Config) -> dict[str, Any]:
    """The Config as JSON (secrets are references, so this is safe to print)."""
    return attrs.asdict(config)


def _cancelled_doc(config: Config) -> dict[str, Any]:
    return {
        "run_id": config.run_id,
        "status": "cancelled",
        "done": False,
        "partial": True,
        "result": None,
        "steps": 0,
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _print_json(doc: Any) -> None:
    try:
        sys.stdout.write(json.dumps(doc, ensure_ascii=False, default=str) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        pass


def _root_log(config: Config) -> EventLog:
    from agentd.events import EventLog

    return EventLog(level=config.log_level, run_id=config.run_id, log_content=config.log_content, comp="proc")


def _fail(message: str, code: int, *, config: bool = False) -> None:
    """One stderr JSON line for an error that ends the process (the message never holds a secret value)."""
    from agentd.events import EventLog

    EventLog(comp="proc").error("config.invalid" if config else "proc.exit", error=message, exit_code=code)
