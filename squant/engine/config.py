"""How a server or bulk embedding job runs its engine: batch limits, queue bounds, workers and
their placement, runtime. A frozen value; `squant serve` and `squant embed` derive their
flags from its fields (help text in each field's metadata)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import SquantError
from ..runtime.compiler import ATTENTIONS, Attention
from .runtime import RUNTIMES, Runtime

BUCKETS = (16, 32, 64, 128, 256, 512)
# Padded tokens per batch. Real MiniLM static INT8 on one AVX2 core, 128-token sequences
# (squant bench): 24-27 seq/s at 1,024 tokens, 29.5 at 2,048, 30.7 at 4,096, 19.4 at 8,192
# (the earlier default). Served, closed loop: 2,048 gave 17% more than 1,024, while RSS
# grew less under a 3x burst with 1,024 (+8% vs +19%; docs/serving.md, overload). The server takes
# 2,048 (latency and memory); offline bulk embedding 4,096 (throughput only).
SERVE_BATCH_TOKENS = 2048
OFFLINE_BATCH_TOKENS = 4096


@dataclass(frozen=True)
class ServeConfig:
    # (metadata: the `squant serve` flag's help, and its name where it is not the field's)
    instances: int | None = field(default=None, metadata={"help": "default: cores / C"})
    cores_per_instance: int | None = field(
        default=None, metadata={"help": "C; default: 4, fewer on small hosts"}
    )
    max_batch_requests: int = field(default=32, metadata={"help": "sequences per batch"})
    max_batch_tokens: int = field(
        default=SERVE_BATCH_TOKENS,
        metadata={"help": "padded tokens per batch (fewer keeps memory flatter under overload)"},
    )
    max_queue: int = field(
        default=1024, metadata={"help": "sequences waiting, all requests together"}
    )
    max_inputs: int = 256  # texts in one request
    # requests admitted and not yet answered (tokenizing, queued or running); beyond it a
    # request is refused before any work is spent on it (TEI's max_concurrent_requests)
    max_concurrent: int = field(
        default=512,
        metadata={
            "help": "requests in flight (tokenizing, queued, running); beyond it 429 at once"
        },
    )
    timeout_s: float = field(
        default=30.0, metadata={"help": "seconds in the queue (then 504)", "flag": "--timeout"}
    )
    # admission by time, not only by count: a request is refused (429) when the work already
    # queued would take longer than this to run at the measured speed. Under overload the
    # queue then stays short, so latency stays bounded and recovers at once when load falls
    # (a queue bounded only by count fills to timeout_s of waiting first). 0: off.
    max_queue_ms: float = field(
        default=2000.0,
        metadata={
            "help": "refuse (429) while the queued work would take longer than this to run (0: off)"
        },
    )
    # glibc malloc arenas for the whole process (0: glibc's default, 8 per core). Each
    # worker thread otherwise gets its own arena, and freed activation memory stays in it:
    # MiniLM served 2x1 held 926 MiB RSS against 784 MiB for 1x1 (1.18x); with one arena
    # 812 against 787 MiB (1.03x), the weights being shared either way.
    malloc_arenas: int = field(
        default=1,
        metadata={
            "help": "glibc malloc arenas (0: glibc's default); one keeps N workers near one's "
            "memory"
        },
    )
    # count, per static int8 linear, the tokens whose input left the calibrated range (a
    # drift alarm on /metrics; squant.quant.monitor.RangeMonitor). Eager models only; costs one
    # min/max per token and static linear.
    watch_ranges: bool = field(
        default=False,
        metadata={
            "help": "count, per static int8 linear, tokens outside the calibrated range (on "
            "/metrics: squant_range_clipped_tokens_total); eager static models only"
        },
    )
    # a batch short of its limits waits up to this long (from its oldest sequence's arrival)
    # for more sequences of its bucket. 0 (default): never wait; at low load a request runs
    # at once. On a core shared with the HTTP front end, arrivals trickle in while a batch
    # runs, so a saturated server formed batches of ~4 where 8 were allowed; a few ms lets
    # them fill (docs/serving.md, served vs bench).
    max_wait_ms: float = field(
        default=0.0,
        metadata={
            "help": "a batch short of --max-batch-requests waits this long for more of its "
            "length bucket (0: never; a few ms fills batches when the front end shares the cores)"
        },
    )
    # after this long with nothing to run (and work run before it), hand the heap's free
    # pages back to the OS (glibc malloc_trim): a burst's big batches otherwise leave RSS at
    # their peak for good. An idle gap that short is rare under steady load. 0: never.
    idle_trim_s: float = 0.5
    # also trim whenever the queue runs empty between batches, at most this often: under
    # steady low traffic idle spells are rare, and after a burst RSS otherwise stayed at the
    # burst's level. A saturated queue never runs empty, so it costs nothing there. 0: off.
    trim_interval_s: float = 5.0
    buckets: tuple[int, ...] = BUCKETS
    # what runs the batches of a model loaded from a directory (engine/runtime.py): "auto"
    # runs a quantized directory's AOTInductor package (built on the first start and cached,
    # engine/package_cache.py; compiled instead when none can be built), compiles a model
    # quantized at start-up, and runs float checkpoints eagerly; "eager", "package" and
    # "compiled" force one. Compiling adds 1-2 minutes to every start.
    runtime: Runtime = "auto"
    # the compiled runtime's attention kernel (CompileConfig.attention). "auto" times squant's
    # and PyTorch's in each process and keeps the faster, so two processes may choose
    # differently: real MiniLM, 200 inputs, two servers agreed only to cosine 0.99877 (each
    # >= 0.9964 vs FP32). Name one where replicas must return identical vectors.
    attention: Attention = "auto"
    # run the model in a child process of its own (engine/model_process.py): the HTTP front
    # end, JSON and tokenization then never hold the GIL the model's forward takes back for
    # moments, which cost the model ~11% of its speed beside a busy front end. Pays where the
    # front end has cores of its own; costs a second process (~MB in docs/serving.md).
    model_process: bool = False

    def __post_init__(self) -> None:
        names = ("max_batch_requests", "max_batch_tokens", "max_queue", "max_inputs")
        for name in (*names, "max_concurrent"):
            if getattr(self, name) < 1:
                raise SquantError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.timeout_s > 0:
            raise SquantError(f"timeout_s must be > 0, got {self.timeout_s}")
        if not 0 <= self.max_queue_ms < float("inf"):  # NaN fails this too
            raise SquantError(f"max_queue_ms must be a finite number >= 0, got {self.max_queue_ms}")
        # glibc caps arenas at 8 per core; beyond a few thousand a number is a typo
        if not 0 <= self.malloc_arenas <= 4096:
            raise SquantError(f"malloc_arenas must be in [0, 4096], got {self.malloc_arenas}")
        if self.model_process and self.watch_ranges:
            raise SquantError(
                "watch_ranges counts in the server's own model: not with model_process"
            )
        if self.attention not in ATTENTIONS:
            raise SquantError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.runtime not in RUNTIMES:
            raise SquantError(f"runtime must be one of {RUNTIMES}, got {self.runtime!r}")
        for name in ("max_wait_ms", "idle_trim_s", "trim_interval_s"):  # waits: finite
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise SquantError(f"{name} must be a finite number >= 0, got {value}")
