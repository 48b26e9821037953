"""A deadline on request headers: a client that opens a connection and then sends its
request line and headers a byte at a time (slowloris) is cut off.

uvicorn times out idle keep-alive connections, but any byte cancels that timer and nothing
bounds how long a request's headers may take, so 40 connections trickling headers held
their sockets for as long as they liked. The front door's body timeout starts only once the
application has the request; this covers the part before it. The deadline is armed when a
connection opens and when the first byte of a next request arrives, and disarmed once
uvicorn has the whole header block (its request cycle exists); when it fires the client
gets a 408 and the connection is closed.

It subclasses the HTTP protocol uvicorn would pick itself (httptools where installed, h11
otherwise) and is handed to uvicorn as `http=`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

_LOG = logging.getLogger("squant.serve")
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 31\r\nconnection: close\r\n\r\nrequest headers came too slowly"
)


def _base_protocol() -> type[asyncio.Protocol]:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # httptools missing: uvicorn's pure-Python parser
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def header_deadline_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with a `timeout_s` deadline on each request's headers."""
    if not timeout_s > 0:
        raise ValueError(f"the header timeout must be > 0, got {timeout_s}")
    base: Any = _base_protocol()

    class HeaderDeadlineProtocol(base):  # type: ignore[misc]
        header_timeout_s = timeout_s

        def connection_made(self, transport: asyncio.Transport) -> None:
            self._header_timer: asyncio.TimerHandle | None = None
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._waiting_for_headers():
                self._arm()  # the first byte of a next request on a kept-alive connection
            super().data_received(data)
            if not self._waiting_for_headers():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _waiting_for_headers(self) -> bool:
            cycle = self.cycle
            return cycle is None or bool(cycle.response_complete)

        def _arm(self) -> None:
            if self._header_timer is None:
                loop = asyncio.get_running_loop()
                self._header_timer = loop.call_later(self.header_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expired(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or not self._waiting_for_headers():
                return
            _LOG.info("closed a connection whose headers took over %g s", self.header_timeout_s)
            self.transport.write(_TIMEOUT_RESPONSE)
            self.transport.close()

    return HeaderDeadlineProtocol
