"""``agentd ctl``: one operator command to a running daemon over its control socket, one JSON document out.

::

    agentd ctl status | pause | resume | lame-duck [--off] | cancel RUN [--reason TEXT] | reload
               | approvals | approve ID | deny ID [REASON] | answer ID JSON
               [--socket PATH] [--state-dir PATH] [--timeout SECONDS]

Why blocking and stdlib-only: a command is one short request and one answer, and an operator's tool should
start at once (no trio, no httpx). The socket is ``--socket``, else ``AGENTD_CTL_SOCKET``, else
``STATE_DIR/ctl.sock`` with the state directory from ``--state-dir`` or ``AGENTD_STATE_DIR`` (the daemon's
own default, agentd.ctl.server.socket_path).

Exit codes: 0 done; 1 the daemon refused (the document has ``error``: an unknown run, a refused reload);
2 usage (stdout empty, the message on stderr); 3 no daemon answers (no socket, a stale socket, a timeout:
the document has ``error``).
"""

from __future__ import annotations

import argparse
import json
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from agentd.ctl.server import MAX_REQUEST, socket_path
from agentd.errors import ConfigError
from agentd.formats.jsontext import escape_controls

#: How long ``agentd ctl`` waits for the daemon's answer by default (a cancel waits for the kill ladder).
DEFAULT_TIMEOUT: Final = 30.0
#: Exit code when no daemon answers on the socket.
NO_DAEMON: Final = 3
#: The largest answer read (a status with many runs and subagents stays far below).
MAX_ANSWER: Final = 16 * 1024 * 1024

#: Draws a command's answer for a person: (command, answer).
Show = Callable[[str, Mapping[str, Any]], None]

COMMANDS: Final = ("status", "pause", "resume", "lame-duck", "cancel", "reload", "approvals", "approve", "deny",
                   "answer")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentd ctl", description="Operator controls of a running agentd.")
    p.add_argument("command", choices=COMMANDS)
    p.add_argument("run", nargs="?", help="cancel: the run id or subagent handle; approve, deny, answer: the id "
                                          "agentd ctl approvals lists")
    p.add_argument("text", nargs="?", help="deny: the reason the model is told; answer: the form's values as a JSON "
                                           "object (or decline, cancel)")
    p.add_argument("--socket", help="the control socket (default: $AGENTD_CTL_SOCKET, else STATE_DIR/ctl.sock)")
    p.add_argument("--state-dir", help="the daemon's state directory (default: $AGENTD_STATE_DIR)")
    p.add_argument("--off", action="store_true", help="lame-duck: end the lame duck")
    p.add_argument("--reason", help="cancel: why (shown in the daemon's events)")
    p.add_argument("--json", action="store_true", help="print the JSON answer even at a terminal")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds to wait for the answer (default {DEFAULT_TIMEOUT:g})")
    return p


def _request(options: argparse.Namespace) -> dict[str, Any]:
    command = options.command
    if command in ("approve", "deny", "answer"):
        if not options.run:
            raise ConfigError(f"agentd ctl {command}: ID is required (agentd ctl approvals lists them)")
        if command == "approve" and options.text:
            raise ConfigError("agentd ctl approve: takes only ID")
        if command == "deny":
            return {"op": "deny", "id": options.run, **({"reason": options.text} if options.text else {})}
        if command == "answer":
            return {"op": "answer", "id": options.run, "content": _content(options.text)}
        return {"op": "approve", "id": options.run}
    if options.text:
        raise ConfigError(f"agentd ctl {command}: too many arguments")
    if options.command == "cancel":
        if not options.run:
            raise ConfigError("agentd ctl cancel: RUN is required (a run id or a subagent handle)")
        return {"op": "cancel", "run": options.run, **({"reason": options.reason} if options.reason else {})}
    if options.run:
        raise ConfigError(f"agentd ctl {options.command}: takes no RUN argument")
    if options.command == "lame-duck":
        return {"op": "lame-duck", "on": not options.off}
    return {"op": options.command}


def _content(text: str | None) -> Any:
    """``answer``'s JSON: the form's values (an object), or ``decline`` / ``cancel``."""
    if text is None:
        raise ConfigError("agentd ctl answer: JSON is required (the form's values as an object, or decline, cancel)")
    if text.strip() in ("decline", "cancel"):
        return text.strip()
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"agentd ctl answer: the answer is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError("agentd ctl answer: the answer must be a JSON object (or decline, cancel)")
    return value


def ctl_main(args: Sequence[str], env: Mapping[str, str], *, socket_envs: Sequence[str] = (),
             state_dir_envs: Sequence[str] = (), human: Show | None = None) -> int:
    """``agentd ctl``; ``socket_envs``/``state_dir_envs`` are the environment names of the two flags, in order.
    ``human`` draws the answer for a person instead of the JSON (the CLI passes it when stdout is a terminal;
    ``--json`` keeps the JSON)."""
    options = _parser().parse_args(list(args))
    if options.timeout <= 0:
        raise ConfigError("agentd ctl: --timeout must be positive")
    request = _request(options)
    explicit = options.socket or next((env[n] for n in socket_envs if env.get(n)), None)
    state_dir = options.state_dir or next((env[n] for n in state_dir_envs if env.get(n)), None)
    path = socket_path(explicit, state_dir)
    if path is None:
        hint = f" or set {socket_envs[0]}" if socket_envs else ""
        raise ConfigError(f"agentd ctl: no control socket (pass --socket or --state-dir{hint})")
    answer, code = ask(path, request, timeout=options.timeout)
    if human is not None and not options.json:
        human(options.command, answer)
    else:
        print(escape_controls(json.dumps(answer, ensure_ascii=False, default=str)))
    return code


def ask(path: str, request: Mapping[str, Any], *, timeout: float = DEFAULT_TIMEOUT) -> tuple[dict[str, Any], int]:
    """Send ``request`` to the daemon at ``path``: its answer and the exit code it means."""
    body = json.dumps(request).encode() + b"\n"
    if len(body) > MAX_REQUEST:
        return {"error": "the request is too long"}, 1
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except FileNotFoundError:
            return {"error": f"no control socket at {path}: is agentd running with this --state-dir "
                             "or --ctl-socket?"}, NO_DAEMON
        except ConnectionRefusedError:
            return {"error": f"no agentd answers on {path} (a stale socket: the daemon that made it is "
                             "not running)"}, NO_DAEMON
        except PermissionError:
            return {"error": f"{path}: permission denied (the socket belongs to the daemon's user)"}, NO_DAEMON
        except OSError as exc:
            return {"error": f"cannot connect to {path} ({exc.strerror or exc})"}, NO_DAEMON
        sock.sendall(body)
        data = bytearray()
        while b"\n" not in data and len(data) <= MAX_ANSWER:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        return {"error": f"the daemon on {path} did not answer within {timeout:g} s"}, NO_DAEMON
    except OSError as exc:
        return {"error": f"the connection to {path} broke ({exc.strerror or exc})"}, NO_DAEMON
    finally:
        sock.close()
    try:
        answer = json.loads(bytes(data).split(b"\n", 1)[0])
    except ValueError:
        return {"error": f"the daemon on {path} gave no answer (closed the connection)"}, NO_DAEMON
    if not isinstance(answer, dict):
        return {"error": "the daemon's answer is not a JSON object"}, NO_DAEMON
    return answer, 1 if "error" in answer else 0


__all__ = ["COMMANDS", "DEFAULT_TIMEOUT", "NO_DAEMON", "ask", "ctl_main"]
