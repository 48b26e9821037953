"""Evaluation data from Hugging Face `datasets` (extra `squant[data]`): saved directories with
class labels and splits, the flat SQuAD layout, and one-line errors; skipped without it."""

import json

import pytest

from squant.errors import SquantError
from squant.eval import classify, hf_data, squad

datasets = pytest.importorskip("datasets")


def _nli(tmp_path):
    labels = datasets.ClassLabel(names=["entailment", "neutral", "contradiction"])
    features = datasets.Features(
        {
            "premise": datasets.Value("string"),
            "hypothesis": datasets.Value("string"),
            "label": labels,
        }
    )
    rows = {
        "premise": ["a cat sits", "a dog runs", "a man sings", "two kids"],
        "hypothesis": ["an animal sits", "a cat runs", "nobody sings", "children"],
        "label": [0, 2, 2, -1],  # -1: no annotator consensus (SNLI), skipped
    }
    test = datasets.Dataset.from_dict(rows, features=features)
    path = tmp_path / "nli"
    datasets.DatasetDict({"test": test, "train": test.select([0])}).save_to_disk(str(path))
    return path


def test_a_saved_dataset_dict_reads_like_a_labelled_file(tmp_path):
    path = _nli(tmp_path)
    assert hf_data.is_dataset(path) and hf_data.is_dataset(f"{path}:train")
    items = classify.read_labelled(path, pairs=True, task="snli")  # snli: "test" by default
    assert [(i.text, i.pair, i.label) for i in items] == [
        ("a cat sits", "an animal sits", "entailment"),
        ("a dog runs", "a cat runs", "contradiction"),
        ("a man sings", "nobody sings", "contradiction"),
    ]
    assert len(classify.read_labelled(f"{path}:train", pairs=True)) == 1
    with pytest.raises(SquantError, match=r"has no split 'validation'.*test, train"):
        classify.read_labelled(path, pairs=True, task="glue")


def test_flat_squad_rows_read_like_squad_json(tmp_path):
    rows = {
        "id": ["q1", "q2"],
        "question": ["where is the cat", "who sings"],
        "context": ["the cat sat on the mat .", "nobody here ."],
        "answers": [{"text": ["the mat"], "answer_start": [15]}, {"text": [], "answer_start": []}],
    }
    path = tmp_path / "squad_v2"
    datasets.Dataset.from_dict(rows).save_to_disk(str(path))
    examples, v2 = squad.read_squad(path)
    assert v2  # q2 has no answer: SQuAD v2
    assert [(e.id, e.answers) for e in examples] == [("q1", ("the mat",)), ("q2", ())]
    assert examples[0].context == "the cat sat on the mat ."


def test_dataset_errors_are_one_line(tmp_path):
    assert not hf_data.is_dataset(tmp_path / "missing.jsonl")
    assert not hf_data.is_dataset(tmp_path)  # a plain directory is not a dataset
    assert hf_data.is_dataset("glue/mnli") and hf_data.is_dataset("stanfordnlp/snli:test")
    assert hf_data._hub_id("glue/mnli") == ("glue", "mnli")
    assert hf_data._hub_id("stanfordnlp/snli") == ("stanfordnlp/snli", None)
    assert hf_data._hub_id("nyu-mll/glue/mnli") == ("nyu-mll/glue", "mnli")
    bad = tmp_path / "bad"
    datasets.Dataset.from_dict({"question": ["q"], "answers": ["x"]}).save_to_disk(str(bad))
    with pytest.raises(SquantError, match=r"bad\[0\]: expected SQuAD rows"):
        squad.read_squad(bad)
    with pytest.raises(SquantError, match="need a text field"):
        classify.read_labelled(bad)


def test_eval_command_scores_a_saved_dataset(tiny_checkpoint, calib_jsonl, tmp_path, capsys):
    from squant.cli import main

    labels = datasets.ClassLabel(names=["LABEL_0", "LABEL_1"])  # the tiny classifier's
    words = ["the cat sat", "a dog runs", "red car", "a man plays music"]
    rows = {
        "sentence1": [words[i % 4] for i in range(12)],
        "sentence2": [words[(i + 1) % 4] for i in range(12)],
        "label": [i % 2 for i in range(12)],
    }
    features = datasets.Features(
        {
            "sentence1": datasets.Value("string"),
            "sentence2": datasets.Value("string"),
            "label": labels,
        }
    )
    path = tmp_path / "pairs"
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(path))
    # the same rows as a JSONL file: both sources must score identically
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps({"sentence1": a, "sentence2": b, "label": f"LABEL_{y}"})
            for a, b, y in zip(rows["sentence1"], rows["sentence2"], rows["label"], strict=True)
        )
    )
    records = []
    for data in (path, jsonl):
        out = tmp_path / "eval.json"
        args = ["eval", str(tiny_checkpoint), "--task", "glue", "--data", str(data)]
        code = main([*args, "--calib", str(calib_jsonl), "--variants", "fp32", "--json", str(out)])
        assert code == 0, capsys.readouterr().err
        records.append(json.loads(out.read_text()))
    assert records[0]["n_scored"] == records[1]["n_scored"] == 12
    assert records[0]["results"]["fp32"]["accuracy"] == records[1]["results"]["fp32"]["accuracy"]
