"""The served path's per-request cost in hypercorn's connection runner (agentd.transport.connections).

A sized HTTP/1.1 response leaves in one write (head and body together, no empty write for its end), while a
streamed one (SSE, no ``Content-Length``) still sends its head at once; a keep-alive request starts one task
(hypercorn's for the app), not also a fresh idle timer; and the idle limit still closes an idle connection.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from hypercorn.events import Event, RawData
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from agentd.events import null_log
from agentd.transport.connections import _H11
from agentd.transport.serve import ServeConfig, hypercorn_config, serve_mcp

REQUEST = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"


async def _sized(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def _writes(app: Any, *, until: trio.Event | None = None) -> list[bytes]:
    """The bytes hypercorn's HTTP/1.1 protocol (agentd's subclass) hands the socket, one entry per write."""
    writes: list[bytes] = []

    async def sink(event: Event) -> None:
        if isinstance(event, RawData):
            writes.append(event.data)

    config = hypercorn_config(ServeConfig("http://127.0.0.1:1/mcp"), None, null_log())
    async with TaskGroup() as group:
        protocol = _H11(wrap_app(app, config.wsgi_max_body_size, "asgi"), config, WorkerContext(None), group,
                        ConnectionState({}), False, ("127.0.0.1", 1), ("127.0.0.1", 2), sink)
        await protocol.handle(RawData(REQUEST))
        await trio.testing.wait_all_tasks_blocked()
        if until is not None:
            until.set()
            await trio.testing.wait_all_tasks_blocked()
    return writes


async def test_a_sized_response_leaves_in_one_write() -> None:
    writes = await _writes(_sized)
    assert len(writes) == 1, writes
    assert writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(b"\r\n\r\n{}")


async def test_a_streamed_response_sends_its_head_before_its_first_event() -> None:
    go = trio.Event()
    heads: list[int] = []

    async def sse(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        heads.append(1)
        await go.wait()
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": False})

    writes = await _writes(sse, until=go)
    assert heads and writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(b"\r\n\r\n")
    assert b"data: x" in b"".join(writes[1:])


async def test_an_app_that_ends_without_a_body_still_sends_the_head() -> None:
    async def headless(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})

    writes = await _writes(headless)
    assert writes and writes[0].startswith(b"HTTP/1.1 200 ")


class _Spawns(trio.abc.Instrument):
    def __init__(self) -> None:
        self.count = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


class _App:
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await _sized(scope, receive, send)

    def drain(self) -> None:
        pass


async def _request(stream: trio.SocketStream) -> None:
    await stream.send_all(REQUEST)
    got = b""
    while not got.endswith(b"{}"):
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise trio.BrokenResourceError("closed by the server")
        got += chunk


async def test_keep_alive_requests_start_no_idle_timer_task_and_idle_connections_still_close() -> None:
    cfg = ServeConfig("http://127.0.0.1:0/mcp", header_timeout=0.5)
    async with trio.open_nursery() as nursery:
        serving = await nursery.start(lambda task_status: serve_mcp(_App(), cfg, shutdown_trigger=trio.sleep_forever,
                                                                   task_status=task_status))
        async with await trio.open_tcp_stream("127.0.0.1", serving.port) as stream:
            await _request(stream)
            spawns = _Spawns()
            trio.lowlevel.add_instrument(spawns)
            for _ in range(20):
                await _request(stream)
            trio.lowlevel.remove_instrument(spawns)
            assert spawns.count == 20  # hypercorn's one task per request for the app; no idle timer restarts
            with trio.fail_after(5):  # idle past the 0.5 s limit: the server closes the connection
                assert await stream.receive_some(65536) == b""
        nursery.cancel_scope.cancel()


async def test_a_peer_gone_mid_request_frees_its_connection_slot() -> None:
    """The idle-limit task must not outlive a connection that closed while busy (its slot would leak)."""
    answered = trio.Event()

    class Waits(_App):
        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            if scope["path"] == "/slow":
                while (await receive())["type"] != "http.disconnect":
                    pass
                return
            await _sized(scope, receive, send)
            answered.set()

    cfg = ServeConfig("http://127.0.0.1:0/mcp", header_timeout=30, max_connections=1)
    async with trio.open_nursery() as nursery:
        serving = await nursery.start(lambda task_status: serve_mcp(Waits(), cfg, shutdown_trigger=trio.sleep_forever,
                                                                   task_status=task_status))
        first = await trio.open_tcp_stream("127.0.0.1", serving.port)
        await first.send_all(REQUEST.replace(b"/mcp", b"/slow"))
        await trio.sleep(0.2)
        await first.aclose()  # gone while its request runs
        with trio.fail_after(10):  # well inside the 30 s idle limit
            while not answered.is_set():
                second = await trio.open_tcp_stream("127.0.0.1", serving.port)
                try:
                    await _request(second)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    await trio.sleep(0.1)  # still refused: the first connection's slot is not free yet
                finally:
                    await second.aclose()
        nursery.cancel_scope.cancel()
