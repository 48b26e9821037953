import pytest
import torch

from squant.quant.qlinear import SmoothedLinear
from squant.quant.smooth import (
    S_MAX,
    int8_output_error,
    search_alpha,
    smoothing_factors,
    weight_channel_absmax,
)


def test_smoothing_factors_match_the_formula():
    act = torch.tensor([4.0, 1.0, 100.0])
    w = torch.tensor([1.0, 4.0, 0.25])
    s = smoothing_factors(act, w, alpha=0.5)
    torch.testing.assert_close(s, torch.tensor([2.0, 0.5, 20.0]))
    s = smoothing_factors(act, w, alpha=0.75)
    torch.testing.assert_close(s, act**0.75 / w**0.25)


def test_alpha_zero_is_no_smoothing_and_dead_channels_keep_one():
    act = torch.tensor([3.0, 0.0, 2.0])
    w = torch.tensor([1.0, 1.0, 0.0])
    assert torch.equal(smoothing_factors(act, w, 0.0), torch.ones(3))
    s = smoothing_factors(act, w, 0.5)
    assert s[1] == 1.0 and s[2] == 1.0 and s[0] == pytest.approx(3**0.5)


def test_smoothing_factors_are_bounded():
    s = smoothing_factors(torch.tensor([1e12]), torch.tensor([1e-12]), 1.0)
    assert float(s) == S_MAX


def test_smoothing_factors_reject_bad_input():
    with pytest.raises(ValueError, match="alpha"):
        smoothing_factors(torch.ones(2), torch.ones(2), 1.5)
    with pytest.raises(ValueError, match="vectors"):
        smoothing_factors(torch.ones(2), torch.ones(3), 0.5)


def test_weight_channel_absmax_over_several_weights():
    a = torch.tensor([[1.0, -5.0], [2.0, 0.0]])
    b = torch.tensor([[-3.0, 1.0]])
    assert torch.equal(weight_channel_absmax(a, b), torch.tensor([3.0, 5.0]))


def test_smoothed_linear_is_exact():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 16)
    x = torch.randn(8, 32) * torch.logspace(-2, 2, 32)
    s = smoothing_factors(x.abs().amax(0), weight_channel_absmax(lin.weight), 0.5)
    smoothed = SmoothedLinear.from_linear(lin, s)
    torch.testing.assert_close(smoothed(x), lin(x), rtol=1e-5, atol=1e-5)
    # the GEMM now sees a flatter input: the largest channel ratio shrinks
    seen = (x * smoothed.input_multiplier).abs().amax(0)
    assert seen.max() / seen.min() < x.abs().amax(0).max() / x.abs().amax(0).min()


def test_alpha_search_moves_away_from_zero_when_inputs_have_outlier_channels():
    torch.manual_seed(0)
    x = torch.randn(256, 64)
    x[:, [3, 17]] *= 60.0  # outlier channels, as in trained BERTs
    w = torch.randn(32, 64) * 0.05
    for mode in ("static", "dynamic"):
        best, errors = search_alpha(x, w, x.amin(0), x.amax(0), mode)
        assert best > 0.2
        assert errors[best] < 0.5 * errors[0.0]  # much better than plain W8A8
    # without outliers there is little to gain, and the search does not make things worse
    x = torch.randn(256, 64)
    best, errors = search_alpha(x, w, x.amin(0), x.amax(0), "static")
    assert errors[best] <= errors[0.0]


def test_int8_output_error_is_zero_for_exactly_representable_operands():
    x = torch.tensor([[1.0, -1.0], [0.5, 0.0]])  # each row: 127 steps of its own scale
    w = torch.tensor([[127.0, 0.0], [-127.0, 127.0]]) / 127
    s = torch.ones(2)
    assert int8_output_error(x, w, s, "dynamic") < 1e-10


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_int8_output_error_runs_the_gemm_the_model_runs(monkeypatch, mode):
    """The alpha search scores each candidate on the GEMM a QuantLinear of that weight runs
    (squant's where it runs); both GEMMs sum the same integers, so oneDNN's gives the same
    error."""
    from squant.quant import int8

    torch.manual_seed(0)
    x, w, s = torch.randn(40, 64), torch.randn(48, 64) * 0.05, torch.rand(64) + 0.5
    rng = (float((x / s).min()), float((x / s).max()))
    deployed = int8_output_error(x, w, s, mode, rng)
    monkeypatch.setenv(int8.GEMM_ENV, "onednn")
    onednn = int8_output_error(x, w, s, mode, rng)
    assert deployed > 0 and deployed == pytest.approx(onednn, rel=1e-5)
