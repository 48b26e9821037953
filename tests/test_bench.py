"""Multi-instance runner: placement, real pinning, results; `squant bench` JSON fields."""

import json
import os

import pytest
import torch

from squant.bench import runner
from squant.bench.instances import InstancePool, split_rows
from squant.cli import main
from squant.errors import SquantError
from squant.runtime.placement import core_slots, plan
from squant.runtime.timing import measure, summarize

CORES = sorted(os.sched_getaffinity(0))


def test_summarize_percentiles():
    lat = summarize([0.001 * i for i in range(1, 101)])
    assert lat.n == 100
    assert lat.median_ms == pytest.approx(50.5)
    assert lat.p90_ms == pytest.approx(90.1)
    assert lat.min_ms == pytest.approx(1.0)
    assert measure(lambda: None, warmup=1, min_iters=5, min_seconds=0.0).n == 5


def test_plan_places_instances_on_distinct_cores():
    p = plan(len(CORES), 1)
    assert [c for group in p.cores for c in group] == CORES
    one = plan(1, len(CORES))
    assert one.cores == (tuple(CORES),)
    with pytest.raises(SquantError, match="need"):
        plan(len(CORES) + 1, 1)


def test_core_slots_cut_in_order_and_drop_the_remainder():
    assert core_slots(2, [4, 5, 6, 7, 8]) == [(4, 5), (6, 7)]
    assert core_slots(3, [0, 1]) == []
    assert core_slots(1) == [(c,) for c in CORES]


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")
def test_instances_really_run_pinned_to_their_cores():
    a = torch.randn(64, 64)
    result = runner.run(lambda: a @ a, plan(2, 1), duration_s=0.3, warmup=1)
    assert result["affinity_seen"] == [[CORES[0]], [CORES[1]]]
    assert result["calls"] > 0
    assert result["sequences_per_s"] > 0
    assert all(lat["n"] > 0 for lat in result["latency"])
    assert "rss_kib" in result["memory"]
    # the main thread's own affinity is untouched
    assert sorted(os.sched_getaffinity(0)) == CORES


def test_errors_in_an_instance_reach_the_caller():
    def boom():
        raise RuntimeError("kernel failed")

    with pytest.raises(RuntimeError, match="kernel failed"):
        runner.run(boom, plan(1, 1), duration_s=0.1, warmup=1)


@pytest.mark.compile
@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")
def test_bench_command_writes_every_field(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            str(tiny_checkpoint),
            "--variants",
            "fp32,static-compiled",
            "--seq",
            "16",
            "--instances",
            "2",
            "--cores-per-instance",
            "1",
            "--duration",
            "0.5",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "vs FP32" in printed
    record = json.loads(out.read_text())
    for key in (
        "model",
        "weights",
        "batch",
        "seq",
        "instances",
        "cores_per_instance",
        "results",
        "versions",
        "hardware",
        "memory_one_instance",
    ):
        assert key in record
    for variant in ("fp32", "static-compiled"):
        r = record["results"][variant]
        assert r["affinity_seen"] == [[CORES[0]], [CORES[1]]]
        assert r["sequences_per_s"] > 0
        assert len(r["latency"]) == 2
        assert {"median_ms", "p90_ms", "p99_ms"} <= set(r["latency"][0])


def test_pin_current_thread_pins_only_the_calling_thread_and_sizes_the_pool():
    import threading

    from squant.runtime.placement import allowed_cores, pin_current_thread

    cores = allowed_cores()
    if not cores:
        pytest.skip("no CPU affinity on this OS")
    seen = {}

    def pinned() -> None:
        before = torch.get_num_threads()
        pin_current_thread([cores[-1]], threads=1)
        seen["affinity"] = os.sched_getaffinity(threading.get_native_id())
        seen["threads"] = torch.get_num_threads()
        torch.set_num_threads(before)

    t = threading.Thread(target=pinned)
    t.start()
    t.join()
    assert seen == {"affinity": {cores[-1]}, "threads": 1}
    assert sorted(os.sched_getaffinity(0)) == cores  # this thread is untouched
    pin_current_thread([])  # no cores: nothing to do
    assert sorted(os.sched_getaffinity(0)) == cores


def test_write_result_adds_provenance_and_creates_the_directory(tmp_path):
    import json

    from squant.provenance import write_result

    path = tmp_path / "new" / "result.json"
    write_result(path, {"ratio": 1.5})
    record = json.loads(path.read_text())
    assert record["ratio"] == 1.5
    assert set(record["provenance"]) == {"command", "commit", "hardware", "versions"}
    assert record["provenance"]["hardware"]["isa"]


def test_split_rows_cuts_consecutive_near_equal_shares():
    x = {"input_ids": torch.arange(10).view(5, 2), "attention_mask": torch.ones(5, 2)}
    shares = split_rows(x, 2)
    assert [s["input_ids"].shape[0] for s in shares] == [3, 2]
    assert torch.equal(torch.cat([s["input_ids"] for s in shares]), x["input_ids"])
    assert len(split_rows({"a": torch.zeros(1, 3)}, 4)) == 1  # fewer rows than instances
    with pytest.raises(SquantError, match="empty"):
        split_rows({"a": torch.zeros(0, 3)}, 2)


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")
def test_instance_pool_runs_each_share_on_its_own_pinned_instance_in_row_order():
    seen: dict[int, list[int]] = {}

    def fn(x):
        import threading

        seen[int(x["a"][0, 0])] = sorted(os.sched_getaffinity(threading.get_native_id()))
        return x["a"] * 2

    x = {"a": torch.arange(12.0).view(6, 2)}
    with InstancePool(fn, plan(2, 1)) as pool:
        out = pool(x)
        assert torch.equal(out, x["a"] * 2)
        assert seen == {0: [CORES[0]], 6: [CORES[1]]}
        pool.fn = lambda x: (_ for _ in ()).throw(RuntimeError("kernel failed"))
        with pytest.raises(RuntimeError, match="kernel failed"):
            pool(x)
    assert sorted(os.sched_getaffinity(0)) == CORES  # the caller's own affinity is untouched
