"""Admission and the length-bucketed queue: which requests get in, and which sequences run
together. Pure Python (token ids in, batches of them out): no model, no tokenizer, testable
on its own; the engine (engine.py) tokenizes into it and its workers run what it hands out.

- Each text is one sequence, padded to its length bucket. A free worker takes the oldest
  waiting sequence and fills its batch with the oldest others of the same bucket (and kind of
  output), up to max_batch_requests sequences and max_batch_tokens padded tokens. No wait
  timer by default (at low load a request runs alone, at once); max_wait_ms lets a short
  batch wait.
- The queue is bounded twice: by count (max_queue sequences) and by time (max_queue_ms of
  queued work at the measured speed); beyond either, OverloadedError (HTTP 429). So are the
  requests in flight (max_concurrent). A sequence whose deadline passed while waiting is
  dropped, not run (HTTP 504).
- Idle workers trim the heap (glibc malloc_trim) after work, so a burst's memory goes back.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from .config import ServeConfig
from .process_memory import release_free_memory


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


@dataclass
class QueuedSequence:
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


class BatchQueue:
    """Admission, the bounded bucketed queue and the speed estimate that bounds it by time.

    buckets: the padded widths, ascending; the last is the longest input admitted.
    workers: how many batches run at once (the speed estimate is one batch's times it)."""

    def __init__(self, config: ServeConfig, buckets: tuple[int, ...], workers: int = 1) -> None:
        self.config = config
        self.buckets = buckets
        self.workers = workers
        self.stats = Stats()
        self.draining = False  # refusing new work (shutting down)
        self.trims = 0
        self._queue: deque[QueuedSequence] = deque()
        self._queued_tokens = 0  # padded tokens waiting (bucket widths)
        self._in_flight = 0  # requests admitted and not yet answered
        self._unqueued = 0  # of those, the ones that have not queued their sequences yet
        self._tokens_per_request: float | None = None  # padded, moving average
        self._tokens_per_s: float | None = None  # all workers together, moving average
        self._cond = threading.Condition()
        self._waiting = 0  # workers waiting for work (idle)
        self._stopping = False
        self._ran_since_trim = False  # work ran since the heap was last trimmed
        self._last_trim = time.perf_counter()

    # -- admission (caller threads) ------------------------------------------------------

    def submit(
        self,
        encoded: list[tuple[list[int], list[int] | None]],
        admission: Admission | None = None,
        per_token: bool = False,
    ) -> list[Future[Any]]:
        """Queue sequences (token ids, segment ids); one future per sequence. admission: the
        request's, from admitted(): it stops counting as work on its way."""
        deadline = time.perf_counter() + self.config.timeout_s
        seqs = [
            QueuedSequence(
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

    def take_batch(self) -> list[QueuedSequence] | None:
        """The next batch; None when stopping; [] after trimming the heap (outside the lock)
        when the queue ran empty after work and the engine was idle for idle_trim_s or
        trim_interval_s passed since the last trim."""
        trim_after, every = self.config.idle_trim_s, self.config.trim_interval_s
        batch: list[QueuedSequence] | None = None
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

    def _pop_batch(self) -> list[QueuedSequence]:
        """The oldest sequence and more of its bucket, up to the batch limits (lock held).
        With max_wait_ms, a batch short of its limit waits for more of its bucket until its
        oldest sequence has waited that long (the lock is released meanwhile)."""
        first = self._queue.popleft()
        self._queued_tokens -= first.bucket
        batch = [first]
        limit = self.largest_batch(first.bucket)
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

    def largest_batch(self, width: int) -> int:
        """Sequences of one bucket that one batch may hold."""
        return min(self.config.max_batch_requests, max(1, self.config.max_batch_tokens // width))

    def _fill(self, batch: list[QueuedSequence], limit: int) -> None:
        """Move queued sequences of the batch's bucket (and kind of output) into it, oldest
        first (lock held)."""
        bucket, per_token = batch[0].bucket, batch[0].per_token
        kept: deque[QueuedSequence] = deque()
        while self._queue and len(batch) < limit:
            s = self._queue.popleft()
            if s.bucket == bucket and s.per_token == per_token:
                batch.append(s)
                self._queued_tokens -= s.bucket
            else:
                kept.append(s)
        self._queue.extendleft(reversed(kept))

    def _live(self, batch: list[QueuedSequence]) -> list[QueuedSequence]:
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

    def ran(
        self, batch: list[QueuedSequence], padded: int, real: int, started: float, elapsed: float
    ) -> None:
        """A batch of `padded` tokens (`real` of them not padding) ran for `elapsed` seconds
        from `started`: its speed, times the workers, updates the estimate that bounds the
        queue by time."""
        # every worker runs at about this speed: the engine's is `workers` times it
        rate = padded / max(elapsed, 1e-6) * self.workers
        with self._cond:
            self._ran_since_trim = True
            old = self._tokens_per_s
            self._tokens_per_s = rate if old is None else 0.8 * old + 0.2 * rate
        with self.stats.lock:
            self.stats.batches += 1
            self.stats.sequences += len(batch)
            self.stats.real_tokens += real
            self.stats.padded_tokens += padded
            self.stats.inference_seconds += elapsed
            self.stats.queue_seconds += sum(started - s.enqueued for s in batch)

    def forget_warm_up(self) -> None:
        """Warm-up batches are not traffic: drop their counts and their speed (first calls
        may compile)."""
        self.stats = Stats()
        self._tokens_per_s = None

    def stop(self, grace_s: float) -> None:
        """Stop admitting; wait up to grace_s for the queue to empty; then wake every worker
        to leave (take_batch returns None)."""
        self.draining = True
        end = time.perf_counter() + grace_s
        while self._queue and time.perf_counter() < end:
            time.sleep(0.05)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
