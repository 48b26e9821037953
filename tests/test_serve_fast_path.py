"""The /embed fast path: plain bodies skip FastAPI, everything else reaches it unchanged."""

import asyncio
from typing import Any

import orjson
from starlette.responses import Response

from squant.serve.app import _plain_embed_body
from squant.serve.fast_path import FastRoute


def test_only_plain_embed_bodies_take_the_fast_path():
    assert _plain_embed_body({"inputs": "a"}) == ("a", None, True)
    assert _plain_embed_body({"inputs": ["a", "b"], "normalize": False, "truncate": False}) == (
        ["a", "b"],
        False,
        False,
    )
    assert _plain_embed_body({"inputs": []}) == ([], None, True)  # the handler answers 400
    for body in (
        [],
        "a",
        {},
        {"inputs": 3},
        {"inputs": ["a", 3]},
        {"inputs": "a", "truncate": "yes"},
        {"inputs": "a", "truncate": None},
        {"inputs": "a", "normalize": 1},
    ):
        assert _plain_embed_body(body) is None, body


def _call(route: FastRoute, path: str, chunks: list[bytes]) -> tuple[list[Any], list[Any]]:
    """Run one request through `route`; returns (messages sent, what the app received)."""
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[Any] = []

    async def receive() -> Any:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    async def main() -> None:
        scope = {"type": "http", "path": path, "method": "POST", "headers": []}
        await route(scope, receive, send)

    asyncio.run(main())
    return sent, route.app.received  # type: ignore[attr-defined]


class _App:
    """Stands for FastAPI: records the body it reads, answers 299."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        more = True
        body = b""
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.received.append(body)
        await Response(b"app", status_code=299)(scope, receive, send)


def _route(max_body_bytes: int = 1000) -> FastRoute:
    async def handle(inputs: Any, normalize: Any, truncate: Any) -> Response:
        return Response(orjson.dumps([inputs, normalize, truncate]), status_code=200)

    return FastRoute(_App(), "/embed", _plain_embed_body, handle, max_body_bytes)


def test_a_plain_body_is_answered_by_the_handler_not_the_app():
    sent, received = _call(_route(), "/embed", [b'{"inputs": ', b'["a", "b"]}'])
    assert sent[0]["status"] == 200 and orjson.loads(sent[1]["body"]) == [["a", "b"], None, True]
    assert received == []


def test_other_bodies_and_routes_reach_the_app_with_their_body_intact():
    for path, chunks in (
        ("/embed", [b'{"inputs": 3}']),  # wrong type: the app writes the 422
        ("/embed", [b"{not json"]),
        ("/embed", [b'{"inputs": "\xff"}']),  # invalid UTF-8
        ("/embed", [b'{"inputs": "', b"x" * 600, b"x" * 600, b'"}']),  # over the body limit
        ("/predict", [b'{"inputs": "a"}']),
    ):
        sent, received = _call(_route(), path, chunks)
        assert sent[0]["status"] == 299, (path, chunks)
        assert received == [b"".join(chunks)], (path, chunks)
