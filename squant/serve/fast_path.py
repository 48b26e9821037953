"""One route served without FastAPI's per-request machinery, for the bodies that need none.

On the core the model shares, FastAPI's middleware chain, request object, dependency solving
and pydantic model cost a large share of a sentence's front-end time (py-spy, closed loop).
A body that parses as JSON and has the plain shape `parse` accepts goes straight to `handle`;
anything else (malformed JSON, invalid UTF-8, wrong types, an oversized body) is replayed to
the application, so every error is still written by the one validating code path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from .front_door import ASGIApp, Message, Receive, Scope, Send

# the plain payload -> the handler's arguments, or None: let the application answer it
Parse = Callable[[Any], tuple[Any, ...] | None]
# the handler's arguments -> an ASGI response (errors included)
Handle = Callable[..., Awaitable[ASGIApp]]


class FastRoute:
    """ASGI middleware: POST `path` with a plain body -> handle(*parse(body)); else the app."""

    def __init__(
        self, app: ASGIApp, path: str, parse: Parse, handle: Handle, max_body_bytes: int
    ) -> None:
        self.app, self.path, self.parse, self.handle = app, path, parse, handle
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more and size <= self.max_body_bytes:
            message = await receive()
            if message["type"] != "http.request":  # the client left: the app sees it too
                await self.app(scope, _replay(chunks, receive, message), send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        args = None
        if not more:
            try:
                args = self.parse(orjson.loads(b"".join(chunks)))
            except orjson.JSONDecodeError:  # also invalid UTF-8
                args = None
        if args is None:
            await self.app(scope, _replay(chunks, receive, None, more), send)
            return
        response = await self.handle(*args)
        await response(scope, receive, send)


def _replay(
    chunks: list[bytes], receive: Receive, last: Message | None, more: bool = False
) -> Receive:
    """A receive that gives back what was read, then reads on."""
    pending: list[Message] = [
        {"type": "http.request", "body": b"".join(chunks), "more_body": more or last is not None}
    ]
    if last is not None:
        pending.append(last)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
