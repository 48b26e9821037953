"""The serving engine: tokenization, and pinned shared-weight workers that run the batches
the queue hands out (batching.py: admission, length buckets, bounds).

    engine = Engine(model, tokenizer, ServeConfig(instances=2, cores_per_instance=1))
    engine.start()                       # workers pinned to their cores, shapes warmed
    futures = engine.submit(engine.tokenize(["a text", "another"]))

- Requests are tokenized on admission, in the caller's thread, with one tokenizer copy per
  thread (a fast tokenizer shared by threads fails with "Already borrowed").
- Workers are threads of one process sharing ONE model (placement.py: each
  pinned to its own cores with its own OpenMP team); squant's kernels release the GIL. What
  runs a batch is an executor (executor.py): the model here, or a model process.
- Shapes: every (batch size, bucket) pair is bounded by the config; `start` runs each bucket
  once at the largest batch before the engine reports ready.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
from torch import nn

from ..checkpoint.sentence_transformer import stated_length
from ..errors import SquantError
from ..quant.mappings import hf_config, max_positions
from ..quant.monitor import RangeMonitor
from ..runtime.placement import front_end_cores, pin_current_thread, plan
from .batching import (
    Admission,
    BatchQueue,
    DeadlineExceededError,
    OverloadedError,
    QueuedSequence,
    Stats,
)
from .config import BUCKETS, OFFLINE_BATCH_TOKENS, SERVE_BATCH_TOKENS, ServeConfig
from .executor import Executor, LocalExecutor
from .process_memory import limit_malloc_arenas

# the names callers import from here
__all__ = [
    "BUCKETS",
    "OFFLINE_BATCH_TOKENS",
    "SERVE_BATCH_TOKENS",
    "Admission",
    "DeadlineExceededError",
    "Engine",
    "OverloadedError",
    "ServeConfig",
    "Stats",
]


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
        # admission and the bucketed queue; the workers take their batches from it
        self.queue = BatchQueue(self.config, self.buckets, self.placement.instances)
        self._local = threading.local()
        self._workers: list[threading.Thread] = []
        self._template: tuple[list[int], list[int], bool] | None = None  # _special_template
        self.ready = False
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
        return self.queue.submit(encoded, admission, per_token)

    def refusal(self) -> OverloadedError | None:
        """Why a request arriving now would be refused (None: admitted); BatchQueue.refusal."""
        return self.queue.refusal()

    def admitted(self) -> contextlib.AbstractContextManager[Admission]:
        """A request's admission for its whole life; BatchQueue.admitted."""
        return self.queue.admitted()

    def healthy(self) -> bool:
        """Every worker thread started is still running (False once one has died, or after
        stop): what /health and Ray's replica health check report."""
        return (
            self.executor.alive()
            and bool(self._workers)
            and all(t.is_alive() for t in self._workers)
        )

    def in_flight(self) -> int:
        return self.queue.in_flight()

    def queue_seconds(self) -> float:
        return self.queue.queue_seconds()

    def queue_depth(self) -> int:
        return self.queue.queue_depth()

    @property
    def stats(self) -> Stats:
        return self.queue.stats

    @property
    def trims(self) -> int:
        return self.queue.trims

    @property
    def draining(self) -> bool:
        return self.queue.draining

    # -- workers -------------------------------------------------------------------------

    def _run(self, batch: list[QueuedSequence]) -> None:
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
        self.queue.ran(batch, mask.size, int(mask.sum()), t0, elapsed)

    def _worker(self, index: int) -> None:
        # with an executor elsewhere (a model process) this thread only waits on its pipe: it
        # stays off the instances' cores, which belong to the child's threads
        in_process = self.executor.in_process
        cores = self.placement.cores[index] if in_process else front_end_cores(self.placement)
        pin_current_thread(cores, self.placement.cores_per_instance)
        while True:
            batch = self.queue.take_batch()
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
                for n in sorted({1, self.queue.largest_batch(width)})
            ]
            for k, (width, n) in enumerate(shapes):
                self.warm_shapes = (k, len(shapes))
                filler = [QueuedSequence([0] * width, None, width, float("inf")) for _ in range(n)]
                for s in filler:
                    s.future.set_running_or_notify_cancel()
                self._run(filler)
            self.warm_shapes = (len(shapes), len(shapes))
            self.queue.forget_warm_up()
            # every shape the batcher can send is warm: from here on a call that would compile
            # runs eagerly instead (counted in /metrics), never a 40-60 s stall under traffic
            self.seal()
        for i in range(self.placement.instances):
            t = threading.Thread(target=self._worker, args=(i,), daemon=True, name=f"squant-{i}")
            t.start()
            self._workers.append(t)
        self.ready = True

    def seal(self) -> None:
        """No compiling from now on (CompiledEncoder.seal), in this process or the model's."""
        self.executor.seal()

    @property
    def refused_recompiles(self) -> int:
        """Calls after warm-up whose shapes no compiled graph covered (run eagerly instead)."""
        return self.executor.refused_recompiles

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop admitting, finish what was admitted (within grace_s), stop the workers."""
        self.ready = False
        end = time.perf_counter() + grace_s
        self.queue.stop(grace_s)
        for t in self._workers:
            t.join(max(0.0, end - time.perf_counter()) + 1.0)
        self.executor.close()
