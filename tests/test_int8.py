"""Kernel-level checks: the int8 GEMMs (squant's and oneDNN's) against exact integer and float
math on the dequantized operands."""

import copy
import pickle

import pytest
import torch
from torch import nn

from squant import int8
from squant.quant.qlinear import QuantLinear, SmoothedLinear


def test_quantize_weight_error_is_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(16, 32)
    q, scale = int8.quantize_weight(w, qmax=127)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    err = (q.float() * scale[:, None] - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-7).all())


def test_quantize_weight_matches_the_plain_formula():
    """quantize_weight takes |max| from one min/max pass and rounds in place: the same bytes
    and scales as round(w / (max|w| / qmax)) written out, on rows led by a negative or a
    positive value, an all-zero row and a row of ties at .5 steps."""
    torch.manual_seed(0)
    w = torch.randn(64, 96)
    w[3] = 0.0
    w[5, 7] = -9.0
    w[6, 2] = 9.0
    w[7] = torch.arange(96) / 127 - 0.3
    for qmax in (63, 127):
        q, scale = int8.quantize_weight(w, qmax=qmax)
        want_scale = (w.abs().amax(dim=1) / qmax).clamp(min=1e-12)
        want = torch.round(w / want_scale[:, None]).clamp(-qmax, qmax).to(torch.int8)
        assert torch.equal(scale, want_scale) and torch.equal(q, want)


@pytest.mark.parametrize("qmax", [63, 127])
def test_quantize_weight_blocked_equals_quantize_then_pack(qmax):
    """The alpha search's one-pass kernel gives quantize_weight's bytes and scales on W·s,
    in pack_weight_blocked's layout with its row sums (padded rows, an all-zero row, a
    width that is not a multiple of 16)."""
    from squant import kernels

    kernels.load()
    torch.manual_seed(0)
    for out, inp in [(100, 64), (3, 8), (130, 12)]:
        w, s = torch.randn(out, inp) * 0.05, torch.rand(inp) + 0.5
        w[1] = 0.0
        got = torch.ops.squant.quantize_weight_blocked(w, s, qmax)
        q, scale = int8.quantize_weight(w * s[None, :], qmax=qmax)
        packed, compensation = int8.pack_weight_blocked(q)
        assert torch.equal(got[0], packed) and torch.equal(got[1], compensation)
        assert torch.equal(got[2], scale)
    with pytest.raises(RuntimeError, match="multiple of 4"):
        torch.ops.squant.quantize_weight_blocked(torch.ones(4, 6), torch.ones(6), 127)


def test_weights_fit_what_this_hosts_kernel_multiplies_exactly():
    """Without VNNI, u8 x s8 pairs add into a saturating int16: 8-bit weights overflow it.
    squant's weights (new or loaded) never exceed the host kernel's exact range."""
    torch.manual_seed(0)
    qmax = int8.kernel_weight_qmax()
    assert qmax in (63, 127)
    q, _ = int8.quantize_weight(torch.randn(8, 16))
    assert int(q.abs().max()) == qmax
    # a weight saved with 8-bit values (on a VNNI machine) is requantized for the kernel
    w8 = torch.randint(-127, 128, (64, 256), dtype=torch.int8)
    scale = torch.rand(64) + 0.1
    w_k, s_k = int8.kernel_weight(w8, scale, qmax=63)
    assert int(w_k.abs().max()) <= 63
    err = (w_k.float() * s_k[:, None] - w8.float() * scale[:, None]).abs().amax(dim=1)
    assert bool((err <= s_k / 2 + 1e-4).all())  # within half a 7-bit step per row
    assert int8.kernel_weight(w8, scale, qmax=127)[0] is w8
    # the kernel is exact on the weights it is given: no saturation whatever the host
    x = torch.randint(0, 256, (32, 256), dtype=torch.uint8)
    w_run, s_run = int8.kernel_weight(w8, torch.ones(64))
    y = int8.int8_linear(
        x,
        1.0,
        128,
        int8.pack_weight(w_run),
        s_run,
        torch.zeros(64, dtype=torch.int32),
        None,
        torch.float32,
    )
    ref = ((x.double() - 128) @ w_run.double().T * s_run.double()).float()
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


