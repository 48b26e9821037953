import json

import pytest
import torch

import squant
from squant.quant.qlinear import QuantLinear
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
    assert loaded.squant_info == q.squant_info  # the typed record survives its JSON form
    assert loaded.squant_info.to_dict() == json.loads(json.dumps(q.squant_info.to_dict()))
    test = token_batches(seed=3, pad=model.config.pad_token_id)[0]
    torch.testing.assert_close(run(loaded, test), run(q, test), rtol=0, atol=0)
    torch.testing.assert_close(last_hidden(loaded, test), last_hidden(q, test), rtol=0, atol=0)
    assert sum(isinstance(m, QuantLinear) for m in loaded.modules()) == 8


def test_saved_files_are_safetensors_and_json_only(tmp_path):
    q = squant.quantize(tiny_model("bert"), calibration=token_batches(), progress=False)
    squant.save(q, tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [".squant-owned.json", "model.safetensors", "squant.json"]
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


# --- trust: nothing in a saved directory is believed without a check ----------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    q = squant.quantize(tiny_model("bert"), calibration=token_batches(), progress=False)
    path = tmp_path_factory.mktemp("saved") / "q"
    squant.save(q, path)
    return q, path


def _tampered(tmp_path, saved, edit_meta=None, edit_tensors=None):
    import shutil

    from safetensors.torch import load_file, save_file

    _, src = saved
    dst = tmp_path / "tampered"
    shutil.copytree(src, dst)
    if edit_meta is not None:
        meta = json.loads((dst / "squant.json").read_text())
        edit_meta(meta)
        (dst / "squant.json").write_text(json.dumps(meta))
    if edit_tensors is not None:
        tensors = load_file(str(dst / "model.safetensors"))
        edit_tensors(tensors)
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


QKV = "encoder.layer.0.attention.self.qkv"


def _set(key, value):
    def edit(tensors):
        tensors[key] = torch.full_like(tensors[key], value)

    return edit


def _module(field, value):
    def edit(meta):
        meta["quantization"]["modules"][QKV][field] = value

    return edit


@pytest.mark.parametrize(
    ("edit_meta", "edit_tensors", "message"),
    [
        (None, _set(f"{QKV}.weight_scale", float("nan")), "weight_scale has non-finite"),
        (None, _set(f"{QKV}.input_scale", float("inf")), "input_scale has non-finite"),
        (None, _set(f"{QKV}.input_scale", -1.0), "non-positive"),
        (None, _set(f"{QKV}.input_zero_point", 300), r"outside \[0, 255\]"),
        (None, _set(f"{QKV}.input_multiplier", 0.0), "input_multiplier"),
        (None, _set("embeddings.LayerNorm.weight", float("nan")), "NaN or infinite"),
        (_module("in_features", 10**6), None, "does not match the model"),
        (_module("mode", "fast"), None, "mode 'fast'"),
        (_module("mode", None), None, "wrong type"),
        (_module("activation", "os.system"), None, "activation 'os.system'"),
        (_module("bias", "yes"), None, "wrong type"),
        (lambda m: m["quantization"]["modules"].pop(QKV), None, "unexpected tensor"),
        (
            lambda m: m["quantization"]["modules"].update({"pooler.dense": {"mode": "static"}}),
            None,
            "'pooler.dense' is missing field 'in_features'",
        ),
        (
            lambda m: m["quantization"]["modules"].update(
                {"pooler.dense": m["quantization"]["modules"][QKV]}
            ),
            None,
            "not a quantizable linear",
        ),
        (_module("alpha", "auto"), None, "wrong type"),
        (_module("absorbs", "encoder.layer.0.output"), None, "disagree"),
        (lambda m: m["quantization"].update(calibration={"sequences": 3}), None, "tokens"),
        (lambda m: m["hf_config"].update(hidden_size=10**7), None, "hidden_size"),
        (lambda m: m["hf_config"].update(num_attention_heads=0), None, "num_attention_heads"),
        (lambda m: m["hf_config"].update(hidden_size=96), None, "does not match the model"),
        (lambda m: m.update(quantization=[]), None, "wrong type"),
        (lambda m: m["quantization"].update(modules={}), None, "non-empty"),
        (lambda m: m["quantization"]["config"].update(alpha=7), None, "alpha must be in"),
        (lambda m: m["quantization"]["config"].update(bogus=1), None, "unknown"),
        (lambda m: m.pop("hf_config"), None, "missing field 'hf_config'"),
    ],
)
def test_tampered_directories_are_refused_with_one_clear_error(
    tmp_path, saved, edit_meta, edit_tensors, message
):
    path = _tampered(tmp_path, saved, edit_meta, edit_tensors)
    with pytest.raises(squant.SquantError, match=message):
        squant.load(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "not a squant model description"),
        (b"\xff\xfe\x00bad", "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply|not valid JSON"),
    ],
)
def test_malformed_squant_json(tmp_path, saved, content, message):
    path = _tampered(tmp_path, saved)
    target = path / "squant.json"
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(squant.SquantError, match=message):
        squant.load(path)


def test_weights_that_are_a_directory(tmp_path, saved):
    path = _tampered(tmp_path, saved)
    (path / "model.safetensors").unlink()
    (path / "model.safetensors").mkdir()
    with pytest.raises(squant.SquantError, match=r"no model\.safetensors"):
        squant.load(path)


