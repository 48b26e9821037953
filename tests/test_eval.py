"""squant eval: loaders on small files in each format, and every task end to end on tiny
random checkpoints saved to disk (the numbers are meaningless there; the plumbing is tested)."""

import json

import pytest
import transformers

from squant.cli import main
from squant.errors import SquantError
from squant.eval.classify import LabelledText, label_ids, read_labelled
from squant.eval.runner import EvalSettings, evaluate
from squant.eval.squad import read_squad
from tests.conftest import WORDS
from tests.helpers import tiny_model

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?", *WORDS]


def _checkpoint(path, head, **config):
    tok = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(VOCAB)})
    model = tiny_model("bert", head, vocab_size=len(VOCAB), **config)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def _squad_file(path, n=12, v2=True):
    long_context = " ".join(WORDS * 3)  # longer than one window: exercises the doc stride
    qas = []
    for i in range(n):
        impossible = v2 and i % 3 == 0
        answer = WORDS[i % len(WORDS)]
        qas.append(
            {
                "id": f"q{i}",
                "question": f"where is the {answer} ?",
                "answers": [] if impossible else [{"text": answer, "answer_start": 0}],
                "is_impossible": impossible,
            }
        )
    data = {
        "version": "v2.0",
        "data": [{"title": "t", "paragraphs": [{"context": long_context, "qas": qas}]}],
    }
    path.write_text(json.dumps(data))
    return path


def test_read_squad_versions(tmp_path):
    examples, v2 = read_squad(_squad_file(tmp_path / "v2.json"))
    assert v2
    assert examples[0].answers == ()
    assert examples[1].answers == (WORDS[1],)
    _, v1 = read_squad(_squad_file(tmp_path / "v1.json", v2=False))
    assert not v1
    (tmp_path / "bad.json").write_text('{"nope": 1}')
    with pytest.raises(SquantError, match="not a SQuAD JSON"):
        read_squad(tmp_path / "bad.json")


def test_read_labelled_jsonl_and_glue_tsv(tmp_path):
    (tmp_path / "snli.jsonl").write_text(
        '{"sentence1": "a", "sentence2": "b", "gold_label": "neutral"}\n'
        '{"sentence1": "c", "sentence2": "d", "gold_label": "-"}\n'
        '{"sentence1": "e", "sentence2": "f", "gold_label": "entailment"}\n'
    )
    items = read_labelled(tmp_path / "snli.jsonl")
    assert [(i.text, i.pair, i.label) for i in items] == [
        ("a", "b", "neutral"),
        ("e", "f", "entailment"),
    ]
    (tmp_path / "dev_matched.tsv").write_text(
        "index\tgenre\tsentence1\tsentence2\tgold_label\n"
        "0\tfiction\tthe cat\ta dog\tcontradiction\n"
    )
    tsv = read_labelled(tmp_path / "dev_matched.tsv")
    assert (tsv[0].text, tsv[0].pair, tsv[0].label) == ("the cat", "a dog", "contradiction")
    (tmp_path / "sst2.tsv").write_text("sentence\tlabel\nit is good\t1\n")
    single = read_labelled(tmp_path / "sst2.tsv")
    assert (single[0].pair, single[0].label) == (None, "1")


def test_label_mapping_uses_the_checkpoint_names():
    config = transformers.BertConfig(id2label={0: "entailment", 1: "neutral", 2: "contradiction"})

    data = [LabelledText("a", "b", "Contradiction"), LabelledText("c", None, "1")]
    assert label_ids(data, config) == [2, 1]
    with pytest.raises(SquantError, match="not one of the checkpoint's labels"):
        label_ids([LabelledText("a", None, "maybe")], config)


def test_squad_task_end_to_end(tmp_path):
    ckpt = _checkpoint(tmp_path / "qa", "question-answering")
    data = _squad_file(tmp_path / "dev.json", n=16)
    settings = EvalSettings(
        batch_size=4, max_length=48, doc_stride=16, calib_size=4, progress=False
    )
    record = evaluate(ckpt, "squad", data, "fp32,static,dynamic", limit=None, settings=settings)
    assert record["squad_version"] == "2.0"
    assert record["n_scored"] == 12  # 4 held apart for calibration
    for v in ("fp32", "static", "dynamic"):
        assert 0.0 <= record["results"][v]["f1"] <= 100.0
        assert 0.0 <= record["results"][v]["exact_match"] <= record["results"][v]["f1"] + 1e-9
    assert record["results"]["fp32"]["relative_loss_percent"]["f1"] == 0.0
    assert 0.0 <= record["results"]["static"]["alpha_min"] <= 1.0


