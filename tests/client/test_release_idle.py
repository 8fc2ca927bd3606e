"""agentd's HTTP client lets go of its kept-alive connections on demand (``Client.release_idle``), never of one in use.

A plain TCP server in the same trio run counts the connections it accepts and sees each one closed: a release
closes the idle connection (the server reads its end), leaves one carrying a response alone, and the next request
connects anew and is answered.
"""

from __future__ import annotations

import functools

import trio

from agentd.transport.http_client import new_client

RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"


class Server:
    def __init__(self) -> None:
        self.opened = 0
        self.closed = 0
        self.changed = trio.Event()

    async def serve(self, stream: trio.SocketStream) -> None:
        self.opened += 1
        buffer = b""
        async with stream:
            try:
                while True:
                    while b"\r\n\r\n" not in buffer:
                        chunk = await stream.receive_some(1 << 16)
                        if not chunk:
                            return
                        buffer += chunk
                    _, _, buffer = buffer.partition(b"\r\n\r\n")  # GETs: no body
                    await stream.send_all(RESPONSE)
            finally:
                self.closed += 1
                self.changed.set()
                self.changed = trio.Event()

    async def wait_closed(self, count: int) -> None:
        while self.closed < count:
            await self.changed.wait()


async def test_idle_connections_are_closed_on_release_and_busy_ones_kept() -> None:
    server = Server()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, host="127.0.0.1"), server.serve, 0)
        url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/v1/models"
        async with new_client() as client:
            with trio.fail_after(30):
                assert not await client.release_idle()  # nothing to let go of yet
                for _ in range(2):
                    assert (await client.get(url)).text == "ok"
                assert (server.opened, server.closed) == (1, 0)  # kept alive between the two

                response = await client.send(client.build_request("GET", url), stream=True)
                assert not await client.release_idle()  # its one connection carries this response
                assert (await response.aread()) == b"ok"
                await response.aclose()
                assert server.closed == 0

                assert await client.release_idle()
                await server.wait_closed(1)
                assert not await client.release_idle()

                assert (await client.get(url)).text == "ok"  # a new connection, answered
                assert (server.opened, server.closed) == (2, 1)
        nursery.cancel_scope.cancel()
