"""sentence-transformers models through squant (quantize, encode, save, load, the CLI) and
Hub ids resolved through the huggingface_hub cache. Skipped where sentence-transformers is
not installed (the `st` extra)."""

import shutil

import pytest
import torch

import squant
from squant.checkpoint.models import looks_like_hub_id, resolve
from squant.cli import main
from squant.errors import SquantError
from squant.quant.qlinear import QuantLinear
from tests.conftest import WORDS

st_lib = pytest.importorskip("sentence_transformers", reason="pip install 'squant[st]'")

TEXTS = [" ".join(WORDS[i : i + 3 + i % 7]) for i in range(len(WORDS) - 10)]


@pytest.fixture(scope="module")
def st_dir(tiny_checkpoint, tmp_path_factory):
    """A sentence-transformers directory (transformer at the root, mean pooling, normalise)
    around the tiny BERT, as sentence-transformers itself writes it."""
    try:  # sentence-transformers 6 moved its module classes
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models

    transformer = models.Transformer(str(tiny_checkpoint), max_seq_length=48)
    pooling = models.Pooling(transformer.get_embedding_dimension(), "mean")
    model = st_lib.SentenceTransformer(modules=[transformer, pooling, models.Normalize()])
    path = tmp_path_factory.mktemp("st") / "tiny-st"
    model.save(str(path))
    return path


def _float(st_dir):
    return st_lib.SentenceTransformer(str(st_dir), device="cpu")


def test_quantize_keeps_pooling_and_normalisation(st_dir):
    float_model = _float(st_dir)
    q = squant.quantize(float_model, squant.SmoothQuantConfig(), TEXTS, progress=False)
    assert isinstance(q, st_lib.SentenceTransformer)
    inner = q[0].auto_model
    assert any(isinstance(m, QuantLinear) for m in inner.modules())
    assert not any(isinstance(m, QuantLinear) for m in float_model.modules())  # untouched
    assert [type(m).__name__ for m in q] == ["Transformer", "Pooling", "Normalize"]
    ref = float_model.encode(TEXTS, convert_to_tensor=True)
    got = q.encode(TEXTS, convert_to_tensor=True)
    assert got.shape == ref.shape
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-4)  # normalised
    cos = torch.nn.functional.cosine_similarity(ref, got)
    assert float(cos.min()) > 0.98, float(cos.min())


def test_save_and_load_give_the_same_sentence_transformer(st_dir, tmp_path):
    q = squant.quantize(_float(st_dir), squant.SmoothQuantConfig(), TEXTS, progress=False)
    out = squant.save(q, tmp_path / "int8")
    names = {p.name for p in out.iterdir()}
    assert {"modules.json", "1_Pooling", "squant.json", "model.safetensors"} <= names
    assert "config.json" not in names  # so a plain float load cannot pick up INT8 tensors
    card = (out / "README.md").read_text()  # the model card says what the directory holds
    assert card.startswith("# SmoothQuant INT8 model written by squant")
    assert "squant.load(directory)" in card and "(static activations)" in card
    back = squant.load(out)
    assert isinstance(back, st_lib.SentenceTransformer)
    torch.testing.assert_close(
        back.encode(TEXTS, convert_to_tensor=True), q.encode(TEXTS, convert_to_tensor=True)
    )
    # plain sentence-transformers: refused with a message naming squant's declared module,
    # never random weights; with trust_remote_code it loads through squant
    with pytest.raises(
        ValueError, match=r"(?s)squant\.st_module\.Int8Transformer.*trust_remote_code"
    ):
        st_lib.SentenceTransformer(str(out), device="cpu")
    trusted = st_lib.SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    torch.testing.assert_close(
        trusted.encode(TEXTS, convert_to_tensor=True), q.encode(TEXTS, convert_to_tensor=True)
    )
    assert "trust_remote_code=True" in card


def test_a_declared_module_that_names_other_code_is_not_put_back(st_dir, tmp_path):
    import json

    q = squant.quantize(_float(st_dir), squant.SmoothQuantConfig(), TEXTS, progress=False)
    out = squant.save(q, tmp_path / "int8")
    modules = json.loads((out / "modules.json").read_text())
    assert modules[0]["type"] == "squant.st_module.Int8Transformer"
    modules[0]["squant_original_type"] = "os.system"  # crafted: squant.load must not import it
    (out / "modules.json").write_text(json.dumps(modules))
    back = squant.load(out)  # loads with sentence-transformers' own Transformer instead
    torch.testing.assert_close(
        back.encode(TEXTS, convert_to_tensor=True), q.encode(TEXTS, convert_to_tensor=True)
    )


def test_quantize_command_on_a_sentence_transformers_directory(st_dir, calib_jsonl, tmp_path):
    out = tmp_path / "q"
    code = main(["quantize", str(st_dir), "--calib", str(calib_jsonl), "--out", str(out)])
    assert code == 0
    back = squant.load(out)
    assert isinstance(back, st_lib.SentenceTransformer)
    ref = _float(st_dir).encode(TEXTS[:8], convert_to_tensor=True)
    got = back.encode(TEXTS[:8], convert_to_tensor=True)
    assert float(torch.nn.functional.cosine_similarity(ref, got).min()) > 0.98


