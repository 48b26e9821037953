"""`squant serve --ray`: the same HTTP app as a Ray Serve deployment (optional extra
`squant[ray]`; with ray_data.py, the only modules that import Ray).

Each replica builds its own engine from the model directory and pins itself to its share of
its node's cores (Ray schedules by CPU count but does not pin: replica k of a node takes
cores [k*C, (k+1)*C) of the cores the node gives Ray), then runs squant's workers inside, as
`squant serve` does on one machine. Ray's proxy routes requests and applies back pressure
(`max_queued_requests`: beyond it Ray answers 503); each replica's own admission still
answers 429 with Retry-After when its queue holds more than max_queue_ms of work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.config import ServeConfig
from ..errors import SquantError, first_line
from ..runtime.placement import allowed_cores, core_slots, pin_current_thread

if TYPE_CHECKING:
    from .app import HttpConfig
    from .listen import ListenConfig

_REPLICA_ENGINE: list[Any] = []  # set inside each replica process by its app builder


@dataclass(frozen=True)
class RayConfig:
    """How `squant serve --ray` lays its servers out as Ray Serve replicas (each field is a
    `squant serve` flag of the same name)."""

    replicas: int = field(
        default=1,
        metadata={"help": "with --ray: Ray Serve replicas, each a squant server on its own cores"},
    )
    cores_per_replica: int | None = field(
        default=None, metadata={"help": "with --ray; default: this machine's cores / replicas"}
    )
    max_queued_requests: int = field(
        default=1024,
        metadata={"help": "with --ray: requests Ray's proxy queues before answering 503"},
    )

    def __post_init__(self) -> None:
        for name in ("replicas", "cores_per_replica", "max_queued_requests"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SquantError(f"RayConfig.{name} must be at least 1, got {value}")

    def cores(self) -> int:
        """Cores per replica: as set, else this machine's cores shared by the replicas."""
        return self.cores_per_replica or max(1, (os.cpu_count() or 1) // self.replicas)


def replica_cores(local_rank: int, cores_per_replica: int) -> list[int]:
    """The cores replica `local_rank` of this node owns."""
    slots = core_slots(cores_per_replica)
    if local_rank >= len(slots):
        start = local_rank * cores_per_replica
        raise SquantError(
            f"replica {local_rank} needs cores {start}..{start + cores_per_replica - 1} but this "
            f"node gives {len(allowed_cores())}: fewer replicas per node or fewer cores each"
        )
    return list(slots[local_rank])


def application(
    model: str | Path,
    config: ServeConfig,
    layout: RayConfig | None = None,
    pooling_from: str | Path | None = None,
    calib: str | Path | None = None,
    http: HttpConfig | None = None,
) -> Any:
    """A Ray Serve application (pass it to serve.run) of `layout.replicas` squant servers."""
    try:
        from ray import serve
    except ImportError:
        raise SquantError("--ray needs the ray extra: pip install 'squant[ray]'") from None
    from ..engine.loading import truncation_stated
    from .app import HttpConfig

    model = str(Path(model).resolve())
    http = http or HttpConfig(model_name=Path(model).name)
    layout = layout or RayConfig()
    # what every replica would fail on, checked here: one clear error before Ray starts
    # anything, not Ray's "Deploying application failed" from inside a replica
    truncation_stated(model, pooling_from)
    cores_per_replica = layout.cores()

    def build_app() -> Any:  # runs inside each replica
        from ..engine.loading import engine_for
        from ..engine.process_memory import freeze_startup_objects
        from .app import create_app

        rank = serve.get_replica_context().rank
        local_rank = int(getattr(rank, "local_rank", rank))
        pin_current_thread(replica_cores(local_rank, cores_per_replica))
        # the replica's cores are now all this process sees: the placement splits them
        engine = engine_for(model, config, pooling_from, calib)
        engine.start()
        _REPLICA_ENGINE.append(engine)  # this replica process's engine, for check_health
        app = create_app(engine, http=http)
        freeze_startup_objects()
        return app

    @serve.ingress(build_app)
    class SquantReplica:
        def check_health(self) -> None:
            """Ray restarts a replica whose check raises: one whose workers have died."""
            if _REPLICA_ENGINE and not _REPLICA_ENGINE[-1].healthy():
                raise RuntimeError("squant engine workers stopped")

    deployment = serve.deployment(
        SquantReplica,
        name="squant",
        num_replicas=layout.replicas,
        ray_actor_options={"num_cpus": cores_per_replica},
        max_queued_requests=layout.max_queued_requests,
        # one log line per request cost the 2-core test machine most of its throughput;
        # squant's own /metrics count requests
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )
    return deployment.bind()


def connect(address: str | None, **options: Any) -> None:
    """ray.init, with an unreachable address as a one-line error (Ray raises a
    ConnectionError with its traceback after its own retries)."""
    import ray

    try:
        ray.init(address=address, **options)
    except ConnectionError as e:
        raise SquantError(f"cannot reach the Ray cluster at {address}: {e}") from None


def run(app: Any, layout: RayConfig, listen: ListenConfig, address: str | None = None) -> None:
    """Serve `application(...)` on Ray (a local cluster, or the one at `address`) at
    listen's host and port until interrupted or stopped (SIGTERM); then shut Serve and Ray
    down."""
    import signal

    import ray
    from ray import serve

    connect(address)

    # Ray's core worker installs a fatal-signal handler that prints a native stack dump on
    # SIGTERM, the normal way an orchestrator stops a server: stop cleanly instead
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        serve.start(http_options={"host": listen.host, "port": listen.port})
        print(
            f"{layout.replicas} replica(s) x {layout.cores()} core(s) on Ray; "
            f"http://{listen.host}:{listen.port}"
        )
        serve.run(app, blocking=True)
    except KeyboardInterrupt:
        pass
    except RuntimeError as e:  # a replica failed to start (its log says more)
        raise SquantError(f"Ray Serve could not start squant's replicas: {first_line(e)}") from None
    finally:
        print("stopping the Ray Serve application", flush=True)
        serve.shutdown()
        ray.shutdown()
