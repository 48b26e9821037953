from pathlib import Path

import pytest
import torch
import transformers

from tests.helpers import tiny_model

_SENTENCE = "the a cat dog sat on mat runs fast slow red blue green man woman child plays music"
_MORE = "in park ball is are was were and or not happy sad big small house tree car street"
WORDS = tuple(f"{_SENTENCE} {_MORE}".split(" "))


def _inductor_work() -> int:
    """Inductor graph compiles so far in this process (each looks up its FX graph cache)."""
    from torch._dynamo.utils import counters

    lookups = ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")
    return sum(counters["inductor"][k] for k in lookups)


@pytest.fixture(autouse=True)
def _compile_hygiene(request):
    """Tests marked `compile` start and end with a fresh dynamo (no graph, guard or recompile
    limit carried from one test to the next); a test that compiles without the mark fails,
    so `pytest -m "not compile"` keeps running the algorithm tests in seconds."""
    marked = request.node.get_closest_marker("compile") is not None
    if marked:
        torch._dynamo.reset()
    before = _inductor_work()
    yield
    if marked:
        torch._dynamo.reset()
    elif _inductor_work() > before:
        pytest.fail(
            "this test compiled with TorchInductor: mark it @pytest.mark.compile", pytrace=False
        )


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A tiny BERT sequence classifier with a real WordPiece tokenizer, saved to disk."""
    path = tmp_path_factory.mktemp("ckpt") / "tiny-bert"
    path.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *WORDS]
    tok = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(vocab)})
    model = tiny_model("bert", "sequence-classification", outliers=True, vocab_size=len(vocab))
    model.config.architectures = ["BertForSequenceClassification"]
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def calib_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "calib.jsonl"
    lines = [
        '{"sentence1": "the cat sat on the mat .", "sentence2": "a cat is on a mat ."}',
        '{"sentence1": "a man plays music in the park", "sentence2": "the man is sad"}',
        '{"sentence1": "the red car runs fast", "sentence2": "a car is slow ."}',
        '{"sentence1": "a child and a dog", "sentence2": "the dog is big , the child small"}',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def deploy_dir(tiny_checkpoint, calib_jsonl, tmp_path_factory):
    """(quantized directory, deploy directory): the tiny classifier through `squant quantize`
    and `squant export --batch 2 --dynamic-seq` (one export shared by the tests that need a
    package: exporting costs ~20 s here)."""
    from squant.cli import main

    root = tmp_path_factory.mktemp("deploy")
    quantized, deploy = root / "int8", root / "deploy"
    assert (
        main(
            ["quantize", str(tiny_checkpoint), "--calib", str(calib_jsonl), "--out", str(quantized)]
        )
        == 0
    )
    export = ["export", str(quantized), "--out", str(deploy), "--batch", "2", "--dynamic-seq"]
    assert main([*export, "--float-dtype", "fp32"]) == 0
    return quantized, deploy


@pytest.fixture(scope="session")
def base_dir(tiny_checkpoint, tmp_path_factory):
    """A tiny base model (it embeds), quantized and saved with the checkpoint's tokenizer."""
    import squant
    from squant.checkpoint.models import load_tokenizer

    tok = load_tokenizer(tiny_checkpoint)
    model = tiny_model("bert", vocab_size=len(tok))
    texts = ["the cat sat on the mat", "a dog runs fast in the park", "red car", ""]
    calib = [tok(texts, padding=True, return_tensors="pt")]
    q = squant.quantize(model, calibration=calib, progress=False)
    path = tmp_path_factory.mktemp("embed") / "int8-base"
    squant.save(q, path, tokenizer=tok)
    return path
