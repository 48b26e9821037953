"""The HTTP front door: what every request meets before FastAPI reads or parses its body.

Under overload the work a server spends on the requests it turns away decides how it
recovers: on one core, parsing and validating an 8-sentence JSON body only to answer 429
kept the event loop behind by seconds after a 3x burst had ended (README, overload). Here
a refusal (429 while the engine's queue is over its time limit or too many requests are in
flight, 413 for a declared body over the limit) is a few dozen bytes written from the
headers alone. It is pure ASGI (no BaseHTTPMiddleware task per request), and it counts
every request by route and status, unknown paths under one label so a scan of random URLs
cannot grow the metrics without bound."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from .engine import Engine

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def reply(
    send: Send, status: int, body: dict[str, str], headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    """A complete JSON response, written without the application."""
    data = json.dumps(body).encode()
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
    ) -> None:
        self.app, self.engine = app, engine
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
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            error = f"body over {self.max_body_bytes} bytes"
            await reply(send, 413, {"error": error, "error_type": "payload_too_large"})
            return 413
        engine = self.engine
        if scope["method"] == "POST" and path in self.inference_routes and engine.ready:
            refused = engine.refusal()
            if refused is not None:
                body = {"error": str(refused), "error_type": "overloaded"}
                await reply(send, 429, body, ((b"retry-after", refused.retry_after.encode()),))
                return 429
        status = 500  # what a response that never started counts as

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        t0 = time.perf_counter()
        await self.app(scope, receive, send_and_note)
        self.seconds.observe(time.perf_counter() - t0)
        return status
