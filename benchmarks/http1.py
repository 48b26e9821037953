"""A small keep-alive HTTP/1.1 client for load generation: O(1) work per request.

httpx (httpcore) re-scans its whole connection pool for every queued request on every
request start and finish (encode/httpcore#1035; pydantic/httpx2#1169 measured ~85% of client
CPU in that bookkeeping at 512 concurrent requests). Under an open-loop overload burst the
requests waiting for a connection number in the thousands: benchmarks/load.py then spent
its core in `_assign_requests_to_connections` (py-spy), sent and read late, and reported the
server as slow for minutes after a burst the server itself had cleared in a second (its
/metrics showed an empty queue and nothing in flight). Here waiting requests queue on an
asyncio.Semaphore (FIFO) and an idle connection is a list pop.

Enough HTTP for a JSON API on loopback: Content-Length and chunked bodies, keep-alive,
`Connection: close`. Not a general client (no TLS, redirects, proxies, compression).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class HTTPError(Exception):
    """The connection failed or the response was not valid HTTP/1.1."""


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status_code, self.headers, self.content = status, headers, body

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
# refused or reset (OSError), timed out (TimeoutError is an OSError), cut short, headers too
# long, or not HTTP (ValueError)
_FAILURES = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


class Http1Pool:
    """At most `size` keep-alive connections to the host of `url`; requests beyond that wait
    their turn in arrival order. Use as an async context manager."""

    def __init__(self, url: str, size: int = 512, timeout: float = 60.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"need an http://host[:port] URL, got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout = timeout
        self._slots = asyncio.Semaphore(size)
        self._idle: list[_Conn] = []

    async def __aenter__(self) -> Http1Pool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()

    async def post_json(self, path: str, body: Any) -> Response:
        return await self.request("POST", path, json.dumps(body).encode())

    async def get(self, path: str) -> Response:
        return await self.request("GET", path)

    async def request(self, method: str, path: str, body: bytes | None = None) -> Response:
        """One request on an idle connection (or a new one); HTTPError if it fails, after
        which that connection is dropped, never reused. A kept-alive connection the server
        closed while it sat idle (uvicorn closes them after 5 s) fails before any byte of
        the answer: that request is sent again once, on a new connection, as httpx does."""
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            while True:
                reused = conn is not None
                try:
                    if conn is None:
                        conn = await asyncio.wait_for(
                            asyncio.open_connection(self.host, self.port), self.timeout
                        )
                    response, keep = await asyncio.wait_for(
                        self._exchange(conn, method, path, body), self.timeout
                    )
                except _FAILURES as e:
                    if conn is not None:
                        conn[1].close()
                    if reused and _closed_while_idle(e):
                        conn = None
                        continue
                    raise HTTPError(f"{type(e).__name__}: {e}") from e
                if keep:
                    self._idle.append(conn)
                else:
                    conn[1].close()
                return response

    async def _exchange(
        self, conn: _Conn, method: str, path: str, body: bytes | None
    ) -> tuple[Response, bool]:
        reader, writer = conn
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b""))
        await writer.drain()
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        version, status, *_ = lines[0].split(" ", 2)
        if not version.startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x response: {lines[0]!r}")
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            data = await _read_chunked(reader)
        else:
            data = await reader.readexactly(int(headers.get("content-length", "0")))
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        return Response(int(status), headers, data), keep


def _closed_while_idle(e: Exception) -> bool:
    """The failure of a request written to a connection the server had already closed: the
    write broke, or the connection ended before any byte of a response."""
    if isinstance(e, asyncio.IncompleteReadError):
        return not e.partial
    return isinstance(e, (ConnectionResetError, BrokenPipeError))


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers from the servers this talks to
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)
