"""Run an engine behind HTTP until stopped: the port opens at once (/ready answers 503 with
progress while every bucket warms), the front end moves to the cores no instance uses, and
start-up objects are frozen out of the garbage collector's way. What `squant serve` runs for
one process; usable from Python with any Engine."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..engine.engine import Engine
from ..engine.process_memory import freeze_startup_objects
from ..errors import SquantError, first_line
from ..runtime.placement import front_end_cores, pin_front_end
from .app import HttpConfig, create_app
from .header_deadline import header_deadline_protocol
from .listen import ListenConfig


def serve_http(
    engine: Engine,
    http: HttpConfig,
    listen: ListenConfig | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """Serve `engine` (not started) as `listen` says until SIGINT/SIGTERM, then drain it. A
    failed warm-up stops the server and is raised as a SquantError."""
    import uvicorn

    listen = listen or ListenConfig()

    say(
        f"warming {len(engine.buckets)} length buckets {list(engine.buckets)} on "
        f"{engine.placement.instances} instance(s) x {engine.placement.cores_per_instance} core(s)"
        "; the port is open meanwhile, /ready answers 503 with progress"
    )
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(engine, http=http),
            host=listen.host,
            port=listen.port,
            access_log=listen.access_log,
            http=header_deadline_protocol(listen.header_timeout_s),
        )
    )
    failed: list[BaseException] = []
    spare = front_end_cores(engine.placement)

    def warm_up() -> None:
        try:
            engine.start()
        except BaseException as e:  # the server cannot serve: stop it, report below
            failed.append(e)
            server.should_exit = True
            return
        used = [list(c) for c in engine.placement.cores]
        where = "this process" if engine.executor.in_process else "a model process"
        say(
            f"ready: instances on cores {used} in {where}; HTTP and tokenization on "
            + (f"cores {list(spare)}" if spare else "the same cores (none left over)")
        )
        freeze_startup_objects()

    # warm-up starts before the front end is pinned, so it keeps every core; the event loop
    # and the threads it starts later stay on the cores no instance uses
    warming = threading.Thread(target=warm_up, daemon=True, name="squant-warm-up")
    warming.start()
    pin_front_end(engine.placement)
    server.run()
    if failed:
        raise SquantError(f"warm-up failed: {first_line(failed[0])}") from None