def test_a_transformer_outside_the_root_is_refused(st_dir, tmp_path):
    import json

    moved = tmp_path / "moved"
    shutil.copytree(st_dir, moved)
    modules = json.loads((moved / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (moved / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(SquantError, match="supports sentence-transformers directories"):
        squant.sentence_transformer.load_float(moved)


# --- Hub ids ---------------------------------------------------------------------------------


def test_hub_ids_and_paths_are_told_apart():
    assert looks_like_hub_id("bert-base-uncased")
    assert looks_like_hub_id("sentence-transformers/all-MiniLM-L6-v2")
    for path in ("./model", "../x", "/abs/path", "a/b/c", "dir/"):
        assert not looks_like_hub_id(path)


def test_a_hub_id_resolves_through_the_cache_offline(tiny_checkpoint, tmp_path, monkeypatch):
    from huggingface_hub import constants

    snapshot = tmp_path / "models--acme--tiny-bert" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_checkpoint, snapshot)
    (tmp_path / "models--acme--tiny-bert" / "refs").mkdir()
    (tmp_path / "models--acme--tiny-bert" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve("acme/tiny-bert") == snapshot
    model = squant.models.load_model("acme/tiny-bert")
    assert type(model).__name__ == "BertForSequenceClassification"
    with pytest.raises(SquantError, match="fetching it from the Hugging Face Hub failed"):
        resolve("acme/not-cached")


# --- serving ---------------------------------------------------------------------------------


def test_serving_truncates_where_sentence_transformers_does(st_dir):
    """The server cuts at the directory's max_seq_length (48 here; 256 for all-MiniLM-L6-v2),
    not at the model's 512 positions, so a long text embeds as sentence-transformers embeds
    it; buckets and the advertised length follow."""
    from squant.embed.local import embed_texts
    from squant.engine.engine import ServeConfig
    from squant.engine.loading import engine_for

    config = ServeConfig(instances=1, cores_per_instance=1, runtime="eager")
    engine = engine_for(st_dir, config)
    assert engine.max_length == 48 and engine.buckets == (16, 32, 48)
    long = " ".join(WORDS * 3)
    assert len(engine.tokenizer(long)["input_ids"]) > 100
    engine.start()
    try:
        got = embed_texts(engine, [long, "a dog"], normalize=True)
        with pytest.raises(ValueError, match="exceeds the model's 48"):
            engine.tokenize([long], truncate=False)
    finally:
        engine.stop(1.0)
    ref = _float(st_dir).encode([long, "a dog"], convert_to_tensor=True)
    assert float(torch.nn.functional.cosine_similarity(ref, got).min()) > 0.9999


def test_a_legacy_max_seq_length_wins_and_a_bad_one_is_a_clear_error(st_dir, tmp_path):
    """Directories from sentence-transformers < 6 (all-MiniLM-L6-v2 as published) state
    max_seq_length in sentence_bert_config.json, over the tokenizer's model_max_length."""
    import json

    from squant.checkpoint.sentence_transformer import sentence_settings
    from squant.engine.engine import ServeConfig
    from squant.engine.loading import engine_for

    legacy = tmp_path / "legacy"
    shutil.copytree(st_dir, legacy)
    (legacy / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40}))
    assert sentence_settings(legacy).max_seq_length == 40
    config = ServeConfig(instances=1, cores_per_instance=1, runtime="eager")
    assert engine_for(legacy, config).max_length == 40
    assert st_lib.SentenceTransformer(str(legacy), device="cpu").max_seq_length == 40
    (legacy / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": "long"}))
    with pytest.raises(SquantError, match="max_seq_length 'long' is not a positive integer"):
        sentence_settings(legacy)


def test_a_quantized_directory_keeps_the_max_seq_length_of_a_legacy_one(
    st_dir, calib_jsonl, tmp_path
):
    """all-MiniLM-L6-v2 as published: max_seq_length 256 in sentence_bert_config.json, 512 in
    its tokenizer. `squant quantize` must carry 256 into what it writes, or the loaded model
    and the server would truncate at 512."""
    import json

    from squant.engine.engine import ServeConfig
    from squant.engine.loading import engine_for

    legacy = tmp_path / "legacy"
    shutil.copytree(st_dir, legacy)
    (legacy / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40}))
    out = tmp_path / "q"
    assert main(["quantize", str(legacy), "--calib", str(calib_jsonl), "--out", str(out)]) == 0
    assert squant.load(out).max_seq_length == 40
    config = ServeConfig(instances=1, cores_per_instance=1, runtime="eager")
    assert engine_for(out, config).max_length == 40


def test_a_sentence_transformers_that_runs_directory_code_is_refused(monkeypatch):
    from squant import sentence_transformer

    monkeypatch.setattr(st_lib, "__version__", "5.7.0")
    with pytest.raises(squant.SquantError, match=r"needs >= 6\.0"):
        sentence_transformer._require()


def test_each_kind_of_directory_is_told_apart_and_loads_its_encoder(
    st_dir, tiny_checkpoint, deploy_dir, tmp_path
):
    from squant.checkpoint.source import load_encoder, source_kind

    quantized, deploy = deploy_dir
    saved = tmp_path / "st-int8"
    squant.save(squant.quantize(_float(st_dir), calibration=TEXTS, progress=False), saved)
    assert [source_kind(p) for p in (deploy, quantized, saved, tiny_checkpoint, st_dir)] == [
        "deploy",
        "quantized",
        "quantized",
        "float",
        "float",
    ]
    encoder = load_encoder(saved)  # a sentence-transformers model: its inner encoder
    assert type(encoder).__name__ == "BertModel"
    assert any(isinstance(m, QuantLinear) for m in encoder.modules())
    assert not any(isinstance(m, QuantLinear) for m in load_encoder(tiny_checkpoint).modules())
