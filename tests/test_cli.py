"""The `squant` command end to end on a tiny checkpoint saved to disk."""

import pytest
import torch

import squant
from squant.cli import main
from squant.models import load_model, load_tokenizer


def test_quantize_command_writes_a_loadable_model(tiny_checkpoint, calib_jsonl, tmp_path, capsys):
    out = tmp_path / "int8"
    code = main(
        [
            "quantize",
            str(tiny_checkpoint),
            "--mode",
            "dynamic",
            "--alpha",
            "0.6",
            "--calib",
            str(calib_jsonl),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "quantized 8 linears of BertForSequenceClassification" in capsys.readouterr().out
    q = squant.load(out)
    assert q.squant_info["config"]["alpha"] == 0.6
    tok = load_tokenizer(out)  # the tokenizer travels with the model
    enc = tok(["the cat sat"], ["a dog runs"], return_tensors="pt")
    ref = load_model(tiny_checkpoint)
    with torch.no_grad():
        a, b = q(**enc).logits, ref(**enc).logits
    assert float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0)) > 0.99


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/no/such/dir"], "does not exist"),
        (["{ckpt}", "--alpha", "2"], "alpha must be in"),
        (["{ckpt}", "--max-length", "999"], "exceeds the model's 64 positions"),
        (["{ckpt}", "--calib", "/no/file.txt"], "calibration file /no/file.txt does not exist"),
        (["{ckpt}", "--calib-size", "0"], "calib-size"),
        (["{tmp}"], "no config.json"),
    ],
)
def test_quantize_command_errors_are_one_line(
    tiny_checkpoint, calib_jsonl, tmp_path, capsys, args, message
):
    args = [a.format(ckpt=tiny_checkpoint, tmp=tmp_path) for a in args]
    if "--calib" not in args:
        args += ["--calib", str(calib_jsonl)]
    code = main(["quantize", *args, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("squant quantize: error:")
    assert message in err
    assert "\n" not in err
    assert not (tmp_path / "o").exists()


def test_corrupt_checkpoint_weights(tiny_checkpoint, calib_jsonl, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_checkpoint.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"garbage")
    code = main(
        ["quantize", str(broken), "--calib", str(calib_jsonl), "--out", str(tmp_path / "o")]
    )
    assert code == 2
    assert "cannot load weights" in capsys.readouterr().err
