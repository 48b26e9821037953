"""The bucketed queue and admission on their own: token ids in, batches out, no model."""

import threading
import time

import pytest

from squant.engine.batching import BatchQueue, DeadlineExceededError, OverloadedError
from squant.engine.config import ServeConfig


def ids(n: int) -> tuple[list[int], None]:
    return [1] * n, None


def queue(**config) -> BatchQueue:
    defaults = {"instances": 1, "cores_per_instance": 1, "max_batch_requests": 3}
    return BatchQueue(ServeConfig(**{**defaults, **config}), buckets=(16, 32, 64))


def test_a_batch_is_the_oldest_sequence_and_more_of_its_bucket_up_to_the_limits():
    q = queue(max_batch_tokens=64)
    futures = q.submit([ids(5), ids(20), ids(7), ids(9), ids(3), ids(30)])
    assert [f.done() for f in futures] == [False] * 6
    first = q.take_batch()
    assert [len(s.ids) for s in first] == [5, 7, 9]  # bucket 16, max_batch_requests 3
    second = q.take_batch()
    assert [len(s.ids) for s in second] == [20, 30]  # the oldest left: bucket 32, 64 tokens
    assert [len(s.ids) for s in q.take_batch()] == [3]
    assert q.queue_depth() == 0
    assert q.largest_batch(64) == 1 and q.largest_batch(16) == 3


def test_per_token_and_pooled_sequences_never_share_a_batch():
    q = queue()
    q.submit([ids(4)])
    q.submit([ids(4)], per_token=True)
    q.submit([ids(4)])
    assert [s.per_token for s in q.take_batch()] == [False, False]
    assert [s.per_token for s in q.take_batch()] == [True]


def test_the_queue_is_bounded_by_count_and_by_measured_time():
    q = queue(max_queue=3, max_queue_ms=0)
    q.submit([ids(4), ids(4)])
    with pytest.raises(OverloadedError, match="queue full"):
        q.submit([ids(4), ids(4)])
    timed = queue(max_queue=100, max_queue_ms=50)
    assert timed.queue_seconds() == 0.0  # no speed measured yet: an idle queue admits
    timed.submit([ids(4)])
    batch = timed.take_batch()
    timed.ran(batch, padded=1000, real=1000, started=time.perf_counter(), elapsed=1.0)
    assert timed.stats.batches == 1 and timed.stats.padded_tokens == 1000
    for _ in range(3):
        timed.submit([ids(4)])  # 16 ms each at 1,000 tokens/s
    timed.submit([ids(4)])  # 48 ms queued: still admitted
    with pytest.raises(OverloadedError, match="of work queued") as refused:
        timed.submit([ids(4)])
    assert refused.value.retry_after_s == pytest.approx(0.064)
    assert timed.refusal() is not None


def test_a_sequence_past_its_deadline_is_dropped_with_a_504_not_run():
    q = queue(timeout_s=0.01)
    (late,) = q.submit([ids(4)])
    time.sleep(0.02)
    assert q.take_batch() == []
    with pytest.raises(DeadlineExceededError):
        late.result(timeout=0)
    assert q.stats.dropped_deadline == 1


def test_stop_drains_then_releases_waiting_workers():
    q = queue(idle_trim_s=0, trim_interval_s=0)
    taken: list = []
    worker = threading.Thread(target=lambda: taken.append(q.take_batch()))
    worker.start()
    q.stop(grace_s=0.1)
    worker.join(timeout=5)
    assert taken == [None]
    with pytest.raises(OverloadedError, match="shutting down"):
        q.submit([ids(4)])