def test_mnli_task_through_the_cli(tmp_path, capsys):
    labels = {0: "entailment", 1: "neutral", 2: "contradiction"}
    ckpt = _checkpoint(tmp_path / "cls", "sequence-classification", id2label=labels)
    lines = [
        json.dumps(
            {"sentence1": f"the {a} sat", "sentence2": f"a {b} runs", "gold_label": labels[i % 3]}
        )
        for i, (a, b) in enumerate(zip(WORDS, reversed(WORDS), strict=False))
    ]
    data = tmp_path / "mnli.jsonl"
    data.write_text("\n".join(lines))
    out = tmp_path / "r.json"
    code = main(
        [
            "eval",
            str(ckpt),
            "--task",
            "mnli",
            "--data",
            str(data),
            "--variants",
            "fp32,bf16,static",
            "--calib-size",
            "8",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "loss vs fp32" in printed
    record = json.loads(out.read_text())
    assert set(record["results"]) == {"fp32", "bf16", "static"}
    assert record["n_scored"] == len(lines) - 8
    assert all("accuracy" in r for r in record["results"].values())
    # where the figures came from: the command, the host's ISA, the versions
    origin = record["provenance"]
    assert origin["command"].startswith("squant") and "--task mnli" in origin["command"]
    assert origin["hardware"]["isa"] is not None and origin["versions"]["torch"]


def test_eval_errors_are_one_line(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "cls", "sequence-classification")
    (tmp_path / "tiny.jsonl").write_text(
        '{"sentence1": "a", "sentence2": "b", "gold_label": "LABEL_0"}\n'
    )
    code = main(["eval", str(ckpt), "--task", "mnli", "--data", str(tmp_path / "tiny.jsonl")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "too few to hold 128 apart" in err
    code = main(["eval", str(ckpt), "--task", "probe", "--data", str(tmp_path / "tiny.jsonl")])
    assert code == 2
    assert "needs --train" in capsys.readouterr().err


@pytest.mark.compile
def test_compiled_variant_scores_what_the_eager_one_scores(tmp_path):
    """eval scores deployable variants: the compiled model runs at the task's batch size,
    padded to length buckets, and answers the same questions the same way."""
    ckpt = _checkpoint(tmp_path / "qa", "question-answering")
    data = _squad_file(tmp_path / "dev.json", n=16)
    settings = EvalSettings(
        batch_size=4, max_length=48, doc_stride=16, calib_size=4, progress=False
    )
    record = evaluate(ckpt, "squad", data, "static,static-compiled", settings=settings)
    eager, compiled = record["results"]["static"], record["results"]["static-compiled"]
    assert compiled["f1"] == pytest.approx(eager["f1"], abs=1e-6)
    assert compiled["exact_match"] == pytest.approx(eager["exact_match"], abs=1e-6)
    assert compiled["alpha_min"] == eager["alpha_min"]
    with pytest.raises(SquantError, match="unknown variant 'static-onnx'"):
        evaluate(ckpt, "squad", data, "static-onnx", settings=settings)


@pytest.mark.compile
def test_probe_scores_a_compiled_variant_of_a_base_model(tmp_path):
    from squant.eval.probe_eval import ProbeSettings, evaluate_probe

    ckpt = _checkpoint(tmp_path / "base", "base")
    labels = ("entailment", "neutral", "contradiction")
    rows = [
        json.dumps({"sentence1": f"the {a} sat", "sentence2": f"a {b} runs", "gold_label": lab})
        for i, (a, b) in enumerate(zip(WORDS * 3, reversed(WORDS * 3), strict=True))
        for lab in [labels[i % 3]]
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(rows))
    (tmp_path / "test.jsonl").write_text("\n".join(rows[:20]))
    settings = ProbeSettings(train_pairs=60, calib_sentences=8, batch_size=8, max_length=16)
    record = evaluate_probe(
        ckpt,
        tmp_path / "test.jsonl",
        tmp_path / "train.jsonl",
        variants="fp32,static-compiled",
        settings=settings,
        cache_dir=tmp_path / "cache",
        progress=False,
    )
    fp32, compiled = record["results"]["fp32"], record["results"]["static-compiled"]
    assert fp32["embedding_cosine"] == pytest.approx(1.0)
    assert 0.95 < compiled["embedding_cosine"] < 1.0  # int8: close, never identical
    assert compiled["cosine_min"] <= compiled["embedding_cosine"]