@pytest.mark.parametrize(
    ("lo", "hi"), [(-1.0, 3.0), (0.5, 2.0), (-2.0, -1.0), (0.0, 0.0), (-0.17, 8.0)]
)
def test_affine_qparams_cover_the_range_and_zero(lo, hi):
    scale, zp = int8.affine_qparams(lo, hi)
    assert 0 <= zp <= 255 and scale > 0
    grid_lo, grid_hi = (0 - zp) * scale, (255 - zp) * scale
    assert grid_lo <= min(lo, 0.0) + scale and grid_hi >= max(hi, 0.0) - scale


def test_per_token_quantization_uses_each_rows_own_scale():
    x = torch.tensor([[1.0, -0.5, 0.25], [100.0, 50.0, -25.0]])
    q, scale = int8.quantize_per_token(x)
    torch.testing.assert_close(scale.squeeze(1), torch.tensor([1 / 127, 100 / 127]))
    assert q.dtype == torch.uint8
    torch.testing.assert_close((q.float() - 128) * scale, x, atol=0.5 * 100 / 127, rtol=0)
    assert int(q[0, 0]) == 255 and int(q[1, 0]) == 255


def _smoothed_linear(seed=0, k=48, n=24):
    torch.manual_seed(seed)
    lin = nn.Linear(k, n)
    s = torch.rand(k) + 0.5
    return SmoothedLinear.from_linear(lin, s)


def _reference_static(q: QuantLinear, x):
    """Float math on the dequantized operands: the same grid, no integer kernel."""
    x_q = int8.quantize_static(x, q.input_multiplier / q._x_scale, q._x_zero_point)
    x_deq = (x_q.float() - q._x_zero_point) * q._x_scale
    return nn.functional.linear(x_deq, q.dequantized_weight(), q.bias)


def _reference_dynamic(q: QuantLinear, x):
    x_q, scale = int8.quantize_per_token(x * q.input_multiplier)
    x_deq = (x_q.float() - 128) * scale
    return nn.functional.linear(x_deq, q.dequantized_weight(), q.bias)


@pytest.fixture(params=["squant", "onednn"])
def gemm(request, monkeypatch):
    """Run the test on each GEMM kernel QuantLinear can use (squant's only where it runs)."""
    if request.param == "squant" and int8.gemm_kernel(48) != "squant":
        pytest.skip("squant's int8 GEMM does not run on this CPU")
    monkeypatch.setenv(int8.GEMM_ENV, request.param)
    return request.param


def _squant_gemm_or_skip() -> None:
    if int8.gemm_kernel(64) != "squant":
        pytest.skip("squant's int8 GEMM does not run on this CPU")


def _random_gemm_operands(g, rows, inputs, outputs):
    """u8 activations, s8 weights, per-output-channel weight scales and a float bias."""
    x_q = torch.randint(0, 256, (rows, inputs), dtype=torch.uint8, generator=g)
    w_q = torch.randint(-127, 128, (outputs, inputs), dtype=torch.int8, generator=g)
    w_scale = torch.rand(outputs, generator=g) * 0.01
    bias = torch.randn(outputs, generator=g)
    return x_q, w_q, w_scale, bias


def _exact_reference(x_q, w_q, x_scale, zp, w_scale, bias, activation):
    # integer sums are exact in float64 at these sizes; the epilogue in float64
    y = ((x_q.double() - zp) @ w_q.double().T) * x_scale * w_scale.double() + bias.double()
    return int8.apply_activation(y, activation)


