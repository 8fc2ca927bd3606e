"""The control socket's bounds, in process on a real Unix socket (virtual time): a client that never sends
its request is answered after the read timeout, an oversized or malformed request gets an error, another
user's socket file is never replaced, and the socket is created 0600 and removed at the end."""

from __future__ import annotations

import json
import os
import socket
import stat

import pytest
import trio

from agentd.ctl.server import MAX_REQUEST, READ_TIMEOUT, clear_stale, serve_ctl
from agentd.errors import ConfigError
from agentd.telemetry.events import EventLog


async def _echo(request):
    return {"op": request["op"]}


async def _exchange(path: str, payload: bytes | None) -> dict:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(path)
    stream = trio.SocketStream(sock)
    async with stream:
        if payload is not None:
            await stream.send_all(payload)
        data = b""
        while not data.endswith(b"\n"):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


async def test_bounds_and_answers(tmp_path, autojump_clock):
    path = str(tmp_path / "c.sock")
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_ctl, path, _echo, EventLog(sink=lambda line: None))
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert await _exchange(path, b'{"op": "status"}\n') == {"op": "status"}
        started = trio.current_time()
        answer = await _exchange(path, None)  # connects, sends nothing
        assert answer == {"error": f"no complete request within {READ_TIMEOUT:g} s"}
        assert trio.current_time() - started == pytest.approx(READ_TIMEOUT, abs=0.5)
        assert await _exchange(path, b"x" * (MAX_REQUEST + 10)) == {
            "error": f"request longer than {MAX_REQUEST} bytes"}
        assert await _exchange(path, b"not json\n") == {"error": "the request is not JSON"}
        assert "error" in await _exchange(path, b'["status"]\n')
        with pytest.raises(ConfigError, match="another agentd is listening there"):
            clear_stale(path)
        nursery.cancel_scope.cancel()
    assert not os.path.exists(path)


def test_a_path_that_is_not_a_socket_is_never_removed(tmp_path):
    path = tmp_path / "c.sock"
    path.write_text("not a socket")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        clear_stale(str(path))
    assert path.read_text() == "not a socket"


def test_a_too_long_path_is_refused(tmp_path):
    from agentd.ctl.server import check_path

    with pytest.raises(ConfigError, match="at most 107 bytes"):
        check_path(str(tmp_path / ("x" * 120)))


async def test_deep_nesting_and_bad_text_are_answered_and_the_server_keeps_serving(tmp_path, autojump_clock):
    """Sixty thousand ``[`` once raised a RecursionError out of the JSON decoder and ended the daemon."""
    path = str(tmp_path / "c.sock")
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_ctl, path, _echo, EventLog(sink=lambda line: None))
        deep = await _exchange(path, b"[" * 60000 + b"\n")
        assert deep["error"].startswith("the request is not JSON (JSON nested"), deep
        nested = await _exchange(path, b'{"op": "status", "x": ' + b"[" * 600 + b"]" * 600 + b"}\n")
        assert nested == {"error": "the request is not JSON (JSON nested more than 512 levels deep)"}
        lone = await _exchange(path, b'{"op": "cancel", "run": "\\ud800"}\n')
        assert lone["error"].startswith("the request is not JSON"), lone
        latin = await _exchange(path, b'{"op": "\xff"}\n')
        assert latin["error"].startswith("the request is not JSON"), latin
        assert await _exchange(path, b'{"op": "status"}\n') == {"op": "status"}
        nursery.cancel_scope.cancel()
