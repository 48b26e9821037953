"""`squant embed --ray` and the Ray Data callable: every row exactly once, in order, equal to
the local command's, resumable (slow parts start a local Ray instance; skipped without the
ray extra)."""

import pytest
import torch

pytest.importorskip("ray")
pytest.importorskip("pyarrow")
import pyarrow.parquet as pq
import ray

from squant.cli import main
from squant.embed.local import embed_file, offline_config
from squant.embed.ray_data import claim_cores, embed_file_on_ray

TEXTS = [f"text number {i} about {'cats' if i % 3 else 'the weather today'}" for i in range(37)]
TEXTS[5] = ""  # an empty row


def _read(out):
    rows, vectors = [], []
    for p in sorted(out.glob("part-*.parquet")):
        t = pq.read_table(p).to_pydict()
        rows += t["row"]
        vectors += t["embedding"]
    return rows, torch.tensor(vectors)


def test_claim_cores_hands_out_each_slot_once(tmp_path):
    import os

    available = sorted(os.sched_getaffinity(0))
    first, lock1 = claim_cores(1, tmp_path)
    assert first == available[:1]
    held = [lock1]
    for expected in available[1:]:
        cores, lock = claim_cores(1, tmp_path)
        assert cores == [expected]
        held.append(lock)
    assert claim_cores(1, tmp_path) == ([], None)  # every slot taken
    held[0].close()  # the actor holding slot 0 ended
    assert claim_cores(1, tmp_path)[0] == available[:1]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_embedding_equals_local_and_resumes(base_dir, tmp_path, local_ray):
    from squant.engine.loading import engine_for

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    # the same settings as the Ray actors' (compiled where quantized)
    engine = engine_for(base_dir, offline_config(instances=1, cores_per_instance=1))
    engine.start(warm=False)
    try:
        embed_file(engine, corpus, tmp_path / "local", shard_rows=8, progress=False)
    finally:
        engine.stop(1.0)
    out = tmp_path / "ray"
    report = embed_file_on_ray(
        base_dir, corpus, out, shard_rows=8, actors=2, cores_per_actor=1, progress=False
    )
    assert (report.rows, report.shards, report.skipped_shards) == (37, 5, 0)
    rows, vectors = _read(out)
    local_rows, local_vectors = _read(tmp_path / "local")
    assert rows == local_rows == list(range(37))  # every row once, in order
    cos = torch.nn.functional.cosine_similarity(vectors, local_vectors, dim=-1)
    assert float(cos.min()) > 0.9999, cos
    # a crash lost one shard and damaged another: only those two are redone
    (out / "part-00001.parquet").unlink()
    (out / "part-00003.parquet").write_bytes(b"PAR1 half a file")
    again = embed_file_on_ray(
        base_dir, corpus, out, shard_rows=8, actors=2, cores_per_actor=1, progress=False
    )
    assert (again.shards, again.skipped_shards) == (5, 3)
    rows2, vectors2 = _read(out)
    assert rows2 == rows
    torch.testing.assert_close(vectors2, vectors, rtol=1e-5, atol=1e-5)


def test_embed_command_on_ray(base_dir, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS[:10]) + "\n")
    out = tmp_path / "out"
    args = ["embed", str(base_dir), str(corpus), "--out", str(out), "--shard-rows", "4"]
    assert main([*args, "--ray", "--cores-per-actor", "1"]) == 0
    assert "10 rows" in capsys.readouterr().out
    assert _read(out)[0] == list(range(10))
    # the same directory resumes locally: the manifest records the same model name
    assert main(args) == 0
    assert "3 already there" in capsys.readouterr().out


def test_an_unreachable_ray_address_is_one_line(base_dir, tmp_path, capsys, monkeypatch):
    def unreachable(**_kw):
        raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.1:1")

    monkeypatch.setattr(ray, "init", unreachable)
    # an earlier test's local cluster may still be up in this process: embed would reuse it
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a\nb\n")
    argv = ["embed", str(base_dir), str(corpus), "--out", str(tmp_path / "o"), "--ray"]
    assert main([*argv, "--ray-address", "192.0.2.1:1"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot reach the Ray cluster at 192.0.2.1:1" in err
