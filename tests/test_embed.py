"""`squant embed`: every row once, in order, resumable after a crash, refused on mismatch."""

import pytest
import torch

pytest.importorskip("pyarrow")
import pyarrow.parquet as pq

import squant
from squant.cli import main
from squant.embed.local import embed_file
from squant.engine.engine import ServeConfig

TEXTS = [
    "the cat sat on the mat",
    "",
    "a dog runs fast in the park",
    "red car",
    "the man plays music and the woman is happy",
] * 5  # 25 rows, an empty one among them


@pytest.fixture(scope="module")
def engine(base_dir):
    from squant.engine.loading import engine_for

    config = ServeConfig(
        instances=1, cores_per_instance=1, max_queue=8, max_queue_ms=0, runtime="eager"
    )
    e = engine_for(base_dir, config)
    e.start(warm=False)
    yield e
    e.stop(1.0)


def _read(out):
    parts = sorted(out.glob("part-*.parquet"))
    rows, vectors = [], []
    for p in parts:
        t = pq.read_table(p).to_pydict()
        rows += t["row"]
        vectors += t["embedding"]
    return parts, rows, torch.tensor(vectors)


def test_every_row_once_in_order_and_equal_to_single_texts(engine, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    report = embed_file(engine, corpus, tmp_path / "out", shard_rows=10, progress=False)
    assert (report.rows, report.shards, report.skipped_shards) == (25, 3, 0)
    parts, rows, vectors = _read(tmp_path / "out")
    assert len(parts) == 3 and rows == list(range(25))
    assert vectors.shape == (25, report.dim)
    # each row is its own text's embedding (mean over real tokens), as if sent alone
    for i in (0, 1, 13, 24):
        enc = engine.tokenizer([TEXTS[i]], return_tensors="pt")
        with torch.no_grad():
            alone = engine.model(**enc).last_hidden_state.mean(1)[0]
        torch.testing.assert_close(vectors[i], alone, rtol=1e-4, atol=1e-4)


def test_a_rerun_after_a_crash_redoes_only_missing_or_damaged_shards(engine, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out"
    embed_file(engine, corpus, out, shard_rows=10, progress=False)
    _, rows0, vectors0 = _read(out)
    (out / "part-00001.parquet").unlink()  # never written
    (out / "part-00002.parquet").write_bytes(b"PAR1 half a file")  # damaged
    report = embed_file(engine, corpus, out, shard_rows=10, progress=False)
    assert (report.shards, report.skipped_shards) == (3, 1)
    _, rows1, vectors1 = _read(out)
    assert rows1 == rows0
    torch.testing.assert_close(vectors1, vectors0, rtol=0, atol=0)
    assert not list(out.glob(".*.tmp"))
    # other settings into the same directory: refused, nothing touched
    with pytest.raises(squant.SquantError, match="other shard_rows"):
        embed_file(engine, corpus, out, shard_rows=7, progress=False)
    assert len(list(out.glob("part-*.parquet"))) == 3


def test_embed_command(base_dir, tiny_checkpoint, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(f'{{"text": "{t}"}}' for t in TEXTS[:7]) + "\n")
    out = tmp_path / "out"
    args = ["embed", str(base_dir), str(corpus), "--out", str(out), "--shard-rows", "4"]
    args += ["--runtime", "eager"]  # compiling is tested in test_serve.py
    assert main([*args, "--normalize"]) == 0
    assert "7 rows" in capsys.readouterr().out
    _, rows, vectors = _read(out)
    assert rows == list(range(7))
    torch.testing.assert_close(vectors.norm(dim=1), torch.ones(7))
    code = main(["embed", str(base_dir), str(tmp_path / "none.txt"), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("squant embed: error:") and "does not exist" in err
    (tmp_path / "empty.txt").write_text("")
    code = main(["embed", str(base_dir), str(tmp_path / "empty.txt"), "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "is empty: nothing to embed" in err and not (tmp_path / "e").exists()
    code = main(["embed", str(tiny_checkpoint), str(corpus), "--out", str(tmp_path / "o2")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "needs a base model" in err


def test_a_directory_made_at_another_truncation_length_is_refused(engine, base_dir, tmp_path):
    """Rows truncated at two lengths must never share a directory: a resumed run that
    truncates elsewhere (or an older squant's directory, which recorded no length) is refused,
    and the Ray driver reads the same length from the files as the local engine records."""
    import copy
    import json

    from squant.engine.loading import truncation_stated

    assert truncation_stated(base_dir) == engine.stated_length
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out"
    embed_file(engine, corpus, out, shard_rows=10, progress=False)
    manifest = json.loads((out / "embed.json").read_text())
    assert manifest["truncation"] == engine.stated_length
    (out / "part-00002.parquet").unlink()
    shorter = copy.copy(engine)  # the same workers, another stated length
    shorter.stated_length = (engine.stated_length or 512) // 2
    with pytest.raises(squant.SquantError, match="other truncation"):
        embed_file(shorter, corpus, out, shard_rows=10, progress=False)
    del manifest["truncation"]  # as squant wrote it before it recorded the length
    (out / "embed.json").write_text(json.dumps(manifest))
    with pytest.raises(squant.SquantError, match="older squant"):
        embed_file(engine, corpus, out, shard_rows=10, progress=False)
    assert len(list(out.glob("part-*.parquet"))) == 2  # nothing was written


def test_a_model_changed_in_place_does_not_resume_into_old_shards(engine, base_dir, tmp_path):
    """The manifest records the model's content: the same path with other weights (say,
    quantized again into the same directory) is refused; a file that is not part of the
    model (a README) changes nothing."""
    import shutil

    from squant.files import model_sha256

    model = tmp_path / "model"
    shutil.copytree(base_dir, model)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out"
    first = embed_file(engine, corpus, out, shard_rows=10, model_name=str(model), progress=False)
    assert "rows/s" in first.line()
    (out / "part-00002.parquet").unlink()
    (model / "README.md").write_text("notes")  # not part of the model
    resumed = embed_file(engine, corpus, out, shard_rows=10, model_name=str(model), progress=False)
    assert (resumed.skipped_shards, resumed.embedded_rows) == (2, 5)  # the rate counts 5 rows
    weights = next(model.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
    assert model_sha256(model) != model_sha256(base_dir)
    (out / "part-00002.parquet").unlink()
    with pytest.raises(squant.SquantError, match="other model_sha256"):
        embed_file(engine, corpus, out, shard_rows=10, model_name=str(model), progress=False)
    assert len(list(out.glob("part-*.parquet"))) == 2  # nothing was written


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("out-is-input", "is a file"),
        ("out-inside-model", "overlaps the model"),
        ("other-shard-rows", "other shard_rows"),
        ("pairs", "a pair"),
        ("empty", "is empty"),
    ],
)
def test_embed_refuses_before_loading_the_model(
    base_dir, tmp_path, monkeypatch, capsys, case, message
):
    """What squant embed can refuse without the model it refuses before loading it (a
    compiled model takes minutes to build): loading here would fail the test."""
    import squant.engine.loading as loading

    texts = tmp_path / "texts.txt"
    texts.write_text("a cat\na dog\n")
    out = tmp_path / "out"
    args = ["embed", str(base_dir), str(texts), "--out", str(out), "--runtime", "eager"]
    if case == "other-shard-rows":
        assert main([*args, "--shard-rows", "1"]) == 0
        args += ["--shard-rows", "2"]
    elif case == "out-is-input":
        args[4] = str(texts)
    elif case == "out-inside-model":
        args[4] = str(base_dir / "shards")
    elif case == "pairs":
        texts.write_text('{"sentence1": "a", "sentence2": "b"}\n')
        args[2] = str(texts.rename(tmp_path / "pairs.jsonl"))
    elif case == "empty":
        texts.write_text("")
    before = sorted(p.name for p in tmp_path.rglob("*"))

    def no_loading(*_a, **_k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(loading, "engine_for", no_loading)
    capsys.readouterr()
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert not (base_dir / "shards").exists()
