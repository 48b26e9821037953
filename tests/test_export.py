"""AOTInductor packages: built once, loaded in a fresh process with PyTorch alone."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import squant
from squant.errors import SquantError
from squant.export import MANIFEST, check_host
from tests.helpers import tiny_model, token_batches


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = tiny_model("bert", "sequence-classification", outliers=True)
    q = squant.quantize(
        model, squant.SmoothQuantConfig(mode="static"), token_batches(), progress=False
    )
    inputs = token_batches(n=1, seed=3)[0]
    directory = tmp_path_factory.mktemp("export")
    config = squant.CompileConfig(float_dtype="fp32", attention="squant")
    squant.export(q, directory, inputs, config=config)
    compiled = squant.compile(q, config, inputs)
    with torch.no_grad():
        expected = compiled(**inputs).logits
    return directory, inputs, expected, q


def test_package_runs_in_a_fresh_process_without_squant(exported, tmp_path):
    directory, inputs, expected, _ = exported
    torch.save(dict(inputs), tmp_path / "inputs.pt")
    script = textwrap.dedent(
        f"""
        import sys, torch
        runner = torch._inductor.aoti_load_package({str(directory / "model.pt2")!r})
        x = torch.load({str(tmp_path / "inputs.pt")!r})
        out = runner(x["input_ids"], x["attention_mask"])
        torch.save(out[0], {str(tmp_path / "out.pt")!r})
        assert "squant" not in sys.modules and "transformers" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    got = torch.load(tmp_path / "out.pt")
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max()))


def test_manifest_records_what_the_package_is(exported):
    directory, _, _, q = exported
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["model_class"] == "BertForSequenceClassification"
    assert manifest["quantization"]["config"]["mode"] == "static"
    assert manifest["batch"] == 4
    assert manifest["seq"] == 12
    assert manifest["built_on"]["int8_path"]
    assert manifest["torch_version"] == torch.__version__
    assert len(manifest["quantization"]["modules"]) == len(q.squant_info["modules"])


def test_load_exported_checks_the_isa(exported):
    directory, inputs, expected, _ = exported
    runner = squant.load_exported(directory)
    out = runner(inputs["input_ids"], inputs["attention_mask"])
    torch.testing.assert_close(out[0], expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max()))
    with pytest.raises(SquantError, match="amx_int8"):
        check_host({"requires_isa": ["amx_int8"]})  # a package built on an AMX machine


def test_load_exported_errors(tmp_path):
    with pytest.raises(SquantError, match="not a squant export"):
        squant.load_exported(tmp_path)


def test_dynamic_sequence_length_package(tmp_path):
    model = tiny_model("bert", "sequence-classification")
    q = squant.quantize(
        model, squant.SmoothQuantConfig(mode="static"), token_batches(), progress=False
    )
    config = squant.CompileConfig(float_dtype="fp32")
    squant.export(q, tmp_path, token_batches(n=1, seed=3)[0], config=config, dynamic_seq=True)
    assert json.loads((tmp_path / MANIFEST).read_text())["seq"] is None
    runner = squant.load_exported(tmp_path)
    for seq in (8, 20):  # shorter and longer than the example's 12 tokens
        x = token_batches(n=1, seq=seq, seed=5)[0]
        with torch.no_grad():
            ref = q(**x).logits
        out = runner(x["input_ids"], x["attention_mask"])[0]
        torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max()))
