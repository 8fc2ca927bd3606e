"""The control socket: ``agentd ctl`` reaches a running daemon through a Unix socket only its owner can use.

Why a local socket (docs/design/operator-controls.md): the served self-MCP is for peers and exists only with
``--serve-mcp``; signals carry no argument and no answer. A Unix socket works for every daemon, answers each
command with a document, and is guarded by the file system: it is created mode 0600, and a connecting
process whose user is neither the daemon's nor root is turned away (``SO_PEERCRED``).

One connection, one command: the client writes one JSON object on one line (at most
:data:`MAX_REQUEST` bytes, within :data:`READ_TIMEOUT`), the daemon writes one JSON object on one line and
closes. At most :data:`MAX_CONNECTIONS` are served at once; more are answered "busy". A socket file left by
a daemon that died is replaced at start-up; a live one (another daemon answers) is a configuration error.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import trio

from agentd.errors import ConfigError
from agentd.formats import jsontext as json_text
from agentd.telemetry.events import EventLog

#: A request line's size limit, how long a client may take to send it, and how many clients at once.
MAX_REQUEST: Final = 64 * 1024
READ_TIMEOUT: Final = 5.0
MAX_CONNECTIONS: Final = 8
#: How long the daemon may take to write its answer to a slow client.
WRITE_TIMEOUT: Final = 5.0
#: The longest path an AF_UNIX socket can have on Linux (``sun_path`` minus its terminating NUL).
MAX_PATH_BYTES: Final = 107

#: The socket's file name in the state directory when ``--ctl-socket`` is not given.
SOCKET_NAME: Final = "ctl.sock"

Handler = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]


def socket_path(ctl_socket: str | None, state_dir: str | None) -> str | None:
    """Where the control socket is: ``--ctl-socket``, else ``STATE_DIR/ctl.sock``, else none."""
    if ctl_socket:
        return ctl_socket
    return os.path.join(state_dir, SOCKET_NAME) if state_dir else None


def check_path(path: str) -> None:
    """Refuse a socket path the kernel cannot bind (too long) before anything starts."""
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise ConfigError(f"--ctl-socket {path}: a Unix socket path is at most {MAX_PATH_BYTES} bytes; "
                          "use a shorter --ctl-socket")


def clear_stale(path: str) -> None:
    """Remove a socket file nobody listens on; refuse a live one or a file that is not a socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"--ctl-socket {path}: the path exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)  # stale: its daemon is gone
        return
    except OSError as exc:
        raise ConfigError(f"--ctl-socket {path}: cannot check the existing socket ({exc.strerror})") from None
    finally:
        probe.close()
    raise ConfigError(f"--ctl-socket {path}: another agentd is listening there")


def peer_uid(sock: Any) -> int | None:
    """The connecting process's user id (Linux ``SO_PEERCRED``), or None where the platform has none."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


async def serve_ctl(path: str, handler: Handler, log: EventLog, *,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``handler`` on a Unix socket at ``path`` until cancelled; the socket file is removed at the end.

    Raises:
        ConfigError: the path is too long, is not a socket, another daemon listens on it, or cannot be bound.
    """
    check_path(path)
    clear_stale(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)  # created 0600 (no window in which another user could connect)
        try:
            await sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(MAX_CONNECTIONS)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--ctl-socket {path}: cannot listen ({exc.strerror})") from None
    ours = os.stat(path)
    listener = trio.SocketListener(sock)
    busy = 0
    try:
        log.info("ctl.listening", path=path)
        task_status.started(path)
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        await trio.sleep(0.1)  # out of descriptors: let some close, keep the listener
                        continue
                    raise

                async def one(stream: trio.SocketStream = stream) -> None:
                    nonlocal busy
                    busy += 1
                    try:
                        await _answer(stream, handler, log, busy > MAX_CONNECTIONS)
                    finally:
                        busy -= 1

                nursery.start_soon(one)
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
        try:
            now = os.stat(path)
            if (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino):
                os.unlink(path)
        except OSError:
            pass


async def _answer(stream: trio.SocketStream, handler: Handler, log: EventLog, busy: bool) -> None:
    async with stream:
        try:
            uid = peer_uid(stream.socket)
        except OSError:
            return
        if uid is not None and uid not in (os.getuid(), 0):
            log.warn("ctl.refused", reason="peer user is not the daemon's owner", uid=uid)
            return
        if busy:
            await _send(stream, {"error": "busy: too many control connections, try again"})
            return
        request = await _read_request(stream)
        if isinstance(request, str):
            await _send(stream, {"error": request})
            return
        try:
            answer = await handler(request)
        except Exception as exc:  # a bug in a command is an answer, not a dead listener
            log.error("ctl.failed", op=str(request.get("op"))[:64], error=f"{type(exc).__name__}: {exc}")
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        await _send(stream, answer)


async def _read_request(stream: trio.SocketStream) -> dict[str, Any] | str:
    """The request object, or an error message (too long, too slow, not one JSON object)."""
    data = bytearray()
    with trio.move_on_after(READ_TIMEOUT) as waited:
        while b"\n" not in data:
            try:
                chunk = await stream.receive_some(MAX_REQUEST + 1 - len(data))
            except (trio.BrokenResourceError, OSError):
                return "the connection broke"
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_REQUEST:
                return f"request longer than {MAX_REQUEST} bytes"
    if waited.cancelled_caught:
        return f"no complete request within {READ_TIMEOUT:g} s"
    return parse_request(bytes(data))


def parse_request(data: bytes) -> dict[str, Any] | str:
    """The request object on the first line of ``data``, or why there is none. Never raises: bytes that are
    not UTF-8, a lone surrogate, nesting deeper than :data:`agentd.formats.jsontext.MAX_DEPTH` are each an answer."""
    if len(data) > MAX_REQUEST:
        return f"request longer than {MAX_REQUEST} bytes"
    try:
        request = json_text.loads(data.split(b"\n", 1)[0], "reject")
    except json.JSONDecodeError:
        return "the request is not JSON"
    except ValueError as exc:  # not UTF-8, a lone surrogate, nested too deeply: never a RecursionError
        return f"the request is not JSON ({str(exc)[:120]})"
    if not isinstance(request, dict) or not isinstance(request.get("op"), str):
        return 'the request must be a JSON object with an "op" string'
    return request


async def _send(stream: trio.SocketStream, doc: Mapping[str, Any]) -> None:
    with trio.move_on_after(WRITE_TIMEOUT):
        try:
            await stream.send_all(json.dumps(doc, default=str).encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass


__all__ = ["MAX_CONNECTIONS", "MAX_REQUEST", "SOCKET_NAME", "check_path", "clear_stale", "parse_request", "peer_uid",
           "serve_ctl", "socket_path"]
