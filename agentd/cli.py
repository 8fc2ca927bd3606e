"""The command line: argv -> Config -> ``trio.run(agentd.daemon.main, cfg)`` -> one JSON line and an exit code.

::

    agentd [run flags]              run (--mode once by default); stdout: {run_id, status, done, partial, ...}
    agentd check [flags]            connect to every declared server and print what an agent could use
    agentd run MANIFEST [...]       an agent manifest against a host config (agentd.connections)
    agentd transcript ...           durable transcripts (agentd.connections)
    agentd journal list|show|export the durable run journal (agentd.journal)
    agentd ctl COMMAND              a running daemon's operator controls (agentd.ctl)
    agentd cluster migrate|status|submit|show   the cluster database (agentd.cluster)
    agentd report FILE              a --report-file as tables for a person (stdout is text, not JSON)
    agentd top URL                  a serving daemon's live run tree in the terminal (stdout is the screen)
    agentd trace FILE               a saved event log told for a person (agentd.terminal)
    agentd init [DIR]               write a starter DIR/agentd.yaml (agentd.config.starter)
    agentd completion SHELL         a bash, zsh or fish completion script (agentd.config.completion)

Any other first word is a mistyped command: exit 2, with the command it is closest to (agentd.config.argv's
:data:`SUBCOMMANDS` lists them all, for ``--help``, did-you-mean and completion alike).

stdout carries exactly one JSON document (``--output human``: the same document drawn for a person);
stderr carries JSON event lines, or at a terminal the live view of agentd.terminal (``--log-format``). Which
sink the process logs through is decided in one place, :func:`_root_log`. Exit codes are the
original agentd's (docs/cli.md): errors map through ``AgentdError.exit_code``; anything unexpected is 1.
Bare ``agentd`` with nothing configured prints the short usage on stderr and exits 2.

The one-document guarantee is kept here, in :func:`main`, for every command that promises a result
document (``agentd``, ``agentd run``, ``agentd check``): each registers its run id with a
:class:`ResultPromise` as soon as it knows it and writes its document through it. An unexpected exception
that escapes before the document was written still prints ``{run_id, status: "crashed", done: true, ...,
error: "Type: short message"}`` (the message scrubbed of secret values and cut short) and exits 1.
Configuration errors (exit 2) keep stdout empty: nothing ran.

Start-up stays cheap: this module imports only the standard library at the top (not even attrs: its two
values are a plain class and a ``NamedTuple``), so ``--help`` and the subagent re-exec (``AGENT_SUBAGENT=1``, dispatched before any parsing) never load httpx, httpcore,
jsonschema or rich (rich only once a human view was chosen).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from agentd.formats import jsontext as json_text

if TYPE_CHECKING:
    from agentd.config import Config
    from agentd.telemetry.events import EventLog, Redactor

#: The original agentd's re-exec marker: a subagent child is ``python -m agentd`` with this set to 1.
SUBAGENT_ENV = "AGENT_SUBAGENT"


#: Set by :func:`console_main`: this process is the command (not a harness calling :func:`main`), so what
#: its start-up loaded may be frozen for its lifetime (:func:`_loading`).
_WHOLE_PROCESS = False


def console_main() -> None:
    """Entry point of the ``agentd`` console script and ``python -m agentd``."""
    global _WHOLE_PROCESS
    _WHOLE_PROCESS = True
    exit_now(main(sys.argv[1:]))


def exit_now(code: int) -> NoReturn:
    """End the process with ``code``, skipping the interpreter's teardown of every module when no other
    thread is alive: the ``atexit`` callbacks (logging's shutdown, say) run and output is flushed, as at an
    ordinary exit, but the objects the kernel frees anyway are not freed one by one (a tenth of a once
    run's CPU). With another thread alive, or a flush that fails, the process exits the ordinary way."""
    import _thread  # its count of running threads besides this one (trio's idle workers count too)
    import atexit

    if _thread._count() == 0:
        atexit._run_exitfuncs()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            sys.exit(code)
        os._exit(code)
    sys.exit(code)


#: Characters of an exception message kept in a crashed result's ``error``.
CRASH_MESSAGE_CHARS = 300


class ResultPromise:
    """A command's promise of one result document on stdout: its run id once known, whether it was written,
    and the redactor whose secret values the crash message must not carry. (A plain class: every command
    makes one, ``--help`` too, which must not import attrs.)"""

    __slots__ = ("color", "human", "redactor", "run_id", "written")

    def __init__(self, run_id: str | None = None, written: bool = False, redactor: Redactor | None = None,
                 human: bool = False, color: bool = True) -> None:
        self.run_id = run_id
        self.written = written
        self.redactor = redactor
        #: ``--output human``: draw the document for a person (a crash still prints one, drawn or as JSON).
        self.human = human
        self.color = color

    def promise(self, run_id: str, redactor: Redactor | None = None) -> None:
        self.run_id = run_id
        if redactor is not None:
            self.redactor = redactor

    def write(self, doc: Any, out: Any = None) -> None:
        """Write the result document (one JSON line) to ``out`` (default stdout), scrubbed of every
        registered secret value (a server may have echoed one into a result or an error)."""
        self.written = True
        if self.redactor is not None:
            doc = self.redactor.scrub_value(doc)
        out = sys.stdout if out is None else out
        if self.human:
            try:
                from agentd.terminal.render import result_text

                result_text(doc, out, color=self.color)
                return
            except BrokenPipeError:
                return
            except Exception:
                pass  # drawing failed: the document itself still reaches the reader
        _print_json(doc, out)

    def error_of(self, exc: BaseException) -> str:
        """``Type: message``, the message on one line, scrubbed and cut to :data:`CRASH_MESSAGE_CHARS`."""
        message = str(exc)
        if self.redactor is not None:
            message = self.redactor.scrub(message)
        message = " ".join(message.split())
        if len(message) > CRASH_MESSAGE_CHARS:
            message = message[:CRASH_MESSAGE_CHARS] + "…"
        return f"{type(exc).__name__}: {message}" if message else type(exc).__name__

    def crashed(self, exc: BaseException) -> dict[str, Any]:
        """The result document of a command that crashed before it wrote its own."""
        return {
            "run_id": self.run_id,
            "status": "crashed",
            "done": True,
            "partial": True,
            "result": None,
            "steps": 0,
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            "error": self.error_of(exc),
        }


#: The commands whose parsers live with them (their flags are listed in agentd.config.argv's SUBCOMMANDS).
_OWN_PARSERS = frozenset({"journal", "ctl", "cluster", "report", "top", "trace"})


def main(argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run the command line and return the exit code (never raises, except SystemExit from --help)."""
    env = dict(os.environ) if env is None else env
    if env.get(SUBAGENT_ENV) == "1":
        return _subagent()
    argv = list(argv)
    promise = ResultPromise()
    human = _stderr_human(argv, env)
    try:
        if argv and argv[0] in _OWN_PARSERS:
            from agentd.config.argv import check_subcommand_flags

            check_subcommand_flags(argv[0], argv[1:])  # did-you-mean, before the command's modules load
        if argv and argv[0] == "check":
            return _check(argv[1:], env, promise)
        if argv and argv[0] in ("run", "transcript"):
            return _delegate(argv[0], argv[1:], promise)
        if argv and argv[0] == "report":
            return _report(argv[1:])
        if argv and argv[0] == "top":
            from agentd.terminal.top import top_main

            return top_main(argv[1:], env)
        if argv and argv[0] == "journal":
            from agentd.config.argv import flag_named
            from agentd.journal.cli import journal_main

            return journal_main(argv[1:], env, state_dir_envs=flag_named("--state-dir").env_names,
                                human=_human_stdout(env, "journal_text"))
        if argv and argv[0] == "ctl":
            from agentd.config.argv import flag_named
            from agentd.ctl.cli import ctl_main

            return ctl_main(argv[1:], env, socket_envs=flag_named("--ctl-socket").env_names,
                            state_dir_envs=flag_named("--state-dir").env_names, human=_human_stdout(env, "ctl_text"))
        if argv and argv[0] == "cluster":
            from agentd.config.extras import require

            require("cluster", "agentd cluster")  # psycopg: only for this command (its --help imports it too)
            from agentd.cluster.cli import cluster_main
            from agentd.config.argv import flag_named

            return cluster_main(argv[1:], env, dsn_envs=flag_named("--cluster").env_names,
                                human=_human_stdout(env, "cluster_text"))
        if argv and argv[0] == "trace":
            from agentd.terminal.trace import trace_main

            return trace_main(argv[1:], env)
        if argv and argv[0] == "completion":
            return _completion(argv[1:])
        if argv and argv[0] == "init":
            from agentd.config.starter import init_main

            return init_main(argv[1:])
        if argv and not argv[0].startswith("-"):
            from agentd.config.argv import unknown_command

            raise unknown_command(argv[0])
        return _run(argv, env, promise)
    except SystemExit:
        raise
    except BaseException as raised:
        from agentd.errors import AgentdError, flatten

        exc = flatten(raised)
        if isinstance(exc, KeyboardInterrupt):
            _fail("interrupted", 1, human=human)
            return 1
        if isinstance(exc, AgentdError):
            if not argv and int(exc.exit_code) == 2:
                from agentd.config.argv import SHORT_USAGE

                # Bare ``agentd`` with nothing configured: a person typed it; tell them how to use it.
                print(f"{SHORT_USAGE}\n\nagentd: {exc}", file=sys.stderr)
                return 2
            _fail(str(exc), int(exc.exit_code), config=int(exc.exit_code) == 2, human=human)
            return int(exc.exit_code)
        _fail(f"unexpected {promise.error_of(exc)}", 1, human=human)
        if promise.run_id is not None and not promise.written:
            promise.write(promise.crashed(exc))
        return 1


# --- subcommands -------------------------------------------------------------------------------------


def _subagent() -> int:
    """The hidden control mode: the supervisor's child entry, before any argv parsing."""
    from agentd.child.entry import child_main

    return child_main()


def _audit_trifecta(config: Any, log: Any) -> None:
    """``--allow-trifecta`` is audited: which servers bring each property, and whether it was needed."""
    from agentd.security.rule_of_two import catalogue_tags, check_trifecta

    verdict = check_trifecta(catalogue_tags(((s.name, s.tags) for s in config.mcp),
                                            ((p.name, p.tags) for p in config.a2a_peers)))
    log.warn("security.trifecta_allowed", needed=verdict.complete,
             **{tag: list(names) for tag, names in verdict.sources.items()})


def _run(argv: list[str], env: dict[str, str], promise: ResultPromise) -> int:
    if "--help" in argv or "-h" in argv:
        from agentd.config.argv import build_parser

        build_parser().print_help()
        return 0
    if "--version" in argv:
        from agentd._version import __version__

        print(f"agentd {__version__}")
        return 0
    from agentd.config.argv import parse_flags

    parse_flags(argv)  # an unknown or mistyped flag is told before the run machinery loads
    with _loading():
        from agentd.config.load import load_config

        config = load_config(argv, env)
        log = _root_log(config, env)
        if config.validate_config:
            _close_view(log)
            _print_json({"valid": True, "config": effective_config(config)})
            return 0
        promise.promise(config.run_id, log.redactor)
        from agentd.terminal.mode import color_allowed, wants_human

        if wants_human(config.telemetry.output, sys.stdout):  # unset: for a person at a terminal, the JSON through a pipe
            promise.human, promise.color = True, color_allowed(env)
        log.info("config.loaded", mode=config.mode, servers=[s.name for s in config.mcp],
                 config_path=config.config_path)
        if config.allow_trifecta:
            _audit_trifecta(config, log)
        from agentd.agent.result import RunResult, RunStatus
        from agentd.daemon import main as daemon_main

    try:
        outcome = _trio_run_with_drain(daemon_main, config, log, reload=functools.partial(load_config, argv, env))
    finally:
        _close_view(log)
    result = outcome.result
    if result is None:
        # Cancelled by the drain timeout (a clean drain, 0) or by a second signal (forced, 1).
        promise.write(_cancelled_doc(config, outcome.spent, outcome.subagents))
        code = 1 if outcome.forced else 0
    else:
        assert isinstance(result, RunResult)
        promise.write(result.to_json())
        code = int(result.exit_code)
        if outcome.drained and not outcome.forced and result.status is RunStatus.CANCELLED:
            code = 0  # the run was cancelled *because* we asked it to drain: that is success
        if code in (3, 7) and config.budgets.exit_code is not None:
            code = config.budgets.exit_code
    log.flush()
    log.info("proc.exit", exit_code=code)
    return code


@contextlib.contextmanager
def _loading() -> Iterator[None]:
    """While a run's modules load, the cyclic collector waits; then, in the command's own process, what was
    loaded is frozen (never scanned again: modules, classes and functions live as long as the process), and
    collection resumes.

    Loading allocates some 100 000 long-lived objects and little garbage, so the collector's passes over them
    (about 60 before a once run's first model request) find next to nothing to free: ~5% of that run's CPU.
    The fork server keeps its pre-imported modules frozen for the same reason (agentd/child/forkserver.py).
    A harness calling :func:`main` in its own process gets the pause only: its objects are not frozen.
    """
    import gc

    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if _WHOLE_PROCESS:
            gc.freeze()
        gc.enable()


def _check(argv: list[str], env: dict[str, str], promise: ResultPromise) -> int:
    if "--help" in argv or "-h" in argv:
        from agentd.config.argv import build_parser

        build_parser("agentd check", command="check").print_help()
        return 0
    from agentd.config.argv import parse_flags

    parse_flags(argv, command="check")  # a mistyped flag is told before the run machinery loads
    from agentd.config.load import load_config

    config = load_config(argv, env, purpose="check")
    log = _root_log(config, env, status=False)
    if config.validate_config:
        _close_view(log)
        _print_json({"valid": True, "config": effective_config(config)})
        return 0
    import trio

    from agentd.client.check import run_check
    from agentd.security.secrets import SecretResolver
    from agentd.terminal.mode import color_allowed, wants_human

    secrets = SecretResolver(env, log.redactor)
    promise.promise(config.run_id, log.redactor)
    if config.intelligence.endpoints:  # a bad endpoint or an unresolvable token is exit 2 before anything connects
        from agentd.intelligence.endpoints import parse_endpoints

        parse_endpoints(config.intelligence.endpoints)
        if config.intelligence.token is not None:
            secrets.resolve(config.intelligence.token)

    async def check_all() -> tuple[dict[str, Any], int]:
        if any(server.credentials is not None for server in config.mcp):  # oauth / client_credentials connections
            from agentd.client.credentials import use_credentials
            from agentd.connections.source import HostCredentials

            with use_credentials(HostCredentials(env, config.egress.policy(), config.runtime_module)):
                doc, code = await run_check(config.mcp, log=log, secrets=secrets)
        else:
            doc, code = await run_check(config.mcp, log=log, secrets=secrets)
        if config.intelligence.endpoints:  # the gateway was given (flag, environment or file): check it too
            from agentd.intelligence.check import check_gateway

            doc["intelligence"] = await check_gateway(
                config.intelligence.endpoints, model=config.intelligence.model, token=config.intelligence.token, log=log,
                secrets=secrets, egress=config.egress.policy())
            if not doc["intelligence"]["ok"]:
                doc["ok"] = False
                code = code or 4  # ExitCode.INTELLIGENCE, as a run whose gateway fails
        return doc, code

    try:
        doc, code = trio.run(check_all)
    finally:
        _close_view(log)
    if wants_human(config.telemetry.output or "auto", sys.stdout):
        from agentd.terminal.render import check_table

        promise.written = True
        check_table(doc, sys.stdout, color=color_allowed(env), control_tools=_control_tools(config))
    else:
        promise.write(doc)
    return int(code)


def _completion(args: list[str]) -> int:
    """``agentd completion bash|zsh|fish``: the shell's completion script on stdout (text, not JSON)."""
    from agentd.config.argv import parse_subcommand, subcommand_parser
    from agentd.config.completion import SHELLS, script

    parser = subcommand_parser("completion", "Print a shell completion script (bash, zsh or fish).",
                               epilog='bash: eval "$(agentd completion bash)" in ~/.bashrc; zsh: the same in '
                                      "~/.zshrc after compinit; fish: agentd completion fish | source")
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete for")
    options = parse_subcommand(parser, "completion", args)
    try:
        sys.stdout.write(script(options.shell))
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return 0


def _report(args: list[str]) -> int:
    """``agentd report FILE [--json]``: a ``--report-file`` as tables for a person at a terminal; through a pipe, or
    with ``--json``, the documents as one JSON object."""
    import argparse

    from agentd.telemetry.report import load, render

    parser = argparse.ArgumentParser(prog="agentd report", description="Render a --report-file for a person.")
    parser.add_argument("file", help="the file --report-file wrote")
    parser.add_argument("--json", action="store_true",
                        help="print the documents as one JSON object even at a terminal (through a pipe it is JSON)")
    options = parser.parse_args(args)
    try:
        docs = load(options.file)
    except (OSError, ValueError) as exc:
        _fail(f"agentd report {options.file}: cannot read ({getattr(exc, 'strerror', None) or exc})", 2)
        return 2
    from agentd.terminal.mode import is_terminal

    if options.json or not is_terminal(sys.stdout):
        _print_json({"trees": docs})
    else:
        from agentd.terminal.visible import visible

        sys.stdout.write(visible(render(docs)))  # names and reasons in the file are shown, never obeyed
        sys.stdout.flush()
    return 0


def _control_tools(config: Config) -> list[str]:
    """The built-in tools a run with ``config`` would offer beside the servers' (``loop.start`` lists them)."""
    from agentd.agent.builtin import NAME as RESOURCE_READ
    from agentd.supervisor.tools import offered_names

    return [*(offered_names() if config.subagents.max_depth > 0 else ()), RESOURCE_READ]


def _delegate(command: str, args: list[str], promise: ResultPromise) -> int:
    """``agentd run`` / ``agentd transcript`` belong to agentd.connections (host config, manifests)."""
    from agentd.config.argv import parse_flags

    # a mistyped flag is told before agentd.connections (trio, httpx, the run machinery) loads
    parse_flags(args, command="run" if command == "run" else "transcript")
    from agentd.connections.cli import run_manifest, transcript_main

    if command == "run":
        return run_manifest(args, promise=promise)
    return transcript_main(args)


# --- running the daemon under signals -------------------------------------------------------------------


class DrainOutcome(NamedTuple):
    """What ``daemon_main`` returned (None if it was cancelled), and whether a drain or a force happened."""

    result: Any
    drained: bool
    forced: bool
    spent: tuple[int, int, int, int] | None = None
    subagents: tuple[int, int, int] | None = None


def _trio_run_with_drain(daemon_main: Callable[..., Any], config: Config, log: EventLog,
                         reload: Callable[[], Config] | None = None) -> DrainOutcome:
    """``trio.run(daemon_main, config)`` with SIGTERM/SIGINT turned into a drain (see agentd.oversight.drain);
    ``reload`` re-reads the configuration for SIGHUP and ``agentd ctl reload``."""
    import trio

    from agentd.oversight.drain import run_with_signals

    # The root log itself (as comp "agent"): one redactor and one rate limiter for the whole process.
    animate = getattr(log.sink, "animate", None)  # the live view's spinner (at a terminal only)
    main = functools.partial(daemon_main, config, log=log.bind(comp="agent"),
                             **({"reload": reload} if reload is not None else {}),
                             **({"beside": animate} if animate is not None else {}))
    run = trio.run(functools.partial(run_with_signals, main, drain_timeout=config.ladder.drain_timeout, log=log))
    return DrainOutcome(run.result, drained=run.drained, forced=run.forced, spent=run.spent,
                        subagents=run.subagents)


# --- output ------------------------------------------------------------------------------------------


def effective_config(config: Config) -> dict[str, Any]:
    """The Config as JSON (secrets are references, so this is safe to print); money as people write it: prices
    in US dollars per million tokens, the budget in US dollars (the Config holds picodollars, agentd.prices)."""
    import attrs

    from agentd.config.model import flattened
    from agentd.prices import usd

    doc = flattened(attrs.asdict(config))
    doc["prices"] = {model: {"input": usd(p.input * 10**6), "output": usd(p.output * 10**6)}
                     for model, p in config.intelligence.prices.items()}
    doc["budget_usd"] = None if config.budgets.usd is None else usd(config.budgets.usd)
    return doc


def _cancelled_doc(config: Config, spent: tuple[int, int, int, int] | None = None,
                   subagents: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """The document of a run the drain's end cut: with the steps and tokens it (and its subagents) had really
    spent. It ended like any other run: ``done`` is true."""
    from agentd.agent.result import RunResult, RunStatus, RunUsage

    steps, prompt, completion, estimated = spent or (0, 0, 0, 0)
    run = RunResult(run_id=config.run_id, status=RunStatus.CANCELLED, partial=True, steps=steps,
                    usage=RunUsage(prompt, completion, estimated), subagents=RunUsage(*(subagents or (0, 0, 0))))
    return run.to_json()


def _print_json(doc: Any, out: Any = None) -> None:
    out = sys.stdout if out is None else out
    try:
        out.write(json_text.escape_controls(json_text.scrub(json.dumps(doc, ensure_ascii=False, default=str))) + "\n")
        out.flush()
    except BrokenPipeError:
        pass


def _root_log(config: Config, env: dict[str, str], *, status: bool = True) -> EventLog:
    """The process's log. The one place its sink is chosen: JSON lines on stderr, or the live view for a
    person (``--log-format human``, or ``auto`` at a terminal); rich is imported only for the latter."""
    from agentd.telemetry.events import EventLog
    from agentd.terminal.mode import color_allowed, wants_human

    log = EventLog(level=config.telemetry.log_level, run_id=config.run_id, log_content=config.telemetry.log_content, comp="proc")
    if wants_human(config.telemetry.log_format, sys.stderr):
        from agentd.terminal.live import HumanView

        log = log.bind(sink=HumanView(sys.stderr, color=color_allowed(env), drain_timeout=config.ladder.drain_timeout,
                                      status=status))
    return log


def _human_stdout(env: dict[str, str], renderer: str) -> Callable[[str, Any], None] | None:
    """A command's document drawn for a person by ``agentd.terminal.render.<renderer>`` when stdout is a
    terminal (rich is imported only then, when it draws), else None: the JSON document as always."""
    from agentd.terminal.mode import color_allowed, is_terminal

    if not is_terminal(sys.stdout):
        return None

    def show(command: str, doc: Any) -> None:
        from agentd.terminal import render

        getattr(render, renderer)(command, doc, sys.stdout, color=color_allowed(env))

    return show


def _close_view(log: EventLog) -> None:
    """Take a live view's status line down before stdout gets the result (JSON lines need nothing)."""
    close = getattr(log.sink, "close", None)
    if callable(close):
        close()


def _stderr_human(argv: list[str], env: dict[str, str]) -> bool:
    """Before any configuration is loaded (an error in it must still be told): ``--log-format`` from argv,
    else the environment, else whether stderr is a terminal."""
    from agentd.config.argv import FLAGS_BY_DEST
    from agentd.terminal.mode import wants_human

    choice: str | None = None
    for index, item in enumerate(argv):
        if item == "--log-format" and index + 1 < len(argv):
            choice = argv[index + 1]
        elif item.startswith("--log-format="):
            choice = item.split("=", 1)[1]
    if choice is None:
        choice = next((env[name] for name in FLAGS_BY_DEST["log_format"].env_names if env.get(name)), None)
    return wants_human(choice, sys.stderr)


def _fail(message: str, code: int, *, config: bool = False, human: bool = False) -> None:
    """One stderr line for an error that ends the process (the message never holds a secret value): the JSON
    event line, or for a person at a terminal a plain ``agentd: error: ...`` line."""
    if human:
        from agentd.terminal.story import error_text

        try:
            print(error_text(message), file=sys.stderr, flush=True)
        except (BrokenPipeError, OSError):
            pass
        return
    from agentd.telemetry.events import EventLog

    EventLog(comp="proc").error("config.invalid" if config else "proc.exit", error=message, exit_code=code)
