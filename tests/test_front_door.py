"""The front door's body limit and read timeout, for every transfer encoding.

A chunked body declares no length: before the limit was counted on the stream, a 100 MB
chunked POST was read whole into memory. These tests drive the middleware with an endless
body and check that reading stops at the limit, and one end-to-end test sends a real chunked
request to uvicorn."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from squant.serve.front_door import FrontDoor


class _Counter:
    def labels(self, *_args):
        return self

    def inc(self):
        pass

    def observe(self, _value):
        pass


def _door(app, limit=1000, timeout_s=30.0):
    engine = SimpleNamespace(ready=False)
    return FrontDoor(app, engine, (), (), _Counter(), _Counter(), limit, timeout_s)


async def _reading_app(scope, receive, send):
    """Reads the whole body like FastAPI does, then answers 200 (or 400 if the client left)."""
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            await send({"type": "http.response.start", "status": 400, "headers": []})
            await send({"type": "http.response.body", "body": b"client left"})
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def _run(app, chunks, scope_headers=()):
    """Drive app with a body of `chunks` (an iterator); returns (sent messages, chunks read)."""
    read = 0

    async def receive():
        nonlocal read
        chunk = next(chunks, None)
        if chunk is None:
            await asyncio.sleep(3600)  # a client that stalls
        read += 1
        return {"type": "http.request", "body": chunk, "more_body": True}

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/embed", "method": "POST", "headers": list(scope_headers)}
    asyncio.run(app(scope, receive, send))
    return sent, read


def _endless(size=100):
    while True:
        yield b"x" * size


def test_a_chunked_body_over_the_limit_is_413_and_reading_stops_there():
    sent, read = _run(_door(_reading_app, limit=1000), _endless(100))
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error_type"] == "payload_too_large"
    assert len(sent) == 2  # the application's own reply was dropped
    assert read == 11  # 1,100 bytes: the first chunk past 1,000, and not one more


def test_a_body_within_the_limit_reaches_the_application():
    body = iter([b"x" * 400, b"y" * 400])

    async def receive_two(scope, receive, send):
        parts = [await receive(), await receive()]
        size = sum(len(p["body"]) for p in parts)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(size).encode()})

    sent, _ = _run(_door(receive_two, limit=1000), body)
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"800"


def test_a_declared_length_over_the_limit_is_refused_before_reading():
    headers = [(b"content-length", b"5000")]
    sent, read = _run(_door(_reading_app, limit=1000), _endless(), headers)
    assert sent[0]["status"] == 413 and read == 0


def test_a_stalled_body_times_out_with_408():
    sent, read = _run(_door(_reading_app, limit=10**6, timeout_s=0.2), iter([b"x"]))
    assert sent[0]["status"] == 408 and read == 1
    assert json.loads(sent[1]["body"])["error_type"] == "timeout"


def test_a_real_chunked_100mb_post_gets_413_from_uvicorn_without_being_read(tokenizer_free_app):
    port = tokenizer_free_app
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        "POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    sock.sendall(head.encode())
    chunk = b"x" * 65536
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    try:
        while sent < 100 * 2**20:
            sock.sendall(frame)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server closed the connection after answering: what we want
    sock.settimeout(10)
    try:
        answer = sock.recv(4096).decode("latin-1")
    except (ConnectionResetError, TimeoutError):
        answer = ""
    sock.close()
    # Either the 413 arrived, or the reset beat it to us; in both cases the upload stopped
    # far short of 100 MB (loopback socket buffers hold a few MB at most)
    assert sent < 32 * 2**20, f"the server read {sent} bytes"
    assert answer == "" or answer.startswith("HTTP/1.1 413"), answer[:200]


def _answer(sock: socket.socket, wait_s: float) -> str:
    """What the server sends before it closes the connection (or wait_s passes)."""
    sock.settimeout(wait_s)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data.decode("latin-1")


def test_headers_that_trickle_in_get_408_and_a_closed_connection(header_deadline_app):
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", header_deadline_app)) as sock:
        for byte in b"GET /em":  # a byte every 0.05 s, then nothing: never finishing
            sock.sendall(bytes([byte]))
            time.sleep(0.05)
        answer = _answer(sock, 5)
    assert answer.startswith("HTTP/1.1 408"), answer
    assert time.monotonic() - started < 4  # the 0.5 s deadline, not the client, ended it


def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(header_deadline_app):
    with socket.create_connection(("127.0.0.1", header_deadline_app)) as sock:
        assert _answer(sock, 5).startswith("HTTP/1.1 408")


def test_the_header_deadline_spares_prompt_headers_a_slow_body_and_kept_alive_requests(
    header_deadline_app,
):
    head = (
        b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", header_deadline_app)) as sock:
        sock.sendall(head)
        time.sleep(1.0)  # past the header deadline, but the headers were complete
        sock.sendall(b"abcd")
        sock.settimeout(5)
        first = sock.recv(4096).decode("latin-1")
        assert first.startswith("HTTP/1.1 200"), first
        time.sleep(0.8)  # idle between requests: uvicorn's keep-alive timer, not ours
        sock.sendall(head + b"efgh")
        second = sock.recv(4096).decode("latin-1")
        assert second.startswith("HTTP/1.1 200"), second


def test_the_header_deadline_refuses_a_nonpositive_timeout():
    from squant.serve.header_deadline import header_deadline_protocol

    with pytest.raises(ValueError, match="header timeout"):
        header_deadline_protocol(0.0)


@pytest.fixture
def header_deadline_app():
    from squant.serve.header_deadline import header_deadline_protocol

    yield from _serve(_door(_reading_app, limit=2 * 2**20), http=header_deadline_protocol(0.5))


@pytest.fixture
def tokenizer_free_app():
    """uvicorn serving a FrontDoor over a body-reading app, on a free loopback port."""
    yield from _serve(_door(_reading_app, limit=2 * 2**20))


def _serve(app, **options):
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="error", lifespan="off", **options
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(5)
