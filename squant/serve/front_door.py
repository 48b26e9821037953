"""The HTTP front door: what every request meets before FastAPI reads or parses its body.

Under overload the work a server spends on the requests it turns away decides how it
recovers: on one core, parsing and validating an 8-sentence JSON body only to answer 429
kept the event loop behind by seconds after a 3x burst had ended (docs/serving.md, overload). Here
a refusal (429 while the engine's queue is over its time limit or too many requests are in
flight, 413 for a declared body over the limit) is a few dozen bytes written from the
headers alone. It is pure ASGI (no BaseHTTPMiddleware task per request), and it counts
every request by route and status, unknown paths under one label so a scan of random URLs
cannot grow the metrics without bound.

The body limit holds for every transfer encoding: a chunked body declares no length, so the
bytes are counted as the application reads them, and at the limit the front door answers
413 itself (closing the connection) and tells the application the client left; nothing
past the limit is ever read into memory. A body that stalls longer than the read timeout
between chunks gets 408 the same way (a client sending a byte at a time holds no worker).

With an API key set, every route but the health probes (/health, /ready: an orchestrator's
probe carries no credentials) needs `Authorization: Bearer KEY`, the header the openai and
huggingface_hub clients send; anything else is a 401 before the body is read."""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from ..engine.engine import Engine
from .error_body import error_body

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health", "/ready"})  # answered without the API key


async def reply(
    send: Send,
    path: str,
    status: int,
    error: str,
    kind: str,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """A complete JSON error response, written without the application, in the shape the
    route's clients read (error_body)."""
    data = json.dumps(error_body(path, status, error, kind)).encode()
    head = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": data})


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class FrontDoor:
    """ASGI middleware: early 413/429, request counts and time in the server.

    inference_routes: the POST paths that queue work (refused early when the engine would
    refuse them); known_routes: the paths counted under their own label (read per request,
    so the app may add routes after this is built)."""

    def __init__(
        self,
        app: ASGIApp,
        engine: Engine,
        inference_routes: Collection[str],
        known_routes: Collection[str],
        requests: Any,
        seconds: Any,
        max_body_bytes: int,
        body_timeout_s: float = 30.0,
        api_key: str | None = None,
    ) -> None:
        self.app, self.engine = app, engine
        self.api_key = api_key.encode() if api_key else None
        self.body_timeout_s = body_timeout_s
        self.inference_routes, self.known_routes = inference_routes, known_routes
        self.requests, self.seconds, self.max_body_bytes = requests, seconds, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        status = await self._handle(scope, receive, send, path)
        label = path if path in self.known_routes else "unmatched"
        self.requests.labels(label, str(status)).inc()

    async def _handle(self, scope: Scope, receive: Receive, send: Send, path: str) -> int:
        if self.api_key is not None and path not in OPEN_PATHS and not self._authorized(scope):
            error = "missing or wrong API key: send the header Authorization: Bearer KEY"
            challenge = ((b"www-authenticate", b"Bearer"),)
            await reply(send, path, 401, error, "unauthorized", challenge)
            return 401
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await _too_large(send, path, self.max_body_bytes)
            return 413
        engine = self.engine
        if scope["method"] == "POST" and path in self.inference_routes and engine.ready:
            refused = engine.refusal()
            if refused is not None:
                retry = ((b"retry-after", refused.retry_after.encode()),)
                await reply(send, path, 429, str(refused), "overloaded", retry)
                return 429
        status = 500  # what a response that never started counts as
        bounded = BoundedBody(receive, send, self.max_body_bytes, self.body_timeout_s, path)

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if bounded.answered:  # the front door answered already: the app's reply is dropped
                return
            if message["type"] == "http.response.start":
                status = message["status"]
                bounded.response_started = True
            await send(message)

        t0 = time.perf_counter()
        await self.app(scope, bounded.receive, send_and_note)
        self.seconds.observe(time.perf_counter() - t0)
        return bounded.answered or status

    def _authorized(self, scope: Scope) -> bool:
        given = header(scope, b"authorization")
        if given is None:
            return False
        # header() decodes latin-1, so encoding back gives the exact bytes that were sent
        scheme, _, token = given.encode("latin-1").strip().partition(b" ")
        # constant time: the comparison must not tell how much of a guess was right
        return scheme.lower() == b"bearer" and hmac.compare_digest(
            token.strip(), self.api_key or b""
        )


async def _too_large(send: Send, path: str, limit: int) -> None:
    close = ((b"connection", b"close"),)
    await reply(send, path, 413, f"body over {limit} bytes", "payload_too_large", close)


class BoundedBody:
    """The request's receive, counted: past max_bytes (or after timeout_s without a chunk)
    it answers 413 (408) itself, once, and from then on tells the reader the client left."""

    def __init__(
        self, receive: Receive, send: Send, max_bytes: int, timeout_s: float, path: str = "/"
    ) -> None:
        self._receive, self._send, self.path = receive, send, path
        self.max_bytes, self.timeout_s = max_bytes, timeout_s
        self.size = 0
        self.answered = 0  # the status the front door answered with (0: none)
        self.response_started = False  # by the application
        self.stopped = False

    async def receive(self) -> Message:
        if self.stopped:
            return {"type": "http.disconnect"}
        try:
            message = await asyncio.wait_for(self._receive(), self.timeout_s)
        except TimeoutError:
            await self._stop(408, f"no body data for {self.timeout_s:g} s", "timeout")
            return {"type": "http.disconnect"}
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            if self.size > self.max_bytes:
                await self._stop(413, f"body over {self.max_bytes} bytes", "payload_too_large")
                return {"type": "http.disconnect"}
        return message

    async def _stop(self, status: int, error: str, kind: str) -> None:
        self.stopped = True
        if not self.response_started:
            self.answered = status
            close = ((b"connection", b"close"),)
            await reply(self._send, self.path, status, error, kind, close)