def test_save_refuses_foreign_and_source_directories(tmp_path, saved, tiny_checkpoint):
    q, _ = saved
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(squant.SquantError, match="squant did not write"):
        squant.save(q, foreign)
    assert (foreign / "notes.txt").read_text() == "mine"
    squant.save(q, foreign, overwrite=True)
    assert not (foreign / "notes.txt").exists() and (foreign / "squant.json").is_file()
    # a model loaded from a checkpoint never overwrites that checkpoint (nor a folder around it)
    from squant.checkpoint.models import load_model

    model = load_model(tiny_checkpoint)
    batches = [
        {"input_ids": b["input_ids"] % 40, "attention_mask": b["attention_mask"]}
        for b in token_batches()
    ]
    qm = squant.quantize(model, calibration=batches, progress=False)
    for out in (tiny_checkpoint, tiny_checkpoint / "sub", tiny_checkpoint.parent):
        with pytest.raises(squant.SquantError, match="overlaps the input"):
            squant.save(qm, out, overwrite=True)
    assert (tiny_checkpoint / "config.json").is_file()
    file_target = tmp_path / "a-file"
    file_target.write_text("x")
    with pytest.raises(squant.SquantError, match="is a file, not a directory"):
        squant.save(q, file_target / "out")
    with pytest.raises(squant.SquantError, match="exists and is not a directory"):
        squant.save(q, file_target)


def test_a_killed_save_leaves_the_previous_model_intact(tmp_path, saved):
    """kill -9 in the middle of writing: the old model still loads, with the old outputs."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    q, _ = saved
    target = tmp_path / "model"
    squant.save(q, target)
    test = token_batches(seed=3)[0]
    before = run(squant.load(target), test)
    marker = tmp_path / "writing"
    script = textwrap.dedent(
        f"""
        import time, pathlib, safetensors.torch, torch
        import squant
        from tests.helpers import tiny_model, token_batches
        q = squant.quantize(tiny_model("bert", seed=7), squant.SmoothQuantConfig(mode="dynamic"),
                            token_batches(), progress=False)
        real = safetensors.torch.save_model
        def slow(*a, **k):
            real(*a, **k)
            pathlib.Path({str(marker)!r}).write_text("x")
            time.sleep(60)
        safetensors.torch.save_model = slow
        squant.save(q, {str(target)!r})
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd())
    try:
        deadline = time.time() + 120
        while not marker.exists():
            assert proc.poll() is None, "the writer died before the kill"
            assert time.time() < deadline
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    after = run(squant.load(target), test)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    assert squant.load(target).squant_info.config.mode == "static"
    # the killed writer's temporary copy is removed by the next successful write
    assert list(tmp_path.glob(".model.tmp-*"))
    squant.save(q, target)
    assert not list(tmp_path.glob(".model.tmp-*")) and not list(tmp_path.glob(".model.old-*"))


def test_ownership_is_proven_by_content_not_by_a_file_name(tmp_path, saved):
    q, _ = saved
    # a user's directory that happens to hold a squant.json is not squant's
    user = tmp_path / "user"
    user.mkdir()
    (user / "squant.json").write_text("{}")
    (user / "important.txt").write_text("keep me")
    with pytest.raises(squant.SquantError, match="squant did not write"):
        squant.save(q, user)
    assert (user / "important.txt").read_text() == "keep me"
    # a squant output with a note added by its user is not squant's any more
    out = tmp_path / "out"
    squant.save(q, out)
    squant.save(q, out)  # squant's own output is replaced without asking
    (out / "notes.txt").write_text("mine")
    with pytest.raises(squant.SquantError, match="squant did not write"):
        squant.save(q, out)
    assert (out / "notes.txt").read_text() == "mine"
    # a forged ownership record that does not list the user's file does not count either
    (out / ".squant-owned.json").write_text('{"format": "squant-output", "files": []}')
    with pytest.raises(squant.SquantError, match="squant did not write"):
        squant.save(q, out)


def test_a_relative_source_path_still_protects_the_checkpoint_after_chdir(
    tmp_path, tiny_checkpoint, monkeypatch
):
    import shutil

    from transformers import AutoModel

    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    shutil.copytree(tiny_checkpoint, tmp_path / "a" / "tiny")
    monkeypatch.chdir(work)
    model = AutoModel.from_pretrained("../tiny")  # relative, as a user would type it
    batches = [
        {"input_ids": b["input_ids"] % 40, "attention_mask": b["attention_mask"]}
        for b in token_batches()
    ]
    qm = squant.quantize(model, calibration=batches, progress=False)
    monkeypatch.chdir(tmp_path / "a")
    # "../tiny" now names tmp_path/tiny; the checkpoint is still protected: no write lands in it
    with pytest.raises(squant.SquantError, match="overlaps the input"):
        squant.save(qm, "tiny", overwrite=True)
    assert (tmp_path / "a" / "tiny" / "config.json").is_file()


def test_saved_directories_follow_the_umask(tmp_path, saved):
    import os

    q, _ = saved
    old = os.umask(0o022)
    try:
        squant.save(q, tmp_path / "m")
    finally:
        os.umask(old)
    assert (tmp_path / "m").stat().st_mode & 0o777 == 0o755
