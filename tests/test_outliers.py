"""Float outlier channels (SmoothQuantConfig.outlier_channels): a few input channels of a
linear multiplied in float beside the int8 GEMM, exact in float, recorded, saved, compiled."""

import json

import pytest
import torch
from torch import nn

import squant
from squant.quant.qlinear import QuantLinear, SmoothedLinear, add_outliers
from squant.runtime.compiler import CompileConfig
from tests.helpers import (
    cosine,
    int8_gemm_calls,
    last_hidden,
    sqnr_db,
    tiny_model,
    token_batches,
)

EVERY_SITE = ("qkv", "attn_out", "ffn_in", "ffn_out")


def _hot_input(tokens: int = 64, features: int = 96, hot=(7, 50), gain: float = 300.0):
    """Activations with two channels ~300x the others, as BERT's massive dimensions."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, features, generator=g)
    x[:, list(hot)] *= gain
    return x


def test_smoothed_linear_with_outliers_is_exact():
    torch.manual_seed(0)
    linear = nn.Linear(96, 40)
    x = _hot_input()
    s = torch.rand(96) + 0.5
    smoothed = SmoothedLinear.from_linear(linear, s, torch.tensor([7, 50]))
    assert smoothed.input_multiplier[[7, 50]].eq(0).all()
    assert smoothed.weight[:, [7, 50]].eq(0).all()
    with torch.no_grad():
        torch.testing.assert_close(smoothed(x), linear(x), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_quant_linear_matches_its_dequantized_reference_and_beats_plain(mode):
    """The int8 part is what it claims (checked against the dequantized weight on the
    quantized input), and taking the two hot channels out of the int8 grid buys > 20 dB."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 40)
    x = _hot_input()
    ref = linear(x).detach()
    ones = torch.ones(96)
    plain, split = (
        SmoothedLinear.from_linear(linear, ones, idx) for idx in (None, torch.tensor([7, 50]))
    )
    results = {}
    for name, float_linear in (("plain", plain), ("split", split)):
        smoothed_x = x * float_linear.input_multiplier
        rng = (float(smoothed_x.min()), float(smoothed_x.max()))
        q = QuantLinear.from_float(float_linear, mode, rng if mode == "static" else None)
        with torch.no_grad():
            y = q(x)
        results[name] = sqnr_db(ref, y)
        if name == "split":
            assert q.outliers == 2 and q.outlier_index.tolist() == [7, 50]
            # reference: the quantized input of the kept channels times the dequantized
            # weight, plus the hot channels in float
            xs = x * q.input_multiplier
            if mode == "static":
                scale, zp = q._x_scale, q._x_zero_point
                x_deq = (torch.clamp(torch.round(xs / scale) + zp, 0, 255) - zp) * scale
            else:
                t = xs.abs().amax(-1, keepdim=True) / 127
                x_deq = torch.round(xs / t).clamp(-127, 127) * t
            expect = nn.functional.linear(x_deq, q.dequantized_weight(), q.bias)
            expect = add_outliers(expect, x, q.outlier_index, q.outlier_weight)
            torch.testing.assert_close(y, expect, rtol=1e-4, atol=1e-2)
    assert results["split"] > results["plain"] + 20.0, results


def test_quantize_picks_the_hot_channels_at_the_configured_sites():
    model = tiny_model("bert", outliers=True)  # FFN units 5 and 77 have large pre-activations
    q = squant.quantize(model, squant.SmoothQuantConfig(), token_batches(), progress=False)
    for name, rec in q.squant_info.modules.items():
        module = q.get_submodule(name)
        assert rec.outliers == module.outliers == (4 if rec.kind == "ffn_out" else 0)
        if rec.kind == "ffn_out":
            # 77 stays large after GELU (FFN-out's input); 5 is mostly negative, GELU mutes it
            assert 77 in module.outlier_index.tolist()
    off = squant.quantize(
        model, squant.SmoothQuantConfig(outlier_channels=0), token_batches(), progress=False
    )
    assert all(m.outliers == 0 for m in off.squant_info.modules.values())


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_outlier_channels_at_every_site_track_fp32(mode):
    model = tiny_model("bert", outliers=True)
    test = token_batches(seed=9)[0]
    ref = last_hidden(model, test)
    config = squant.SmoothQuantConfig(mode=mode, outlier_sites=EVERY_SITE)
    q = squant.quantize(model, config, token_batches(), progress=False)
    assert all(m.outliers == 4 for m in q.squant_info.modules.values())
    # same thresholds as test_quantize's (tiny outlier models, alpha 0.5 without outliers)
    assert sqnr_db(ref, last_hidden(q, test)) >= (25.0 if mode == "static" else 29.0)


