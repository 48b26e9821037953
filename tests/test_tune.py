"""squant tune on a tiny model where the right answer is known: one layer is made fragile
(weight outliers scattered over every row and column: per-row int8 weights lose their
precision and no per-channel smoothing can move them), and it must be that
layer that falls back to float."""

import json

import pytest
import torch
from torch import nn

import squant
from squant.eval.task import Task
from squant.eval.tune import TuneConfig, sensitivity, tune
from tests.helpers import last_hidden, tiny_model, token_batches

FRAGILE = "encoder.layer.1.output.dense"


def _fragile_model():
    model = tiny_model("bert")
    with torch.no_grad():
        w = model.get_submodule(FRAGILE).weight  # [64, 128]
        scattered = torch.rand(w.shape, generator=torch.Generator().manual_seed(0)) < 0.05
        w[scattered] *= 40.0  # outliers in every row and every column: no s can move them
    return model


def _cosine_task(model):
    tests = token_batches(n=2, seed=21)
    refs = [last_hidden(model, b) for b in tests]

    def score(variant, label):
        cos = [
            float(
                nn.functional.cosine_similarity(last_hidden(variant, b).flatten(), r.flatten(), 0)
            )
            for b, r in zip(tests, refs, strict=True)
        ]
        return {"cosine_percent": 100.0 * sum(cos) / len(cos)}

    return Task("cosine", model, token_batches(n=3, seed=2), ("cosine_percent",), 8, score)


def test_the_fragile_layer_is_the_most_sensitive():
    model = _fragile_model()
    q = squant.quantize(
        model, squant.SmoothQuantConfig(mode="static"), token_batches(), progress=False
    )
    ranking = sensitivity(model, q, token_batches())
    assert max(ranking, key=ranking.get) == FRAGILE
    assert len(ranking) == 8


def test_tune_falls_back_the_fragile_layer_and_meets_the_budget():
    model = _fragile_model()
    task = _cosine_task(model)
    full = squant.quantize(
        model, squant.SmoothQuantConfig(mode="dynamic"), task.calibration, progress=False
    )
    full_loss = 100.0 - task.score(full, "full")["cosine_percent"]
    budget = full_loss / 2  # tighter than what full INT8 reaches
    config = TuneConfig(max_loss=budget, alphas=("auto",), max_fallback=3, outlier_escalation=False)
    result = tune(task, config)
    assert result.within_budget, result.lines()
    assert result.fallbacks[0].fell_back == FRAGILE
    assert FRAGILE in result.chosen.exclude
    assert type(result.model.get_submodule(FRAGILE)) is nn.Linear
    assert result.fallbacks[-1].loss_percent <= budget
    report = json.loads(json.dumps(result.to_dict()))  # the saved report is plain JSON
    assert report["fallbacks"][0]["fell_back"] == FRAGILE
    assert report["within_budget"] is True


def test_tune_stops_at_the_first_candidate_within_budget():
    model = tiny_model("bert")
    result = tune(_cosine_task(model), TuneConfig(max_loss=5.0))
    assert result.within_budget
    assert len(result.tried) == 1  # static, alpha auto: the fastest candidate already fits
    assert result.chosen.mode == "static"
    assert result.fallbacks == []


def test_tune_config_validation():
    with pytest.raises(squant.SquantError, match="percentage"):
        TuneConfig(max_loss=-1)


def test_tune_escalates_to_outlier_channels_at_every_gemm_before_falling_back():
    model = _fragile_model()
    task = _cosine_task(model)
    # a budget no candidate meets: every rung of the ladder is tried once, in order
    config = TuneConfig(max_loss=0.0, alphas=("auto",), max_fallback=1)
    result = tune(task, config)
    labels = [(a.config.mode, a.config.alpha, a.config.outlier_sites) for a in result.tried]
    every = ("qkv", "attn_out", "ffn_in", "ffn_out")
    three = ("qkv", "ffn_in", "ffn_out")
    assert labels[:7] == [
        ("static", "auto", ("ffn_out",)),  # static's defaults; its alpha "auto" is the same
        ("dynamic", 0.0, three),  # dynamic's defaults
        ("dynamic", "auto", three),
        ("static", "auto", every),
        ("static", 0.0, every),
        ("dynamic", "auto", every),
        ("dynamic", 0.0, every),
    ]
    assert len(result.fallbacks) == 1  # then the fallback of the best candidate
