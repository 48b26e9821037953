"""The serving engine: admission, length-bucketed dynamic batching, pinned shared-weight workers.

    engine = Engine(model, tokenizer, ServeConfig(instances=2, cores_per_instance=1))
    engine.start()                       # workers pinned to their cores, shapes warmed
    vectors = engine.embed(["a text", "another"]).result()

- Requests are tokenized on admission, in the caller's thread, with one tokenizer copy per
  thread (a fast tokenizer shared by threads fails with "Already borrowed").
- Each text becomes one sequence, padded to its length bucket. A free worker takes the
  oldest waiting sequence and fills its batch with the oldest others of the same bucket, up
  to max_batch_requests sequences and max_batch_tokens padded tokens. No wait timer by
  default (at low load a request runs alone, at once); max_wait_ms lets a short batch wait.
- The queue is bounded (max_queue sequences): beyond it submit raises OverloadedError (HTTP 429);
  a sequence whose deadline passed while waiting is dropped, not run (HTTP 504).
- Workers are threads of one process sharing ONE model (placement.py: each
  pinned to its own cores with its own OpenMP team); squant's kernels release the GIL.
- Shapes: every (batch size, bucket) pair is bounded by the config; `start` runs each bucket
  once at the largest batch before the engine reports ready.
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..checkpoint.sentence_transformer import stated_length
from ..errors import SquantError
from ..quant.mappings import hf_config, max_positions
from ..quant.monitor import RangeMonitor
from ..runtime.compiler import ATTENTIONS, Attention
from ..runtime.placement import front_end_cores, pin_current_thread, plan
from .executor import Executor, LocalExecutor
from .process_memory import limit_malloc_arenas, release_free_memory
from .runtime import RUNTIMES, Runtime

BUCKETS = (16, 32, 64, 128, 256, 512)
# Padded tokens per batch. Real MiniLM static INT8 on one AVX2 core, 128-token sequences
# (squant bench): 24-27 seq/s at 1,024 tokens, 29.5 at 2,048, 30.7 at 4,096, 19.4 at 8,192
# (the earlier default). Served, closed loop: 2,048 gave 17% more than 1,024, while RSS
# grew less under a 3x burst with 1,024 (+8% vs +19%; docs/serving.md, overload). The server takes
# 2,048 (latency and memory); offline bulk embedding 4,096 (throughput only).
SERVE_BATCH_TOKENS = 2048
OFFLINE_BATCH_TOKENS = 4096


class OverloadedError(Exception):
    """The queue is full, or holds more work than max_queue_ms: try again later (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def retry_after(self) -> str:
        """The Retry-After header: whole seconds, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


class DeadlineExceededError(Exception):
    """The request waited in the queue past its deadline (HTTP 504)."""


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
    # what runs the batches of a model loaded from a directory (serve/runtime.py): "auto"
    # runs a quantized directory's AOTInductor package (built on the first start and cached,
    # serve/package_cache.py; compiled instead when none can be built), compiles a model
    # quantized at start-up, and runs float checkpoints eagerly; "eager", "package" and
    # "compiled" force one. Compiling adds 1-2 minutes to every start.
    runtime: Runtime = "auto"
    # the compiled runtime's attention kernel (CompileConfig.attention). "auto" times squant's
    # and PyTorch's in each process and keeps the faster, so two processes may choose
    # differently: real MiniLM, 200 inputs, two servers agreed only to cosine 0.99877 (each
    # >= 0.9964 vs FP32). Name one where replicas must return identical vectors.
    attention: Attention = "auto"
    # run the model in a child process of its own (serve/model_process.py): the HTTP front
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


@dataclass
class _Sequence:
    ids: list[int]
    type_ids: list[int] | None
    bucket: int
    deadline: float
    future: Future[Any] = field(default_factory=Future)
    enqueued: float = field(default_factory=time.perf_counter)
    per_token: bool = False  # its result: one row per token, not the pooled row


@dataclass
class Admission:
    """One admitted request. Until it queues its sequences it is counted as work on its way
    (tokenizing, or waiting for a tokenizer thread) at the average request's size."""

    queued: bool = False


class Stats:
    """Counters the metrics endpoint reads (plain numbers, updated under one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches = 0
        self.sequences = 0
        self.real_tokens = 0
        self.padded_tokens = 0
        self.dropped_deadline = 0
        self.queue_seconds = 0.0
        self.inference_seconds = 0.0


class Engine:
    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        config: ServeConfig | None = None,
        pooling: str = "mean",
        normalize_default: bool = False,
        runner: Any = None,
        max_length: int | None = None,
        executor: Executor | None = None,
    ) -> None:
        """max_length: where inputs are truncated (or refused), never beyond the model's
        positions; None: the tokenizer's model_max_length (where sentence-transformers 6 keeps
        max_seq_length, and where Hugging Face pipelines truncate), else the positions.
        executor: runs the batches instead of the model in this process (a ModelProcess); the
        model then only describes it (a ModelDescription)."""
        self.model = model.eval()
        # what runs the batches: the model itself, or a compiled form of it (squant.compile
        # with dynamic shapes: one graph for every bucket and batch size)
        runs = runner if runner is not None else self.model
        self.tokenizer = tokenizer
        self.config = config or ServeConfig()
        self.pooling = pooling
        self.normalize_default = normalize_default
        # what the files state (None: the positions), kept apart from the effective length:
        # squant embed records it, and its Ray driver, which never loads the model, can read
        # the same from the files (loading.truncation_stated)
        self.stated_length = stated_length(tokenizer, max_length)
        self.max_length = min(max_positions(model), self.stated_length or 1_000_000)
        self.buckets = (*(b for b in self.config.buckets if b < self.max_length), self.max_length)
        self.placement = plan(self.config.instances, self.config.cores_per_instance)
        self.stats = Stats()
        self._queue: deque[_Sequence] = deque()
        self._queued_tokens = 0  # padded tokens waiting (bucket widths)
        self._in_flight = 0  # requests admitted and not yet answered
        self._unqueued = 0  # of those, the ones that have not queued their sequences yet
        self._tokens_per_request: float | None = None  # padded, moving average
        self._tokens_per_s: float | None = None  # all workers together, moving average
        self._cond = threading.Condition()
        self._local = threading.local()
        self._workers: list[threading.Thread] = []
        self._waiting = 0  # workers waiting for work (idle)
        self._stopping = False
        self._ran_since_trim = False  # work ran since the heap was last trimmed
        self._last_trim = time.perf_counter()
        self.trims = 0
        self._template: tuple[list[int], list[int], bool] | None = None  # _special_template
        self.ready = False
        self.draining = False
        self.warm_shapes = (0, 0)  # (warmed, to warm): /ready shows start-up progress
        self.quantize_report: Any = None  # set when the model was quantized at start-up
        # a base model embeds; one with a head predicts (packaged models state their class)
        self.model_class = str(getattr(model, "model_class", type(model).__name__))
        self.task = "embed" if self.model_class.endswith("Model") else "predict"
        self.range_monitor: RangeMonitor | None = None
        if self.config.watch_ranges:
            if runner is not None:
                raise SquantError("watch_ranges needs the eager model; this engine runs another")
            monitor = RangeMonitor(self.model)
            if not monitor.modules:
                raise SquantError(
                    "--watch-ranges: this model has no static int8 linears (a directory from "
                    "squant quantize --mode static serves eagerly and has them)"
                )
            self.range_monitor = monitor.__enter__()  # hooks for the engine's lifetime
            runs = monitor
        self.executor: Executor = executor or LocalExecutor(
            self.model, runs, self.task, self.pooling
        )

    @property
    def runner(self) -> Any:
        """What runs the batches in this process (None when an executor elsewhere does)."""
        return getattr(self.executor, "runner", None)

    # -- admission (caller threads) ------------------------------------------------------

    def _tokenizer(self) -> Any:
        tok = getattr(self._local, "tokenizer", None)
        if tok is None:
            tok = self._local.tokenizer = copy.deepcopy(self.tokenizer)
        return tok

    def tokenize(
        self, texts: Sequence[str | tuple[str, str]], truncate: bool = True
    ) -> list[tuple[list[int], list[int] | None]]:
        """Token ids (and segment ids for pairs) per text; over-length is an error unless
        truncate."""
        tok = self._tokenizer()
        out = []
        for t in texts:
            limit = self.max_length if truncate else None
            if isinstance(t, tuple):
                # as a batch of one: called with one pair, the tokenizer drops an empty second
                # text ("" is falsy there) and encodes a single text without its [SEP]
                enc = {
                    k: v[0]
                    for k, v in tok([t[0]], [t[1]], truncation=truncate, max_length=limit).items()
                }
            else:
                enc = tok(t, truncation=truncate, max_length=limit)
            ids = list(enc["input_ids"])
            if len(ids) > self.max_length:
                raise ValueError(
                    f"input of {len(ids)} tokens exceeds the model's {self.max_length}; "
                    "send truncate=true or a shorter text"
                )
            out.append((ids, list(enc["token_type_ids"]) if "token_type_ids" in enc else None))
        return out

    def encode_ids(
        self, sequences: Sequence[Sequence[int]], truncate: bool = True
    ) -> list[tuple[list[int], list[int] | None]]:
        """Inputs the client tokenized (OpenAI's and TEI's integer arrays): ids of this
        model's own vocabulary. The model's special tokens are added as for text unless the
        ids already begin and end with them, so both `tokenizer(text).input_ids` and
        `tokenizer.encode(text, add_special_tokens=False)` embed as the text itself does.
        Ids outside the model's embedding table are an error (the embedding lookup would read
        past it), as is over-length unless truncate."""
        prefix, suffix, segments = self._special_template()
        vocab = int(hf_config(self.model).vocab_size)
        room = self.max_length - len(prefix) - len(suffix)
        out = []
        for n, ids in enumerate(sequences):
            bad = next((i for i in ids if not 0 <= i < vocab), None)
            if bad is not None:
                raise ValueError(
                    f"input {n}: token id {bad} is outside this model's vocabulary [0, {vocab}); "
                    "token ids must come from the served model's tokenizer (LangChain's "
                    "OpenAIEmbeddings sends OpenAI tiktoken ids unless "
                    "check_embedding_ctx_length=False)"
                )
            content = list(ids)
            carries = (
                len(content) >= len(prefix) + len(suffix)
                and content[: len(prefix)] == prefix
                and content[len(content) - len(suffix) :] == suffix
            )
            if carries:
                content = content[len(prefix) : len(content) - len(suffix)]
            if len(content) > room:
                if not truncate:
                    raise ValueError(
                        f"input {n} of {len(content) + len(prefix) + len(suffix)} tokens exceeds "
                        f"the model's {self.max_length}; send truncate=true or fewer ids"
                    )
                content = content[:room]
            full = prefix + content + suffix
            out.append((full, [0] * len(full) if segments else None))
        return out

    def _special_template(self) -> tuple[list[int], list[int], bool]:
        """The special ids the tokenizer puts before and after one text (BERT: [CLS] and
        [SEP]; RoBERTa, XLM-R: <s> and </s>), read from how it encodes a one-word text, and
        whether it makes segment ids."""
        template = self._template
        if template is None:
            enc = self._tokenizer()("a", return_special_tokens_mask=True)
            ids, special = list(enc["input_ids"]), list(enc["special_tokens_mask"])
            words = [i for i, s in enumerate(special) if not s]
            if not words or words != list(range(words[0], words[-1] + 1)):
                raise SquantError(
                    "this tokenizer's special-token layout is not prefix + text + suffix"
                )
            template = self._template = (
                ids[: words[0]],
                ids[words[-1] + 1 :],
                "token_type_ids" in enc,
            )
        return template

    def token_details(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[dict[str, Any]]]:
        """TEI's /tokenize answer: per text, its tokens as {id, text, special, start, stop},
        truncated as inference truncates. start/stop are character offsets into the text
        (None for special tokens, and where the tokenizer is not a fast one)."""
        tok = self._tokenizer()
        out = []
        for text in texts:
            enc = tok(
                text,
                truncation=True,
                max_length=self.max_length,
                add_special_tokens=add_special_tokens,
                return_special_tokens_mask=True,
                return_offsets_mapping=bool(getattr(tok, "is_fast", False)),
            )
            ids = list(enc["input_ids"])
            offsets = enc.get("offset_mapping")
            pieces = tok.convert_ids_to_tokens(ids)
            row = []
            for i, (token_id, special) in enumerate(
                zip(ids, enc["special_tokens_mask"], strict=True)
            ):
                start, stop = (None, None) if special or offsets is None else offsets[i]
                row.append(
                    {
                        "id": int(token_id),
                        "text": pieces[i] if start is None else text[start:stop],
                        "special": bool(special),
                        "start": start,
                        "stop": stop,
                    }
                )
            out.append(row)
        return out

    def submit(
        self,
        encoded: list[tuple[list[int], list[int] | None]],
        admission: Admission | None = None,
        per_token: bool = False,
    ) -> list[Future[Any]]:
        """Queue sequences; returns one future per sequence (its output row; with per_token,
        its last hidden state [tokens, dim], for a model that embeds). admission: the
        request's, from admitted(): it stops counting as work on its way."""
        if per_token and self.task != "embed":
            raise ValueError("per-token outputs are for models that embed")
        deadline = time.perf_counter() + self.config.timeout_s
        seqs = [
            _Sequence(
                ids,
                types,
                next(b for b in self.buckets if b >= len(ids)),
                deadline,
                per_token=per_token,
            )
            for ids, types in encoded
        ]
        tokens = sum(s.bucket for s in seqs)
        with self._cond:
            if admission is not None and not admission.queued:
                admission.queued = True  # counted by its real size from here (or refused)
                self._unqueued -= 1
            old = self._tokens_per_request
            self._tokens_per_request = tokens if old is None else 0.9 * old + 0.1 * tokens
            self._refuse_if_busy()
            if len(self._queue) + len(seqs) > self.config.max_queue:
                raise OverloadedError(f"queue full ({len(self._queue)} sequences waiting)")
            self._queue.extend(seqs)
            self._queued_tokens += tokens
            self._cond.notify_all()
        return [s.future for s in seqs]

    def _refuse_if_busy(self) -> None:
        """OverloadedError when shutting down or when the queued work exceeds max_queue_ms
        (caller holds the lock). Only work already queued counts: an idle server admits
        anything."""
        if self.draining or self._stopping:
            raise OverloadedError("the server is shutting down")
        wait_s, limit_s = self.queue_seconds(), self.config.max_queue_ms / 1e3
        if limit_s and wait_s > limit_s:
            raise OverloadedError(
                f"{wait_s:.1f} s of work queued (limit {limit_s:.1f} s)", retry_after_s=wait_s
            )

    def refusal(self) -> OverloadedError | None:
        """Why a request arriving now would be refused (None: it would be admitted). Read
        without the lock by the HTTP front door, which turns overload away before reading or
        parsing a body; admitted() makes the same check under the lock, and binds."""
        try:
            self._refuse_if_busy()
        except OverloadedError as e:
            return e
        if self._in_flight >= self.config.max_concurrent:
            return OverloadedError(f"{self._in_flight} requests in flight")
        return None

    @contextlib.contextmanager
    def admitted(self) -> Iterator[Admission]:
        """Hold a request's admission for its whole life (tokenize, queue, run). Refused
        (OverloadedError) before any work when max_concurrent requests are in flight or the
        work queued *and on its way* already exceeds max_queue_ms: an overloaded server then
        spends nothing on the requests it turns away, and nothing piles up outside the
        bounded queue. Pass the yielded Admission to submit()."""
        with self._cond:
            refused = self.refusal()
            if refused is not None:
                raise refused
            self._in_flight += 1
            self._unqueued += 1
        admission = Admission()
        try:
            yield admission
        finally:
            with self._cond:
                self._in_flight -= 1
                if not admission.queued:
                    self._unqueued -= 1

    def healthy(self) -> bool:
        """Every worker thread started is still running (False once one has died, or after
        stop): what /health and Ray's replica health check report."""
        return (
            self.executor.alive()
            and bool(self._workers)
            and all(t.is_alive() for t in self._workers)
        )

    def in_flight(self) -> int:
        return self._in_flight

    def queue_seconds(self) -> float:
        """Estimated time to run what is queued now and what admitted requests still being
        tokenized will queue (at the average request's size), at the measured speed (0
        before any). Counting only the queue let a 3x burst admit hundreds of requests that
        then waited for tokenizer threads, outside every bound, for seconds after the burst."""
        rate = self._tokens_per_s
        if not rate:
            return 0.0
        on_the_way = self._unqueued * (self._tokens_per_request or 0.0)
        return (self._queued_tokens + on_the_way) / rate

    def queue_depth(self) -> int:
        return len(self._queue)

    # -- workers -------------------------------------------------------------------------

    def _take_batch(self) -> list[_Sequence] | None:
        """The next batch; None when stopping; [] after trimming the heap (outside the lock)
        when the queue ran empty after work and the engine was idle for idle_trim_s or
        trim_interval_s passed since the last trim."""
        trim_after, every = self.config.idle_trim_s, self.config.trim_interval_s
        batch: list[_Sequence] | None = None
        with self._cond:
            idle = False  # the last wait timed out: idle for trim_after seconds
            while not self._queue and not self._stopping:
                since = time.perf_counter() - self._last_trim
                due = (idle and trim_after) or (every and since >= every)
                if not (self._ran_since_trim and due):
                    self._waiting += 1
                    try:
                        idle = not self._cond.wait(trim_after or 0.5)
                    finally:
                        self._waiting -= 1
                    continue
                self._ran_since_trim = False
                self._last_trim = time.perf_counter()
                self.trims += 1
                break
            else:
                if not self._queue:
                    return None
                batch = self._pop_batch()
        if batch is None:
            release_free_memory()
            return []
        return self._live(batch)

    def _pop_batch(self) -> list[_Sequence]:
        """The oldest sequence and more of its bucket, up to the batch limits (lock held).
        With max_wait_ms, a batch short of its limit waits for more of its bucket until its
        oldest sequence has waited that long (the lock is released meanwhile)."""
        first = self._queue.popleft()
        self._queued_tokens -= first.bucket
        batch = [first]
        limit = min(
            self.config.max_batch_requests,
            max(1, self.config.max_batch_tokens // first.bucket),
        )
        if self._waiting:
            # other workers are idle: share this bucket's queued sequences with them rather
            # than run them all on this worker's cores while theirs wait (a request of 8 long
            # texts then takes about half as long on 2 workers; busy workers never wait here)
            queued = 1 + sum(
                1
                for s in self._queue
                if s.bucket == first.bucket and s.per_token == first.per_token
            )
            limit = min(limit, -(-queued // (self._waiting + 1)))
        self._fill(batch, limit)
        wait_until = first.enqueued + self.config.max_wait_ms / 1e3
        while len(batch) < limit and not self._stopping:
            remaining = wait_until - time.perf_counter()
            if remaining <= 0:
                break
            self._cond.wait(remaining)
            self._fill(batch, limit)
        return batch

    def _fill(self, batch: list[_Sequence], limit: int) -> None:
        """Move queued sequences of the batch's bucket (and kind of output) into it, oldest
        first (lock held)."""
        bucket, per_token = batch[0].bucket, batch[0].per_token
        kept: deque[_Sequence] = deque()
        while self._queue and len(batch) < limit:
            s = self._queue.popleft()
            if s.bucket == bucket and s.per_token == per_token:
                batch.append(s)
                self._queued_tokens -= s.bucket
            else:
                kept.append(s)
        self._queue.extendleft(reversed(kept))

    def _live(self, batch: list[_Sequence]) -> list[_Sequence]:
        """The batch without sequences whose client left or whose deadline passed."""
        now = time.perf_counter()
        live = []
        for s in batch:
            if s.future.cancelled():  # the client went away: never run
                continue
            if s.deadline < now:
                s.future.set_exception(DeadlineExceededError("deadline passed in the queue"))
                with self.stats.lock:
                    self.stats.dropped_deadline += 1
            elif s.future.set_running_or_notify_cancel():  # client gone: cancelled
                live.append(s)
        return live

    def _run(self, batch: list[_Sequence]) -> None:
        width = batch[0].bucket
        pad = int(getattr(self.tokenizer, "pad_token_id", 0) or 0)
        # filled in numpy, then shared with torch: per-row torch copies took ~180 us a batch of
        # 5 (12 us this way) under the GIL that the HTTP front end on this core waits for
        ids: np.ndarray = np.full((len(batch), width), pad, dtype=np.int64)
        mask: np.ndarray = np.zeros((len(batch), width), dtype=np.int64)
        types: np.ndarray = np.zeros((len(batch), width), dtype=np.int64)
        for i, s in enumerate(batch):
            n = len(s.ids)
            ids[i, :n] = s.ids
            mask[i, :n] = 1
            if s.type_ids is not None:
                types[i, :n] = s.type_ids
        per_token = batch[0].per_token
        t0 = time.perf_counter()
        rows = self.executor(ids, mask, types, per_token)
        elapsed = time.perf_counter() - t0
        for s, row in zip(batch, rows, strict=True):
            s.future.set_result(row[: len(s.ids)] if per_token else row)
        # every worker runs at about this speed: the engine's is instances times it
        rate = mask.size / max(elapsed, 1e-6) * self.placement.instances
        with self._cond:
            self._ran_since_trim = True
            old = self._tokens_per_s
            self._tokens_per_s = rate if old is None else 0.8 * old + 0.2 * rate
        with self.stats.lock:
            self.stats.batches += 1
            self.stats.sequences += len(batch)
            self.stats.real_tokens += int(mask.sum())
            self.stats.padded_tokens += mask.size
            self.stats.inference_seconds += elapsed
            self.stats.queue_seconds += sum(t0 - s.enqueued for s in batch)

    def _worker(self, index: int) -> None:
        # with an executor elsewhere (a model process) this thread only waits on its pipe: it
        # stays off the instances' cores, which belong to the child's threads
        in_process = self.executor.in_process
        cores = self.placement.cores[index] if in_process else front_end_cores(self.placement)
        pin_current_thread(cores, self.placement.cores_per_instance)
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            if batch:
                try:
                    self._run(batch)
                except Exception as e:  # one bad batch fails its requests, not the server
                    for s in batch:
                        if not s.future.done():
                            s.future.set_exception(e)

    def start(self, warm: bool = True) -> None:
        """Start the workers (and warm every bucket at its largest batch first)."""
        if self.config.malloc_arenas:
            limit_malloc_arenas(self.config.malloc_arenas)
        if warm:
            torch.set_num_threads(self.placement.cores_per_instance)
            # batch 1 and the largest batch: a compiled runner specializes size 1 apart
            # from the dynamic graph, so both are built now, not under traffic
            shapes = [
                (width, n)
                for width in self.buckets
                for n in sorted(
                    {
                        1,
                        min(
                            self.config.max_batch_requests,
                            max(1, self.config.max_batch_tokens // width),
                        ),
                    }
                )
            ]
            for k, (width, n) in enumerate(shapes):
                self.warm_shapes = (k, len(shapes))
                filler = [_Sequence([0] * width, None, width, float("inf")) for _ in range(n)]
                for s in filler:
                    s.future.set_running_or_notify_cancel()
                self._run(filler)
            self.warm_shapes = (len(shapes), len(shapes))
            self.stats = Stats()  # warm-up is not traffic
            self._tokens_per_s = None  # nor is its speed (first calls may compile)
            # every shape the batcher can send is warm: from here on a call that would compile
            # runs eagerly instead (counted in /metrics), never a 40-60 s stall under traffic
            self.seal()
        for i in range(self.placement.instances):
            t = threading.Thread(target=self._worker, args=(i,), daemon=True, name=f"squant-{i}")
            t.start()
            self._workers.append(t)
        self.ready = True

    def _largest_batch(self, width: int) -> int:
        return min(self.config.max_batch_requests, max(1, self.config.max_batch_tokens // width))

    def seal(self) -> None:
        """No compiling from now on (CompiledEncoder.seal), in this process or the model's."""
        self.executor.seal()

    @property
    def refused_recompiles(self) -> int:
        """Calls after warm-up whose shapes no compiled graph covered (run eagerly instead)."""
        return self.executor.refused_recompiles

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop admitting, finish what was admitted (within grace_s), stop the workers."""
        self.draining = True
        self.ready = False
        end = time.perf_counter() + grace_s
        while self._queue and time.perf_counter() < end:
            time.sleep(0.05)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for t in self._workers:
            t.join(max(0.0, end - time.perf_counter()) + 1.0)
        self.executor.close()
