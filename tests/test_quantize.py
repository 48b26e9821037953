"""Model-level numerics on tiny random encoders, for every architecture, head and mode."""

import pytest
import torch
from torch import nn

import squant
from squant.quant.attention import FusedSelfAttention
from squant.quant.qlinear import QuantLinear
from tests.helpers import (
    ARCHS,
    HEADS,
    cosine,
    last_hidden,
    run,
    sqnr_db,
    tiny_model,
    token_batches,
)

# Thresholds on the last hidden states vs FP32, tiny models with injected outlier channels.
# Measured at alpha=0.5 over all arch x head: static 26.8-45.5 dB, dynamic 30.7-52.7 dB.
STATIC_MIN_SQNR_DB, STATIC_MIN_COS = 25.0, 0.998
DYNAMIC_MIN_SQNR_DB, DYNAMIC_MIN_COS = 29.0, 0.999


def _batches(model, **kw):
    return token_batches(pad=model.config.pad_token_id, **kw)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_int8_model_tracks_fp32(arch, head, mode):
    model = tiny_model(arch, head, outliers=True)
    test = _batches(model, seed=9)[0]
    ref_out = model(**test)
    q = squant.quantize(model, squant.SmoothQuantConfig(mode=mode), _batches(model), progress=False)
    q_out = q(**test)
    assert type(q_out) is type(ref_out)  # same output type and fields
    assert set(q_out.keys()) == set(ref_out.keys())
    ref, out = last_hidden(model, test), last_hidden(q, test)
    lo_db, lo_cos = (
        (STATIC_MIN_SQNR_DB, STATIC_MIN_COS)
        if mode == "static"
        else (DYNAMIC_MIN_SQNR_DB, DYNAMIC_MIN_COS)
    )
    assert sqnr_db(ref, out) > lo_db
    assert cosine(ref, out) > lo_cos
    n_int8 = sum(isinstance(m, QuantLinear) for m in q.modules())
    assert n_int8 == 4 * 2  # qkv, attn_out, ffn_in, ffn_out per layer
    # only encoder-layer linears are int8: embeddings, pooler and heads stay float
    int8_names = {n for n, m in q.named_modules() if isinstance(m, QuantLinear)}
    assert int8_names == set(q.squant_info.modules)
    assert all(".layer." in n for n in int8_names)
    # the FFN's GELU moved into the int8 GEMM that feeds it; its old module is an Identity
    ffn_in = [m for n, m in q.squant_info.modules.items() if m.kind == "ffn_in"]
    assert [m.activation for m in ffn_in] == ["gelu"] * 2
    assert all(isinstance(q.get_submodule(m.absorbs), nn.Identity) for m in ffn_in)


@pytest.mark.parametrize("arch", ARCHS)
def test_qkv_fusion_and_smoothing_leave_fp32_outputs_unchanged(arch):
    model = tiny_model(arch, "sequence-classification", outliers=True)
    test = _batches(model, seed=5)[0]
    ref = run(model, test)
    smoothed = squant.smooth(model, _batches(model), alpha=0.8, progress=False)
    assert sum(isinstance(m, FusedSelfAttention) for m in smoothed.modules()) == 2
    out = run(smoothed, test)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_smoothquant_beats_plain_w8a8_on_outlier_channels(arch, mode):
    model = tiny_model(arch, outliers=True)
    test = _batches(model, seed=9)[0]
    ref = run(model, test)
    db = {}
    for alpha in (0.0, 0.5):
        # no float outlier channels: they would fix the outliers themselves (dynamic's default
        # puts them at every site, where alpha 0 is then the better choice)
        cfg = squant.SmoothQuantConfig(mode=mode, alpha=alpha, outlier_sites=())
        q = squant.quantize(model, cfg, _batches(model), progress=False)
        db[alpha] = sqnr_db(ref, run(q, test))
    assert db[0.5] > db[0.0] + 1.0, db


