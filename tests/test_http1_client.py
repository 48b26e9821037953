"""benchmarks/http1.py, the load generator's HTTP client, against a scripted asyncio server:
bodies by length and chunked, keep-alive reuse, `Connection: close`, the connection limit,
and failures reported as HTTPError, never hung."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.http1 import Http1Pool, HTTPError


async def _serve(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def _scripted(stats: dict):
    """Echoes the request's body; /chunked answers chunked, /close closes after answering
    (and says so), /drop closes after answering without saying so."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stats["connections"] += 1
        stats["open"] += 1
        stats["most_open"] = max(stats["most_open"], stats["open"])
        try:
            while True:
                try:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                except asyncio.IncompleteReadError:
                    return
                path = head.split(" ")[1]
                fields = (h.partition(":") for h in head.split("\r\n")[1:])
                length = next((int(v) for k, _, v in fields if k == "Content-Length"), 0)
                body = await reader.readexactly(length)
                await asyncio.sleep(0.01)  # overlapping requests need overlapping connections
                if path == "/chunked":
                    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    out += b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n"
                elif path == "/close":
                    out = b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno"
                else:
                    out = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    out += body
                writer.write(out)
                await writer.drain()
                if path in ("/close", "/drop"):  # /drop: closed later, as if idle too long
                    return
        finally:
            stats["open"] -= 1
            writer.close()

    return handler


def test_bodies_keep_alive_and_close():
    async def main():
        stats = {"connections": 0, "open": 0, "most_open": 0}
        server, url = await _serve(_scripted(stats))
        async with server, Http1Pool(url, size=4) as pool:
            r = await pool.post_json("/embed", {"inputs": "é"})
            assert (r.status_code, r.json()) == (200, {"inputs": "é"})
            for _ in range(3):  # sequential requests reuse the one connection
                await pool.post_json("/embed", {"inputs": "x"})
            assert stats["connections"] == 1
            r = await pool.get("/chunked")
            assert (r.status_code, r.content) == (200, b"abcde")
            r = await pool.get("/close")
            assert (r.status_code, r.text) == (503, "no")
            await pool.get("/again")  # the closed connection is not reused
            assert stats["connections"] == 2
            await pool.get("/drop")  # answered, kept alive by the client, closed by the server
            await asyncio.sleep(0.05)
            r = await pool.post_json("/after-drop", {"a": 1})  # sent again on a new connection
            assert (r.status_code, r.json(), stats["connections"]) == (200, {"a": 1}, 3)

    asyncio.run(main())


def test_at_most_size_connections_and_every_request_answered():
    async def main():
        stats = {"connections": 0, "open": 0, "most_open": 0}
        server, url = await _serve(_scripted(stats))
        async with server, Http1Pool(url, size=3) as pool:
            bodies = [{"i": i} for i in range(30)]
            out = await asyncio.gather(*(pool.post_json("/x", b) for b in bodies))
            assert [r.json() for r in out] == bodies  # each its own answer, none lost
            assert stats["most_open"] == 3  # the limit was reached and never passed

    asyncio.run(main())


def test_failures_are_http_errors():
    async def main():
        async def garbage(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"SMTP ready\r\n\r\n")
            await writer.drain()
            writer.close()

        async def silent(reader, writer):
            await asyncio.sleep(5)

        server, url = await _serve(garbage)
        async with server, Http1Pool(url) as pool:
            with pytest.raises(HTTPError, match="not an HTTP"):
                await pool.get("/")
        server, url = await _serve(silent)
        async with server, Http1Pool(url, timeout=0.2) as pool:
            with pytest.raises(HTTPError, match="Timeout"):
                await pool.get("/")
        port = int(url.rsplit(":", 1)[1])
        server.close()
        await server.wait_closed()
        async with Http1Pool(f"http://127.0.0.1:{port}") as pool:
            with pytest.raises(HTTPError):
                await pool.get("/")
        with pytest.raises(ValueError, match="http://"):
            Http1Pool("https://example.com")

    asyncio.run(main())
