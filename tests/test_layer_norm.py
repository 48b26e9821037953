"""squant's residual add + LayerNorm + quantize kernel: every path this CPU runs against
torch's LayerNorm in float64 and against squant's own quantize steps on the kernel's float
output (exact integers), odd widths, one row, no rows, and bad operands."""

import pytest
import torch

from squant import kernels
from squant.quant import int8

PATHS = ["scalar", "auto"]  # "auto" is the AVX512 path where the CPU has it


@pytest.fixture(scope="module", autouse=True)
def _kernels():
    kernels.load()


def _operands(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = shape[-1]
    x = torch.randn(shape, generator=g) * 3
    residual = torch.randn(shape, generator=g)
    weight = torch.rand(hidden, generator=g) + 0.5
    bias = torch.randn(hidden, generator=g)
    multiplier = torch.rand(hidden, generator=g) * 20
    return x, residual, weight, bias, multiplier


def _reference(x, residual, weight, bias, eps):
    v = x.double() if residual is None else x.double() + residual.double()
    b = None if bias is None else bias.double()
    return torch.nn.functional.layer_norm(v, v.shape[-1:], weight.double(), b, eps)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", [(2, 128, 768), (3, 5, 72), (1, 1, 5), (7, 100), (0, 64)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_static_variant_normalizes_and_quantizes_like_the_separate_steps(
    path, shape, with_residual
):
    x, residual, weight, bias, multiplier = _operands(shape)
    r = residual if with_residual else None
    out, q = torch.ops.squant.add_layer_norm_quantize(
        x, r, weight, bias, 1e-12, multiplier, 127, path
    )
    assert out.shape == x.shape and out.dtype == torch.float32
    hidden = shape[-1]
    assert q.shape == (x.numel() // hidden, hidden) and q.dtype == torch.uint8
    ref = _reference(x, r, weight, bias, 1e-12)
    # float32 sums in another order than float64: a few ulps of outputs up to ~10
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-5)
    # the integers are quantize_static's on the kernel's own float output, exactly
    assert torch.equal(q, int8.quantize_static(out.reshape(-1, hidden), multiplier, 127))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", [(2, 128, 768), (3, 5, 72), (1, 1, 5)])
def test_per_token_variant_gives_quantize_per_token_results_exactly(path, shape):
    x, residual, weight, bias, multiplier = _operands(shape, seed=1)
    index = torch.tensor([3, 0]) if shape[-1] > 3 else torch.tensor([0])
    out, q, scale, side = torch.ops.squant.add_layer_norm_quantize_rows(
        x, residual, weight, bias, 1e-5, multiplier, index, path
    )
    torch.testing.assert_close(
        out.double(), _reference(x, residual, weight, bias, 1e-5), rtol=0, atol=2e-5
    )
    rows = out.reshape(-1, shape[-1])
    q_ref, scale_ref, side_ref = torch.ops.squant.quantize_per_token(rows, multiplier, index)
    assert torch.equal(q, q_ref) and torch.equal(scale, scale_ref) and torch.equal(side, side_ref)
    # and the reference quantizer in Python agrees
    assert torch.equal(q, int8.quantize_per_token(rows * multiplier)[0])
    # without multiplier, bias or outlier channels
    out2, q2, _, side2 = torch.ops.squant.add_layer_norm_quantize_rows(
        x, residual, weight, None, 1e-5, None, None, path
    )
    torch.testing.assert_close(
        out2.double(), _reference(x, residual, weight, None, 1e-5), rtol=0, atol=2e-5
    )
    assert torch.equal(q2, int8.quantize_per_token(out2.reshape(-1, shape[-1]))[0])
    assert side2.shape == (rows.shape[0], 0)


def test_vector_and_plain_paths_agree():
    if not torch.ops.squant.layer_norm_vectorized():
        pytest.skip("no AVX512 on this CPU: only the plain path runs")
    x, residual, weight, bias, multiplier = _operands((4, 33, 384), seed=2)
    v_out, v_q = torch.ops.squant.add_layer_norm_quantize(
        x, residual, weight, bias, 1e-12, multiplier, 130, "avx512"
    )
    s_out, s_q = torch.ops.squant.add_layer_norm_quantize(
        x, residual, weight, bias, 1e-12, multiplier, 130, "scalar"
    )
    torch.testing.assert_close(v_out, s_out, rtol=0, atol=1e-5)
    # an integer may move by one step where the two float outputs straddle a rounding edge
    assert int((v_q.int() - s_q.int()).abs().max()) <= 1
    assert float((v_q != s_q).float().mean()) < 1e-3


def test_kernel_refuses_bad_operands():
    x, residual, weight, bias, multiplier = _operands((2, 3, 8))
    op = torch.ops.squant.add_layer_norm_quantize
    with pytest.raises(RuntimeError, match="residual must be float32 of x's shape"):
        op(x, residual[:, :2], weight, bias, 1e-5, multiplier, 128)
    with pytest.raises(RuntimeError, match=r"weight must be float32 \[8\]"):
        op(x, residual, weight[:7], bias, 1e-5, multiplier, 128)
    with pytest.raises(RuntimeError, match="x must be float32"):
        op(x.double(), None, weight, bias, 1e-5, multiplier, 128)
    with pytest.raises(RuntimeError, match=r"zero_point must be in \[0, 255\]"):
        op(x, residual, weight, bias, 1e-5, multiplier, 256)
    with pytest.raises(RuntimeError, match="path must be"):
        op(x, residual, weight, bias, 1e-5, multiplier, 128, "sse")
    with pytest.raises(RuntimeError, match="side_index 8 is out of range for 8 hidden features"):
        torch.ops.squant.add_layer_norm_quantize_rows(
            x, residual, weight, bias, 1e-5, None, torch.tensor([8])
        )