def test_alpha_search_stays_below_alpha_max():
    model = tiny_model("bert", outliers=True)
    for cap in (0.25, 1.0):
        config = squant.SmoothQuantConfig(alpha_max=cap, outlier_channels=0)
        q = squant.quantize(model, config, token_batches(), progress=False)
        alphas = q.squant_info.alphas
        assert max(alphas) <= cap
    assert max(alphas) > 0.25  # uncapped, the search goes higher on this model: the cap bites


def test_save_load_keeps_outlier_channels(tmp_path):
    model = tiny_model("bert", outliers=True)
    config = squant.SmoothQuantConfig(outlier_sites=EVERY_SITE)
    q = squant.quantize(model, config, token_batches(), progress=False)
    squant.save(q, tmp_path / "m")
    loaded = squant.load(tmp_path / "m")
    test = token_batches(seed=9)[0]
    torch.testing.assert_close(last_hidden(loaded, test), last_hidden(q, test))
    name = next(iter(q.squant_info.modules))
    assert loaded.get_submodule(name).outlier_index.tolist() == (
        q.get_submodule(name).outlier_index.tolist()
    )


def test_a_tampered_outlier_multiplier_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny_model("bert", outliers=True)
    q = squant.quantize(model, squant.SmoothQuantConfig(), token_batches(), progress=False)
    squant.save(q, tmp_path / "m")
    weights = next((tmp_path / "m").glob("*.safetensors"))
    tensors = load_file(weights)
    key = next(k for k in tensors if k.endswith("layer.0.output.dense.input_multiplier"))
    idx_key = key.replace("input_multiplier", "outlier_index")
    tensors[key][tensors[idx_key]] = 1.0  # the int8 GEMM would count those channels twice
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(squant.SquantError, match="must be 0 on its outlier channels"):
        squant.load(tmp_path / "m")


def test_configs_saved_before_outlier_channels_load_as_none():
    saved = squant.SmoothQuantConfig().to_dict()
    for key in ("outlier_channels", "outlier_sites", "alpha_max"):
        saved.pop(key)
    config = squant.SmoothQuantConfig.from_dict(json.loads(json.dumps(saved)))
    assert config.outlier_channels == 0 and config.alpha_max == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"outlier_channels": -1}, "outlier_channels"),
        ({"outlier_channels": 65}, "outlier_channels"),
        ({"outlier_channels": True}, "outlier_channels"),
        ({"outlier_sites": ("pooler",)}, "outlier_sites takes"),
        ({"alpha_max": 1.5}, "alpha_max"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(squant.SquantError, match=message):
        squant.SmoothQuantConfig(**kwargs)


@pytest.mark.compile
def test_compiled_outlier_channels_fuse_into_elementwise_kernels():
    """Outliers at every site, compiled: eager numerics kept, and the float side product is
    no extra GEMM (a k-term sum inside the elementwise kernels inductor writes anyway)."""
    import re

    from torch._inductor.utils import run_and_get_code

    model = tiny_model("bert", outliers=True)
    config = squant.SmoothQuantConfig(mode="static", outlier_sites=EVERY_SITE)
    q = squant.quantize(model, config, token_batches(), progress=False)
    inputs = token_batches(n=1, seed=4)[0]
    # the Python wrapper names each kernel call as text (the C++ one runs the same graph)
    compiled = squant.compile(q, CompileConfig(float_dtype="fp32", cpp_wrapper=False))
    out, code = run_and_get_code(lambda: compiled(**inputs))
    code = "\n".join(code)
    assert len(int8_gemm_calls(code)) == 8
    float_gemms = re.findall(r"(extern_kernels\.(?:mm|addmm)|mkldnn\._linear_pointwise)\(", code)
    assert len(float_gemms) <= 1  # the pooler's, if inductor keeps it as a GEMM
    assert cosine(last_hidden(q, inputs), out.last_hidden_state) >= 0.9999


def test_cli_flags_set_the_outlier_fields():
    import argparse

    from squant.commands.common import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    default = config_from_args(parser.parse_args([]))
    assert (default.outlier_channels, default.outlier_sites, default.alpha_max) == (
        4,
        ("ffn_out",),
        0.5,
    )
    argv = ["--outlier-sites", "qkv", "--outlier-sites", "ffn_out", "--outlier-channels", "8"]
    config = config_from_args(parser.parse_args([*argv, "--alpha-max", "0.3"]))
    assert (config.outlier_channels, config.outlier_sites, config.alpha_max) == (
        8,
        ("qkv", "ffn_out"),
        0.3,
    )
    assert config_from_args(parser.parse_args(["--outlier-sites", "none"])).outlier_sites == ()
