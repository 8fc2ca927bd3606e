"""agentd's HTTP client writes a request's head and body in one piece (agentd.transport.corked).

A plain TCP server in the same trio run reads each request as it arrives. httpcore on its own writes the head and
the body separately, with a scheduling round between them, so the server's first read often holds the head alone;
corked, every request is in the first read. A body past the flush size still arrives whole and intact.
"""

from __future__ import annotations

import functools

import trio

from agentd.transport.corked import FLUSH_AT
from agentd.transport.http_client import new_client

REQUESTS = 40


async def _serve(stream: trio.SocketStream, reads: list[int], bodies: list[bytes]) -> None:
    buffer = b""
    async with stream:
        while True:
            count = 0
            while b"\r\n\r\n" not in buffer:
                chunk = await stream.receive_some(1 << 20)
                if not chunk:
                    return
                buffer += chunk
                count += 1
            head, _, rest = buffer.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(rest) < length:
                chunk = await stream.receive_some(1 << 20)
                if not chunk:
                    return
                rest += chunk
                count += 1
            reads.append(count)
            bodies.append(rest[:length])
            buffer = rest[length:]
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok")


async def test_each_request_reaches_the_server_in_one_read_and_large_bodies_whole() -> None:
    reads: list[int] = []
    bodies: list[bytes] = []
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, host="127.0.0.1"),
                                      functools.partial(_serve, reads=reads, bodies=bodies), 0)
        port = listeners[0].socket.getsockname()[1]
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        async with new_client() as client:
            for index in range(REQUESTS):
                body = b'{"model":"m","messages":[{"role":"user","content":"%d"}]}' % index + b" " * 2000
                response = await client.post(url, content=body, headers={"content-type": "application/json"})
                assert (response.status_code, response.text) == (200, "ok")
            large = bytes(range(256)) * (3 * FLUSH_AT // 256 + 7)
            response = await client.post(url, content=large)
            assert response.status_code == 200
        nursery.cancel_scope.cancel()
    assert reads[:REQUESTS] == [1] * REQUESTS, reads  # head and body in the server's first read, every time
    assert len(bodies[-1]) == len(large) and bodies[-1] == large