@pytest.mark.parametrize("activation", ["none", "gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("epilogue", ["auto", "scalar"])
@pytest.mark.parametrize(
    ("rows", "inputs", "outputs"),
    # row and column tails; 8.6 MB of weights, more than any core's L2: tasks by weight block
    [(1, 8, 3), (7, 64, 100), (65, 96, 128), (130, 384, 200), (130, 4096, 2112)],
)
def test_squant_gemm_matches_exact_integer_math(activation, epilogue, rows, inputs, outputs):
    """squant's kernel on any shape (rows and outputs not multiples of its 64 x 64 blocks;
    weights that fit in L2 and weights that do not, which change the task order), every
    activation and both epilogues (the AVX512 one where the CPU has it, and plain C++),
    against float64 math on the same integers: relative error <= 1e-6 (float32 rounding and
    the erf approximation's 1.5e-7)."""
    _squant_gemm_or_skip()
    g = torch.Generator().manual_seed(rows * 1000 + outputs)
    x_q, w_q, w_scale, bias = _random_gemm_operands(g, rows, inputs, outputs)
    packed, compensation = int8.pack_weight_blocked(w_q)
    assert packed.shape == (-(-outputs // 64), inputs // 4, 64, 4)
    y = torch.ops.squant.int8_linear(
        x_q, packed, compensation, 0.02, 97, w_scale, bias, outputs, activation, epilogue=epilogue
    )
    ref = _exact_reference(x_q, w_q, 0.02, 97, w_scale, bias, activation)
    assert y.dtype == torch.float32 and y.shape == (rows, outputs)
    assert float(((y.double() - ref).abs() / (ref.abs() + 1)).max()) < 1e-6
    y16 = torch.ops.squant.int8_linear(
        x_q, packed, compensation, 0.02, 97, w_scale, bias, outputs, activation, torch.bfloat16
    )
    assert y16.dtype == torch.bfloat16
    assert float(((y16.double() - ref).abs() / (ref.abs() + 1)).max()) < 2**-8  # bf16 rounding


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize(
    ("rows", "inputs", "outputs"),
    # 3 x 2 tasks (weights in L2: by row block); 3 x 33 tasks by weight block (8.6 MB)
    [(130, 384, 100), (130, 4096, 2112)],
)
def test_squant_gemm_gives_every_task_to_one_thread(threads, rows, inputs, outputs):
    """Each thread runs its own range of 64 x 64 tasks and then takes tasks from the back of
    the others' ranges: whatever the thread count (ranges of unequal length), the output
    equals the one-thread output bit for bit and the float64 reference. A task run by no
    thread leaves uninitialized memory in the output; the one-thread result is held, so the
    pool cannot hand its block (with the right numbers in it) to the next call."""
    _squant_gemm_or_skip()
    g = torch.Generator().manual_seed(threads * 7 + outputs)
    x_q, w_q, w_scale, bias = _random_gemm_operands(g, rows, inputs, outputs)
    packed, compensation = int8.pack_weight_blocked(w_q)
    operands = (x_q, packed, compensation, 0.02, 97, w_scale, bias, outputs)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.squant.int8_linear(*operands)
        torch.set_num_threads(threads)
        many = [torch.ops.squant.int8_linear(*operands) for _ in range(3)]
    finally:
        torch.set_num_threads(before)
    ref = _exact_reference(x_q, w_q, 0.02, 97, w_scale, bias, "none")
    assert float(((one.double() - ref).abs() / (ref.abs() + 1)).max()) < 1e-6
    for y in many:
        assert torch.equal(y, one)


@pytest.mark.parametrize("epilogue", ["auto", "scalar"])
@pytest.mark.parametrize("activation", ["none", "gelu"])
@pytest.mark.parametrize("side", [3, 4])  # 4, the default count, is held in registers
def test_squant_gemm_epilogue_applies_row_scales_and_the_float_side_product(
    epilogue, activation, side
):
    """The dynamic-mode epilogue: one scale per row (per-token) and a float side product
    (outlier channels) added before the activation, on a 70-column tail block."""
    _squant_gemm_or_skip()
    g = torch.Generator().manual_seed(7)
    rows, inputs, outputs = 37, 96, 70
    x_q, w_q, w_scale, bias = _random_gemm_operands(g, rows, inputs, outputs)
    row_scale = torch.rand(rows, 1, generator=g) + 0.1
    side_x = torch.randn(rows, side, generator=g) * 5
    side_w = torch.randn(side, outputs, generator=g)
    packed, compensation = int8.pack_weight_blocked(w_q)
    y = torch.ops.squant.int8_linear(
        x_q, packed, compensation, 1.0, 128, w_scale, bias, outputs, activation,
        row_scale=row_scale, side_x=side_x, side_w=side_w, epilogue=epilogue,
    )  # fmt: skip
    pre = ((x_q.double() - 128) @ w_q.double().T) * row_scale.double() * w_scale.double()
    ref = int8.apply_activation(pre + bias.double() + side_x.double() @ side_w.double(), activation)
    # float32 rounding of terms larger than their sum (cancellation): a few float32 ulps
    assert float(((y.double() - ref).abs() / (ref.abs() + 1)).max()) < 4e-6
    with pytest.raises(RuntimeError, match="side_x and side_w come together"):
        torch.ops.squant.int8_linear(
            x_q, packed, compensation, 1.0, 128, w_scale, bias, outputs, side_x=side_x
        )


def test_squant_gemm_refuses_bad_operands_with_clear_errors():
    _squant_gemm_or_skip()
    w_q = torch.randint(-127, 128, (64, 32), dtype=torch.int8)
    packed, compensation = int8.pack_weight_blocked(w_q)
    x_q = torch.randint(0, 256, (4, 32), dtype=torch.uint8)
    scale = torch.ones(64)
    op = torch.ops.squant.int8_linear
    with pytest.raises(RuntimeError, match="x must be uint8"):
        op(x_q.to(torch.int8), packed, compensation, 1.0, 0, scale, None, 64)
    with pytest.raises(RuntimeError, match="input features"):
        op(x_q[:, :16], packed, compensation, 1.0, 0, scale, None, 64)
    with pytest.raises(RuntimeError, match="unknown activation 'swish'"):
        op(x_q, packed, compensation, 1.0, 0, scale, None, 64, "swish")
    assert op(x_q[:0], packed, compensation, 1.0, 0, scale, None, 64).shape == (0, 64)


def test_gemm_kernel_choice(monkeypatch):
    from squant.errors import SquantError

    monkeypatch.setenv(int8.GEMM_ENV, "onednn")
    assert int8.gemm_kernel(64) == "onednn"
    monkeypatch.setenv(int8.GEMM_ENV, "mkl")
    with pytest.raises(SquantError, match="SQUANT_INT8_GEMM must be one of"):
        int8.gemm_kernel(64)
    monkeypatch.delenv(int8.GEMM_ENV)
    assert int8.gemm_kernel(63) == "onednn"  # squant's layout needs inputs in fours
    q = QuantLinear(63, 8, True, "dynamic")
    assert q.gemm == "onednn" and q(torch.randn(2, 63)).shape == (2, 8)


@pytest.mark.parametrize("isa", ["AVX2", "AVX512_CORE"])
def test_without_vnni_the_layer_runs_onednn(isa):
    """Where PyTorch's brgemm cannot multiply u8 x s8 exactly (no VNNI: here oneDNN is held
    to an older ISA, as on an AVX2-only CPU) squant's kernel is not chosen, and the layer runs
    oneDNN's qlinear, matching float math on the dequantized operands."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import torch
        from torch import nn
        from squant import int8
        from squant.quant.qlinear import QuantLinear, SmoothedLinear
        # what squant does on a CPU without VNNI (its cpuid check sees this one's VNNI)
        int8.kernel_weight_qmax = lambda: int8.QMAX_W_NO_VNNI
        lin = SmoothedLinear.from_linear(nn.Linear(64, 32), torch.ones(64))
        q = QuantLinear.from_float(lin, "dynamic")
        x = torch.randn(5, 64)
        x_q, scale = int8.quantize_per_token(x)
        ref = nn.functional.linear((x_q.float() - 128) * scale, q.dequantized_weight(), q.bias)
        torch.testing.assert_close(q(x), ref, rtol=1e-5, atol=1e-5)
        print(q.gemm, torch.ops.squant.int8_linear_supported())
        """
    )
    env = {**__import__("os").environ, "ONEDNN_MAX_CPU_ISA": isa}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["onednn", "False"]


@pytest.mark.parametrize("mode", ["static", "dynamic"])
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_both_gemm_kernels_compute_the_same_layer(mode, activation, monkeypatch):
    """QuantLinear on squant's kernel and on oneDNN's: the same integers, so the same outputs
    up to float rounding (and the erf approximation in GELU)."""
    _squant_gemm_or_skip()
    lin = _smoothed_linear()
    x = torch.randn(5, 48) * 2
    rng = (float((x * lin.input_multiplier).min()), float((x * lin.input_multiplier).max()))
    monkeypatch.setenv(int8.GEMM_ENV, "onednn")
    q = QuantLinear.from_float(lin, mode, rng if mode == "static" else None, activation)
    monkeypatch.setenv(int8.GEMM_ENV, "squant")
    q_squant = copy.deepcopy(q)  # a copy derives its packed weight for this process' kernel
    assert (q.gemm, q_squant.gemm) == ("onednn", "squant")
    torch.testing.assert_close(q_squant(x), q(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_int8_gemm_matches_dequantized_float_reference(mode, gemm):
    lin = _smoothed_linear()
    x = torch.randn(3, 10, 48) * 2
    rng = (float((x * lin.input_multiplier).min()), float((x * lin.input_multiplier).max()))
    q = QuantLinear.from_float(lin, mode, rng if mode == "static" else None)
    y = q(x)
    ref = (_reference_static if mode == "static" else _reference_dynamic)(q, x.reshape(-1, 48))
    assert y.shape == (3, 10, 24) and y.dtype == torch.float32
    # integer accumulation is exact; only float rounding of scales/bias differs
    torch.testing.assert_close(y.reshape(-1, 24), ref, rtol=1e-5, atol=1e-5)
    # and the whole thing is close to the float layer (quantization error, not kernel error)
    with torch.no_grad():
        assert float(nn.functional.cosine_similarity(y.flatten(), lin(x).flatten(), 0)) > 0.999


def test_quant_linear_survives_deepcopy_pickle_and_state_dict(gemm):
    lin = _smoothed_linear()
    q = QuantLinear.from_float(lin, "static", (-3.0, 4.0))
    x = torch.randn(5, 48)
    y = q(x)
    for clone in (copy.deepcopy(q), pickle.loads(pickle.dumps(q))):
        torch.testing.assert_close(clone(x), y, rtol=0, atol=0)
    fresh = QuantLinear(48, 24, True, "static")
    fresh.load_state_dict(q.state_dict())
    torch.testing.assert_close(fresh(x), y, rtol=0, atol=0)
    assert "packed_weight" not in q.state_dict()


@pytest.mark.parametrize("kernel", ["onednn", "squant"])
def test_int8_gemm_never_runs_a_reference_kernel(tmp_path, kernel):
    """On VNNI-only CPUs oneDNN runs s8 x s8 in a reference kernel thousands of times slower;
    squant's u8 x s8 must get a real (brgemm/jit) implementation on either GEMM (oneDNN's
    matmul, or squant's kernel on oneDNN's brgemm ukernel). Read oneDNN's verbose log."""
    if kernel == "squant" and int8.gemm_kernel(256) != "squant":
        pytest.skip("squant's int8 GEMM does not run on this CPU")
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import torch
        from torch import nn
        from squant.quant.qlinear import QuantLinear, SmoothedLinear
        lin = SmoothedLinear.from_linear(nn.Linear(256, 512), torch.ones(256))
        for mode in ("static", "dynamic"):
            q = QuantLinear.from_float(lin, mode, (-3.0, 3.0) if mode == "static" else None)
            q(torch.randn(64, 256))
        """
    )
    env = {**__import__("os").environ, "ONEDNN_VERBOSE": "1", int8.GEMM_ENV: kernel}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    if kernel == "squant":
        brgemms = [line for line in out.stdout.splitlines() if "ukernel,exec" in line]
        assert brgemms, "oneDNN verbose printed no brgemm ukernel call"
        assert all("src:u8" in line and "wei:s8" in line for line in brgemms)
        assert "matmul" not in out.stdout
        return
    matmuls = [line for line in out.stdout.splitlines() if "exec" in line and "matmul" in line]
    assert matmuls, "oneDNN verbose printed no int8 matmul"
    assert all("src:u8" in line for line in matmuls)
    impls = {f[f.index("matmul") + 1] for f in (line.split(",") for line in matmuls)}
    assert impls
    assert not {i for i in impls if i.startswith("ref") or "any" in i}, impls


@pytest.mark.parametrize("path", ["auto", "scalar"])
@pytest.mark.parametrize(("rows", "width"), [(1, 384), (7, 100), (70, 1536)])
def test_quantize_per_token_kernel_matches_the_reference_exactly(path, rows, width):
    from squant import kernels

    kernels.load()
    torch.manual_seed(rows)
    x = torch.randn(rows, width) * 3
    x[0, 5] = 40.0  # an outlier row maximum
    x[-1] = 0.0  # an all-zero row takes the tiny scale
    multiplier = torch.rand(width) + 0.5
    index = torch.tensor([3, 1, width - 1])
    q, scale, side = torch.ops.squant.quantize_per_token(x, multiplier, index, path)
    q_ref, scale_ref = int8.quantize_per_token(x * multiplier)
    assert torch.equal(q, q_ref) and torch.equal(scale, scale_ref)
    assert torch.equal(side, x[:, index])
    # exact halves round to even, as torch.round does
    halves = ((torch.arange(width) - width // 2) * 0.5)[None].repeat(2, 1)
    halves[:, 0] = 127.0
    q, scale, side = torch.ops.squant.quantize_per_token(halves, None, None, path)
    assert torch.equal(q, int8.quantize_per_token(halves)[0]) and side.shape == (2, 0)
    # bf16 and fp16 inputs go through the helper
    for dtype in (torch.bfloat16, torch.float16):
        xd = x.to(dtype)
        q, scale, side = int8.quantize_rows(xd, multiplier, index)
        assert torch.equal(q, int8.quantize_per_token(xd.float() * multiplier)[0])


def test_quantize_per_token_vector_path_treats_nan_and_inf_as_the_plain_one():
    """The AVX512 path skips the [-127, 127] clamp that |x| <= |max| makes redundant; a NaN
    or an infinity in a row must still give the plain C++ path's integers."""
    from squant import kernels

    kernels.load()
    x = torch.randn(4, 40, generator=torch.Generator().manual_seed(5))
    x[0, 3], x[1, 7], x[2, 39] = float("nan"), float("inf"), -float("inf")
    x[3, 0], x[3, 1] = float("inf"), float("nan")
    try:
        fast = torch.ops.squant.quantize_per_token(x, None, None, "avx512")
    except RuntimeError as e:
        pytest.skip(str(e))
    slow = torch.ops.squant.quantize_per_token(x, None, None, "scalar")
    assert torch.equal(fast[0], slow[0])


def test_quantize_per_token_kernel_refuses_bad_operands():
    from squant import kernels

    kernels.load()
    with pytest.raises(RuntimeError, match="side_index 8 is out of range for 8 input features"):
        torch.ops.squant.quantize_per_token(torch.zeros(2, 8), None, torch.tensor([8]))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        torch.ops.squant.quantize_per_token(torch.zeros(2, 3, 4), None, None)
    with pytest.raises(RuntimeError, match="multiplier must be float32"):
        torch.ops.squant.quantize_per_token(torch.zeros(2, 8), torch.ones(7), None)
    with pytest.raises(RuntimeError, match="path must be"):
        torch.ops.squant.quantize_per_token(torch.zeros(2, 8), None, None, "sse")


@pytest.mark.parametrize("path", ["auto", "scalar"])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize(
    ("rows", "inputs", "outputs", "threads"),
    [
        (1, 64, 100, 2),
        (37, 96, 130, 2),
        (130, 384, 1536, 2),
        (130, 96, 200, 1),
        (70, 96, 200, 3),  # three threads: row tasks of 24, 24 and 22 rows
        (130, 768, 3072, 2),  # BERT-base's FFN-in: 2.4 MB of weights
        (130, 4096, 2112, 2),
        (300, 1024, 4096, 2),  # BERT-large's FFN-in: the columns order takes several pieces
    ],
)
def test_linear_then_per_token_quantize_in_one_call_is_exact(
    path, dynamic, rows, inputs, outputs, threads
):
    """int8_linear_quantize_rows = quantize_per_token(int8_linear(...)): the same integers,
    scales and outlier channels, bit for bit, on row and column tails, with the dynamic
    epilogue (row scale and float side product) and without, on both paths."""
    _squant_gemm_or_skip()
    g = torch.Generator().manual_seed(rows + outputs)
    x_q = torch.randint(0, 256, (rows, inputs), dtype=torch.uint8, generator=g)
    w_q = torch.randint(-127, 128, (outputs, inputs), dtype=torch.int8, generator=g)
    w_scale = torch.rand(outputs, generator=g) * 1e-3
    bias = torch.randn(outputs, generator=g)
    packed, compensation = int8.pack_weight_blocked(w_q)
    extra = {}
    if dynamic:
        extra = {
            "row_scale": torch.rand(rows, 1, generator=g) + 0.1,
            "side_x": torch.randn(rows, 2, generator=g),
            "side_w": torch.randn(2, outputs, generator=g),
        }
    multiplier = torch.rand(outputs, generator=g) + 0.5
    index = torch.tensor([outputs - 1, 0, 3])
    args = (x_q, packed, compensation, 0.02, 128, w_scale, bias, outputs, "gelu")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = torch.ops.squant.int8_linear(*args, epilogue=path, **extra)
        want = torch.ops.squant.quantize_per_token(y, multiplier, index, path)
        got = {
            order: torch.ops.squant.int8_linear_quantize_rows(
                *args, multiplier=multiplier, side_index=index, path=path, order=order, **extra
            )
            for order in ("auto", "rows", "columns")
        }
    finally:
        torch.set_num_threads(before)
    for order, outputs_of_order in got.items():
        for a, b in zip(outputs_of_order, want, strict=True):
            assert a.shape == b.shape and torch.equal(a, b), order
    got = got["auto"]
    assert got[0].dtype == torch.uint8 and got[2].shape == (rows, 3)
    with pytest.raises(RuntimeError, match=f"side_index {outputs} is out of range"):
        torch.ops.squant.int8_linear_quantize_rows(*args, side_index=torch.tensor([outputs]))
    with pytest.raises(RuntimeError, match="order must be auto, rows or columns"):
        torch.ops.squant.int8_linear_quantize_rows(*args, order="diagonal")


def test_gelu_epilogue_has_no_subnormal_slow_path():
    """Outputs far below zero (GELU -> -0) must not produce subnormal floats, which cost a
    microcode assist per instruction on Intel cores: the AVX512 epilogue's GELU puts every
    |x| past 5.625 in its constant piece (exactly x or 0), as the plain C++ erf rounds them,
    and tanh-GELU's exp clamps its argument."""
    _squant_gemm_or_skip()
    x_q = torch.full((8, 64), 255, dtype=torch.uint8)
    w_q = torch.full((64, 64), -127, dtype=torch.int8)
    w_q[::2] = 127
    packed, compensation = int8.pack_weight_blocked(w_q)
    w_scale = torch.full((64,), 1e-2)
    for act in ("gelu", "gelu_tanh"):
        args = (x_q, packed, compensation, 1.0, 128, w_scale, None, 64, act)
        fast = torch.ops.squant.int8_linear(*args, epilogue="auto")
        slow = torch.ops.squant.int8_linear(*args, epilogue="scalar")
        assert torch.equal(fast[:, ::2], slow[:, ::2])  # large positive: x itself
        assert (fast[:, 1::2] == 0).all() and (slow[:, 1::2] == 0).all()  # large negative: 0
