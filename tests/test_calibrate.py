import pytest
import torch

from squant.errors import SquantError
from squant.quant.calibrate import (
    ChannelRange,
    Histogram,
    InputObservers,
    TokenSample,
    prepare_batches,
)
from tests.helpers import tiny_model


def test_channel_range_over_batches_equals_global_range():
    torch.manual_seed(0)
    chunks = [torch.randn(n, 8) * (i + 1) for i, n in enumerate((3, 17, 5))]
    obs = ChannelRange()
    for c in chunks:
        obs.update(c)
    everything = torch.cat(chunks)
    assert torch.equal(obs.min, everything.amin(0)) and torch.equal(obs.max, everything.amax(0))
    assert obs.tokens == 25
    m = torch.rand(8) + 0.1
    lo, hi = obs.range_after(m)
    assert lo == pytest.approx(float((everything * m).min()))
    assert hi == pytest.approx(float((everything * m).max()))


def test_histogram_quantiles_match_the_data_within_a_bin():
    torch.manual_seed(0)
    h = Histogram(bins=1024)
    # growing ranges force several doublings
    chunks = [torch.randn(4000) * scale for scale in (0.1, 1.0, 7.0)]
    for c in chunks:
        h.update(c)
    data = torch.cat(chunks)
    assert float(h.counts.sum()) == data.numel()  # doubling never loses a count
    width = 2 * h.radius / h.bins
    ordered = data.sort().values
    for q in (0.001, 0.25, 0.5, 0.9, 0.9999):
        # the q-quantile lies between the order statistics around q·n (one bin of slack)
        k = q * data.numel()
        below, above = ordered[max(int(k) - 1, 0)], ordered[min(int(k), data.numel() - 1)]
        assert float(below) - width <= h.quantile(q) <= float(above) + width
    lo, hi = h.percentile_range(99.9)
    assert lo < 0 < hi


def test_observers_skip_padding_positions():
    lin = torch.nn.Linear(4, 4)
    x = torch.zeros(2, 3, 4)
    x[1, 2] = 100.0  # a padded position with a huge value
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    with InputObservers({"lin": lin}, ChannelRange) as obs:
        obs.token_mask = mask
        lin(x)
    assert float(obs.observers["lin"].max.max()) == 0.0
    assert obs.observers["lin"].tokens == 5


def test_prepare_batches_accepts_tensors_and_dicts():
    model = tiny_model("bert")
    ids = torch.randint(3, 50, (2, 7))
    out = prepare_batches([ids, {"input_ids": ids[0], "attention_mask": torch.ones(7)}], model)
    assert out[0]["input_ids"].shape == (2, 7) and out[1]["input_ids"].shape == (1, 7)


@pytest.mark.parametrize(
    ("batches", "message"),
    [
        ([], "empty"),
        (None, "required"),
        ([torch.randint(3, 50, (1, 65))], "longer than the model's 64 positions"),
        ([torch.zeros(1, 0, dtype=torch.long)], "empty"),
        ([torch.randn(1, 4)], "integer"),
        ([torch.tensor([[5, 999]])], "outside"),
        (["a sentence"], "tokenizer output"),
    ],
)
def test_prepare_batches_errors(batches, message):
    with pytest.raises(SquantError, match=message):
        prepare_batches(batches, tiny_model("bert"))


def test_roberta_positions_account_for_the_padding_offset():
    model = tiny_model("roberta")  # 66 position embeddings, 2 reserved
    prepare_batches([torch.randint(3, 50, (1, 64))], model)
    with pytest.raises(SquantError, match="64 positions"):
        prepare_batches([torch.randint(3, 50, (1, 65))], model)


def test_token_sample_is_bounded_and_drawn_from_every_batch():
    sample = TokenSample(max_tokens=100, seed=0)
    for i in range(10):  # batch i holds rows whose value is i
        sample.update(torch.full((50, 3), float(i)))
    assert sample.rows.shape == (100, 3)
    counts = torch.bincount(sample.rows[:, 0].long(), minlength=10)
    assert int(counts.min()) >= 3  # uniform over all 500 rows: ~10 from each batch


def test_range_monitor_counts_inputs_outside_calibration():
    import squant
    from squant.quant.monitor import RangeMonitor
    from tests.helpers import tiny_model, token_batches

    model = tiny_model("bert", outliers=True)
    batches = token_batches()
    config = squant.SmoothQuantConfig(mode="static", dynamic_sites=())
    q = squant.quantize(model, config, batches, progress=False)
    with RangeMonitor(q) as monitor:
        monitor(**batches[0])  # calibration data: inside the ranges but for the odd token
    baseline = monitor.clipped_fraction()  # pushed out by the int8 error of earlier layers
    assert baseline < 0.02
    assert len(monitor.report()) == 8  # every static linear is watched
    with torch.no_grad():
        q.embeddings.word_embeddings.weight.mul_(50)  # traffic unlike calibration
    with RangeMonitor(q) as monitor:
        monitor(**batches[0])
    assert monitor.clipped_fraction() > max(0.1, 10 * baseline)
    q(**batches[0])  # hooks are gone after the block
    assert all(not m._forward_pre_hooks for m in monitor.modules.values())


def test_extreme_tokens_keep_the_largest_rows_across_batches():
    from squant.quant.calibrate import ExtremeTokens

    g = torch.Generator().manual_seed(0)
    stream = [torch.randn(50, 8, generator=g) for _ in range(4)]
    stream[2][17, 3] = 1000.0  # one massive-activation token, as [SEP] has in BERT
    ext = ExtremeTokens(k=5)
    for x in stream:
        ext.update(x)
    everything = torch.cat(stream)
    expected = everything[everything.abs().amax(dim=1).topk(5).indices]
    assert ext.rows.shape == (5, 8)
    assert torch.equal(ext.rows.abs().amax(1).sort().values, expected.abs().amax(1).sort().values)
    assert float(ext.rows.abs().max()) == 1000.0