def test_quantize_leaves_the_input_model_untouched():
    model = tiny_model("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    squant.quantize(model, calibration=token_batches(), progress=False)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(isinstance(m, QuantLinear | FusedSelfAttention) for m in model.modules())


def test_exclude_keeps_matching_linears_in_float():
    model = tiny_model("bert")
    cfg = squant.SmoothQuantConfig(
        exclude=("*.layer.1.output.dense", "*.layer.0.attention.self.qkv")
    )
    q = squant.quantize(model, cfg, token_batches(), progress=False)
    assert type(q.get_submodule("encoder.layer.1.output.dense")) is nn.Linear
    assert type(q.get_submodule("encoder.layer.0.attention.self.qkv")) is nn.Linear
    assert sum(isinstance(m, QuantLinear) for m in q.modules()) == 6
    assert "encoder.layer.1.output.dense" not in q.squant_info.modules


def test_calibration_batches_of_different_lengths_and_padding():
    model = tiny_model("bert")
    batches = token_batches(n=3, seq=5, vary=True)  # lengths 5, 8, 11
    q = squant.quantize(model, calibration=batches, progress=False)
    assert sum(isinstance(m, QuantLinear) for m in q.modules()) == 8


def test_static_input_ranges_come_from_calibration():
    model = tiny_model("bert", outliers=True)
    minmax = squant.quantize(
        model, squant.SmoothQuantConfig(act_range="minmax"), token_batches(), progress=False
    )
    pct = squant.quantize(
        model,
        squant.SmoothQuantConfig(act_range="percentile", percentile=99.0),
        token_batches(),
        progress=False,
    )
    name = "encoder.layer.0.intermediate.dense"
    # clipping to the 99th percentile gives a finer grid than the full calibrated range
    assert pct.get_submodule(name)._x_scale < minmax.get_submodule(name)._x_scale


class _NotAnEncoder(nn.Module):
    def forward(self, x):
        return x


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (_NotAnEncoder(), "unsupported model _NotAnEncoder.*squant supports bert"),
        (tiny_model("bert", is_decoder=True), "decoder"),
    ],
)
def test_unsupported_models_are_refused_with_a_clear_error(model, message):
    with pytest.raises(squant.SquantError, match=message):
        squant.quantize(model, calibration=token_batches(), progress=False)


def test_the_base_model_inside_a_head_model_is_quantized():
    base = tiny_model("bert", "masked-lm").bert  # a BertModel taken out of BertForMaskedLM
    q = squant.quantize(base, calibration=token_batches(), progress=False)
    assert type(q).__name__ == "BertModel"
    assert len(q.squant_info.modules) == 4 * base.config.num_hidden_layers  # qkv fused
    batch = token_batches(seed=4)[0]
    keep = batch["attention_mask"].bool()
    assert cosine(run(base, batch)[keep], run(q, batch)[keep]) > 0.99


def test_non_float32_models_are_refused():
    model = tiny_model("bert").to(torch.bfloat16)
    with pytest.raises(squant.SquantError, match="float32"):
        squant.quantize(model, calibration=token_batches(), progress=False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "int4"}, "mode"),
        ({"alpha": 1.5}, "alpha"),
        ({"alpha": -0.1}, "alpha"),
        ({"alpha": "auto?"}, "alpha"),
        ({"percentile": 20.0}, "percentile"),
        ({"act_range": "entropy"}, "act_range"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(squant.SquantError, match=message):
        squant.SmoothQuantConfig(**kwargs)


def test_config_round_trips_through_a_dict():
    cfg = squant.SmoothQuantConfig(mode="dynamic", alpha=0.7, exclude=("*.x",))
    assert squant.SmoothQuantConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_auto_alpha_is_searched_per_linear_and_recorded(mode):
    model = tiny_model("bert", outliers=True)
    test = token_batches(seed=9)[0]
    ref = last_hidden(model, test)
    # float outlier channels at FFN-out only (dynamic's default puts them at three GEMMs, where
    # they fix what smoothing would): what is compared is the search against no smoothing
    cfg = squant.SmoothQuantConfig(mode=mode, alpha="auto", outlier_sites=("ffn_out",))
    q = squant.quantize(model, cfg, token_batches(), progress=False)
    alphas = [m.alpha for m in q.squant_info.modules.values()]
    assert len(alphas) == 8
    assert all(0.0 <= a <= 1.0 for a in alphas)
    assert max(alphas) > 0.0  # outlier channels: the search smooths somewhere
    plain = squant.SmoothQuantConfig(mode=mode, alpha=0.0, outlier_sites=("ffn_out",))
    w8a8 = squant.quantize(model, plain, token_batches(), progress=False)
    # with outlier channels the searched smoothing clearly beats plain W8A8 end to end
    assert sqnr_db(ref, last_hidden(q, test)) > sqnr_db(ref, last_hidden(w8a8, test)) + 3.0


def test_dynamic_sites_and_calibration_coverage_are_recorded():
    model = tiny_model("bert", outliers=True)
    batches = token_batches()
    q = squant.quantize(model, squant.SmoothQuantConfig(mode="static"), batches, progress=False)
    modes = {m.kind: m.mode for m in q.squant_info.modules.values()}
    assert modes == {
        "qkv": "static",
        "ffn_in": "static",
        "attn_out": "dynamic",
        "ffn_out": "dynamic",
    }
    pure = squant.quantize(
        model, squant.SmoothQuantConfig(mode="static", dynamic_sites=()), batches, progress=False
    )
    assert {m.mode for m in pure.squant_info.modules.values()} == {"static"}
    seen = q.squant_info.calibration
    lengths = [int(n) for b in batches for n in b["attention_mask"].sum(1)]
    assert seen == squant.quant.record.Coverage(
        sequences=len(lengths),
        tokens=sum(lengths),
        min_length=min(lengths),
        max_length=max(lengths),
    )
    with pytest.raises(squant.SquantError, match="dynamic_sites takes"):
        squant.SmoothQuantConfig(dynamic_sites=("pooler",))
