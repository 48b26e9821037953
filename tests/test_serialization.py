import json

import pytest
import torch

import squant
from squant.qlinear import QuantLinear
from tests.helpers import last_hidden, run, tiny_model, token_batches


@pytest.mark.parametrize(
    ("arch", "head", "mode"),
    [
        ("bert", "sequence-classification", "static"),
        ("distilbert", "question-answering", "dynamic"),
        ("xlm-roberta", "token-classification", "static"),
        ("bert", "masked-lm", "dynamic"),  # tied embedding/decoder weights
    ],
)
def test_save_load_round_trip_is_exact(tmp_path, arch, head, mode):
    model = tiny_model(arch, head)
    batches = token_batches(pad=model.config.pad_token_id)
    q = squant.quantize(model, squant.SmoothQuantConfig(mode=mode), batches, progress=False)
    squant.save(q, tmp_path / "q")
    loaded = squant.load(tmp_path / "q")
    assert type(loaded) is type(q)
    assert loaded.squant_info == json.loads(json.dumps(q.squant_info))
    test = token_batches(seed=3, pad=model.config.pad_token_id)[0]
    torch.testing.assert_close(run(loaded, test), run(q, test), rtol=0, atol=0)
    torch.testing.assert_close(last_hidden(loaded, test), last_hidden(q, test), rtol=0, atol=0)
    assert sum(isinstance(m, QuantLinear) for m in loaded.modules()) == 8


def test_saved_files_are_safetensors_and_json_only(tmp_path):
    q = squant.quantize(tiny_model("bert"), calibration=token_batches(), progress=False)
    squant.save(q, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "squant.json"]
    meta = json.loads((tmp_path / "squant.json").read_text())
    assert meta["model_class"] == "BertModel"
    assert meta["quantization"]["config"]["mode"] == "static"
    # int8 weights are stored as int8, not as float
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f.get_tensor("encoder.layer.0.attention.self.qkv.weight").dtype == torch.int8


def test_load_errors_are_clear(tmp_path):
    q = squant.quantize(tiny_model("bert"), calibration=token_batches(), progress=False)
    with pytest.raises(squant.SquantError, match="not a directory"):
        squant.load(tmp_path / "missing")
    with pytest.raises(squant.SquantError, match=r"no squant\.json"):
        squant.load(tmp_path)
    squant.save(q, tmp_path / "good")

    corrupt = tmp_path / "corrupt-json"
    squant.save(q, corrupt)
    (corrupt / "squant.json").write_text("{not json")
    with pytest.raises(squant.SquantError, match="not valid JSON"):
        squant.load(corrupt)

    truncated = tmp_path / "truncated"
    squant.save(q, truncated)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(squant.SquantError, match="cannot load"):
        squant.load(truncated)

    evil = tmp_path / "evil"
    squant.save(q, evil)
    meta = json.loads((evil / "squant.json").read_text())
    meta["model_class"] = "os.system"
    (evil / "squant.json").write_text(json.dumps(meta))
    with pytest.raises(squant.SquantError, match="not one squant can rebuild"):
        squant.load(evil)


def test_saving_a_float_model_is_refused(tmp_path):
    with pytest.raises(squant.SquantError, match="not quantized"):
        squant.save(tiny_model("bert"), tmp_path)
