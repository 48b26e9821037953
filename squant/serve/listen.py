"""Where and how squant's HTTP server listens: a config of its own, importable without the
serve extra (the command line builds its flags from it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SquantError


@dataclass(frozen=True)
class ListenConfig:
    """Where and how the HTTP server listens (each field is a `squant serve` flag)."""

    host: str = field(default="127.0.0.1", metadata={"help": "the address to listen on"})
    port: int = field(default=8080, metadata={"help": "the TCP port to listen on"})
    header_timeout_s: float = field(
        default=10.0,
        metadata={
            "flag": "--header-timeout",
            "help": "seconds a client may take to send a request's headers before a 408 and "
            "close (a client trickling them a byte at a time would hold a connection for ever)",
        },
    )
    access_log: bool = field(
        default=False,
        metadata={
            "help": "log every request (uvicorn's access log; off by default: it cost about 1.5 "
            "percent of the core at ~100 requests/s, and /metrics counts requests)"
        },
    )

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise SquantError(f"port must be in 1..65535, got {self.port}")
        if not self.header_timeout_s > 0:
            raise SquantError(f"header_timeout_s must be positive, got {self.header_timeout_s}")
