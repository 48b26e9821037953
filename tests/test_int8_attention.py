"""squant's INT8 attention kernel: every ISA path this CPU runs against a float64 reference
(masks, odd lengths, B > 1, head sizes that are not a multiple of the vector width), the paths
against each other, and the kernel inside quantize, compile, save/load."""

import json
import re

import pytest
import torch

import squant
from squant import kernels
from squant.errors import SquantError
from squant.quant.attention import SQUANT_INT8_ATTENTION, uses_int8_attention
from squant.quant.mappings import hf_config
from squant.runtime.compiler import CompileConfig
from tests.helpers import cosine, last_hidden, tiny_model, token_batches

ALL_PATHS = ("amx", "avx512_vnni", "avx2", "scalar")


def reference(qkv, mask, heads, scaling):
    """softmax(q kᵀ · scaling, padded keys dropped) v in float64; [B, S, H·D]."""
    b, s, w3 = qkv.shape
    d = w3 // 3 // heads
    q, k, v = (t.transpose(1, 2).double() for t in qkv.view(b, s, 3, heads, d).unbind(2))
    scores = q @ k.transpose(-1, -2) * scaling
    if mask is not None:
        keep = mask.bool()
        keep[~keep.any(dim=1)] = True  # a row with no valid key attends to all of them
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1).float()


SHAPES = [  # batch, seq, heads, head_dim
    (1, 128, 12, 32),  # MiniLM
    (2, 515, 2, 24),  # longer than BERT's 512, a head size half a value block wide
    (3, 37, 4, 64),  # odd length, BERT-base head size
    (2, 5, 2, 10),  # head size no vector width divides
    (2, 1, 3, 16),  # one token
]


def random_qkv(shape):
    """A seeded [B, S, 3·H·D] input and its key mask (row 1, when there is one, padded)."""
    b, s, h, d = shape
    g = torch.Generator().manual_seed(sum(shape))
    qkv = torch.randn(b, s, 3 * h * d, generator=g) * 2
    mask = torch.ones(b, s, dtype=torch.long)
    if b > 1:
        mask[1, s // 2 + 1 :] = 0
    return qkv, mask


def check_matches_float(attention, isa, shape, scalar=None):
    """One path against the float64 reference over real tokens (a padded query's output is
    never read) and, given the scalar path's output, against that: the paths compute the same
    integer dot products and differ by float rounding only, which can move a 16-bit
    probability by one step (1/32767) and the output by |v|/32767."""
    qkv, mask = random_qkv(shape)
    h, d = shape[2], shape[3]
    out = attention(qkv, mask, h, d**-0.5, isa)
    keep = mask.bool()
    assert cosine(out[keep], reference(qkv, mask, h, d**-0.5)[keep]) >= 0.9995, isa
    if scalar is not None:
        step = qkv.abs().max().item() / 32767
        torch.testing.assert_close(out, scalar, atol=2 * step, rtol=1e-4, msg=isa)
    return out


def check_flat_and_peaked(attention, isa):
    """P·V runs on 16-bit probabilities: equal probabilities over many keys (each rounded the
    same way) must still average V, and one dominant key must still return its value."""
    b, s, h, d = 1, 515, 2, 16
    qkv = torch.randn(b, s, 3 * h * d, generator=torch.Generator().manual_seed(3))
    flat = qkv.clone()
    flat[..., : h * d] = 0  # q = 0: every score 0, every probability 1/515
    v = flat[..., 2 * h * d :]
    out = attention(flat, None, h, d**-0.5, isa)
    mean = v.mean(dim=1, keepdim=True).expand_as(out)
    torch.testing.assert_close(out, mean, atol=1e-4 * v.abs().max().item(), rtol=0, msg=isa)
    peaked = qkv.clone()
    peaked[..., h * d : 2 * h * d] = 0
    peaked[:, 7, h * d : 2 * h * d] = 1.0
    peaked[..., : h * d] = 40.0  # q·k_7 = 40·16 = 640 · 0.25: key 7 takes all the weight
    out = attention(peaked, None, h, d**-0.5, isa)
    want = peaked[:, 7:8, 2 * h * d :].expand_as(out)
    torch.testing.assert_close(out, want, atol=1e-4 * want.abs().max().item(), rtol=0, msg=isa)


def check_masks(attention, isa):
    """No mask, masked keys, and a row without any valid key (uniform over all, like a
    softmax); padded keys are skipped, so changing them changes nothing."""
    qkv = torch.randn(3, 9, 3 * 2 * 16, generator=torch.Generator().manual_seed(9))
    mask = torch.tensor([[1] * 9, [1] * 4 + [0] * 5, [0] * 9])
    out = attention(qkv, mask, 2, 0.25, isa)
    ref = reference(qkv, mask, 2, 0.25)
    assert cosine(out[:2, :4], ref[:2, :4]) >= 0.9995
    assert cosine(out[2], ref[2]) >= 0.9995
    full = attention(qkv, None, 2, 0.25, isa)
    torch.testing.assert_close(full[0], out[0])
    changed = qkv.clone()
    changed[1, 4:] = 100.0
    again = attention(changed, mask, 2, 0.25, isa)
    torch.testing.assert_close(again[1, :4], out[1, :4])


@pytest.fixture(scope="module")
def paths():
    return kernels.supported_isas()


@pytest.mark.parametrize("shape", SHAPES)
def test_every_path_this_cpu_runs_matches_float(paths, shape):
    attention = torch.ops.squant.int8_attention
    scalar = check_matches_float(attention, "scalar", shape)
    for isa in paths:
        check_matches_float(attention, isa, shape, scalar)


def test_flat_and_peaked_attention_keep_the_values_scale(paths):
    for isa in paths:
        check_flat_and_peaked(torch.ops.squant.int8_attention, isa)


def test_scratch_reused_across_head_sizes(paths):
    """Each thread's heads take their scratch from one arena, emptied per head and grown when a
    head needs more: a head too big for it (values past its first block), then small heads
    again, must each give what they give alone and what the scalar path gives."""
    attention = torch.ops.squant.int8_attention
    small, large = (2, 37, 4, 64), (1, 700, 2, 64)
    for isa in paths:
        first = check_matches_float(attention, isa, small)
        check_matches_float(attention, isa, large, check_matches_float(attention, "scalar", large))
        qkv, mask = random_qkv(small)
        assert torch.equal(attention(qkv, mask, 4, 64**-0.5, isa), first), isa


@pytest.mark.parametrize("shape", [*SHAPES, (2, 200, 3, 48), (1, 300, 2, 128)])
def test_amx_path_equals_the_avx512_vnni_path_bit_for_bit(paths, shape):
    """The AMX path computes P·V as 8-bit digit products whose s32 sums recombine to the
    exact 16-bit sums, and Q·Kᵀ in the same integers: its output must equal the AVX512-VNNI
    path's exactly (padded keys, short row groups, head sizes that are not a multiple of 16
    or 64, a head size of two tile steps)."""
    if "amx" not in paths:
        pytest.skip("this CPU has no AMX-INT8")
    qkv, mask = random_qkv(shape)
    h, d = shape[2], shape[3]
    amx = torch.ops.squant.int8_attention(qkv, mask, h, d**-0.5, "amx")
    vnni = torch.ops.squant.int8_attention(qkv, mask, h, d**-0.5, "avx512_vnni")
    assert torch.equal(amx, vnni)


def test_paths_this_cpu_lacks_are_refused_by_name(paths):
    from squant.hardware import cpu_features

    qkv = torch.randn(1, 4, 3 * 2 * 8)
    cpu = cpu_features()
    host = {
        "amx": cpu.has("amx_int8") and cpu.has("avx512_vnni"),
        "avx512_vnni": cpu.has("avx512_vnni"),
        "avx2": cpu.has("avx2"),
    }
    for isa, present in host.items():
        assert (isa in paths) == present
        if not present:
            with pytest.raises(RuntimeError, match="this CPU has no"):
                torch.ops.squant.int8_attention(qkv, None, 2, 0.35, isa)
    with pytest.raises(RuntimeError, match="unknown isa"):
        torch.ops.squant.int8_attention(qkv, None, 2, 0.35, "sse9")


def test_no_mask_masked_keys_and_a_row_without_keys(paths):
    for isa in paths:
        check_masks(torch.ops.squant.int8_attention, isa)


def test_bf16_input_and_bad_arguments():
    qkv = torch.randn(2, 6, 3 * 2 * 8)
    out = torch.ops.squant.int8_attention(qkv.bfloat16(), None, 2, 0.35)
    assert out.dtype == torch.bfloat16
    assert cosine(out.float(), reference(qkv, None, 2, 0.35)) >= 0.99
    with pytest.raises(RuntimeError, match="3 \\* heads"):
        torch.ops.squant.int8_attention(qkv, None, 5, 0.35)
    with pytest.raises(RuntimeError, match="key_mask"):
        torch.ops.squant.int8_attention(qkv, torch.ones(2, 5), 2, 0.35)


def test_a_missing_compiler_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "_compiler", lambda: None)
    with pytest.raises(SquantError, match="needs a C\\+\\+ compiler"):
        kernels.load_or_build(tmp_path)


@pytest.fixture(scope="module")
def bert_pair():
    model = tiny_model("bert", outliers=True)
    float_config = squant.SmoothQuantConfig(attention="float")
    floating = squant.quantize(model, float_config, token_batches(), progress=False)
    q = squant.quantize(model, squant.SmoothQuantConfig(), token_batches(), progress=False)
    return model, floating, q


def test_int8_attention_is_the_default_and_the_record_states_it(bert_pair):
    _, floating, q = bert_pair
    assert squant.SmoothQuantConfig().attention == "auto"
    assert q.squant_info.config.attention == "int8"  # "auto" resolved, as saved
    assert floating.squant_info.config.attention == "float"


def test_auto_attention_stays_float_with_a_warning_where_the_kernel_cannot_build(monkeypatch):
    from squant.quant.attention import resolve_attention_kind

    def no_compiler() -> None:
        raise SquantError("needs a C++ compiler (g++ or clang++); none was found")

    monkeypatch.setattr(kernels, "load", no_compiler)
    with pytest.warns(UserWarning, match="int8 attention is unavailable.*C\\+\\+ compiler"):
        assert resolve_attention_kind("auto") == "float"
    assert resolve_attention_kind("float") == "float"
    model = tiny_model("bert")
    with pytest.warns(UserWarning, match="int8 attention is unavailable"):
        q = squant.quantize(model, squant.SmoothQuantConfig(), token_batches(), progress=False)
    assert q.squant_info.config.attention == "float" and not uses_int8_attention(q)


def test_quantized_model_runs_int8_attention_close_to_float_attention(bert_pair):
    model, floating, q = bert_pair
    assert uses_int8_attention(q) and not uses_int8_attention(floating)
    inputs = token_batches(n=1, seed=4)[0]
    with torch.no_grad():
        ref, flo, out = (last_hidden(m, inputs) for m in (model, floating, q))
    keep = inputs["attention_mask"].bool()
    assert cosine(out[keep], flo[keep]) >= 0.999
    assert cosine(out[keep], ref[keep]) >= 0.99


@pytest.mark.compile
def test_compiled_int8_attention_calls_the_kernel_and_matches_eager(bert_pair):
    from torch._inductor.utils import run_and_get_code

    _, _, q = bert_pair
    inputs = token_batches(n=1, seed=5)[0]
    compiled = squant.compile(q, CompileConfig(float_dtype="fp32", cpp_wrapper=False))
    out, code = run_and_get_code(lambda: compiled(**inputs))
    code = "\n".join(code)
    # one per layer, in one call with its Q|K|V GEMM where that runs on squant's kernel
    calls = re.findall(r"torch\.ops\.squant\.int8_(?:linear_)?attention\.default\(", code)
    assert len(calls) == 2
    assert "softmax" not in code.lower()  # no float attention left beside it
    assert compiled.describe()["attention_used"] == SQUANT_INT8_ATTENTION
    with torch.no_grad():
        eager = last_hidden(q, inputs)
    keep = inputs["attention_mask"].bool()
    assert cosine(out.last_hidden_state[keep], eager[keep]) >= 0.9999


def test_save_and_load_keep_int8_attention(bert_pair, tmp_path):
    _, _, q = bert_pair
    squant.save(q, tmp_path / "q")
    loaded = squant.load(tmp_path / "q")
    assert loaded.squant_info.config.attention == "int8"
    assert hf_config(loaded)._attn_implementation == SQUANT_INT8_ATTENTION
    inputs = token_batches(n=1, seed=6)[0]
    with torch.no_grad():
        torch.testing.assert_close(last_hidden(loaded, inputs), last_hidden(q, inputs))


def test_pt2_with_int8_attention_ships_the_kernel_and_runs_without_squant(bert_pair, tmp_path):
    import subprocess
    import sys
    import textwrap

    from squant.runtime.export import KERNEL_LIBRARY, load_packaged

    _, _, q = bert_pair
    inputs = token_batches(n=1, seed=3)[0]
    deploy = tmp_path / "deploy"
    squant.export(q, deploy, inputs, config=squant.ExportConfig(float_dtype="fp32"))
    manifest = json.loads((deploy / "manifest.json").read_text())
    assert manifest["kernel_library"]["file"] == KERNEL_LIBRARY
    assert (deploy / KERNEL_LIBRARY).is_file()
    with torch.no_grad():
        expected = last_hidden(q, inputs)
    keep = inputs["attention_mask"].bool()
    got = load_packaged(deploy)(**inputs).last_hidden_state
    assert cosine(got[keep], expected[keep]) >= 0.9999

    torch.save(dict(inputs), tmp_path / "inputs.pt")
    script = textwrap.dedent(
        f"""
        import sys, torch
        torch.ops.load_library({str(deploy / KERNEL_LIBRARY)!r})
        runner = torch._inductor.aoti_load_package({str(deploy / "model.pt2")!r})
        x = torch.load({str(tmp_path / "inputs.pt")!r})
        out = runner(x["input_ids"], x["attention_mask"], torch.zeros_like(x["input_ids"]))
        torch.save(out[0], {str(tmp_path / "out.pt")!r})
        assert "squant" not in sys.modules and "transformers" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    fresh = torch.load(tmp_path / "out.pt")
    assert cosine(fresh[keep], expected[keep]) >= 0.9999

    (deploy / KERNEL_LIBRARY).write_bytes(b"not the exported library")
    with pytest.raises(SquantError, match="changed after export"):
        load_packaged(deploy)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize(("heads", "dim"), [(4, 24), (4, 32)])
def test_qkv_gemm_and_attention_in_one_call_are_exact(paths, batch, dynamic, heads, dim):
    """int8_linear_attention = int8_attention(int8_linear(...).view(B, S, 3·H·D)), bit for
    bit, on every path this CPU runs, with 2 threads: a batch row per thread (each row's
    Q|K|V kept in cache); one batch row split into two head groups (4 x 32: each group's
    Q, K, V columns are whole 64-column GEMM blocks); one row that cannot split (4 x 24:
    GEMM over all threads first); padded keys, the dynamic epilogue (row scale, outlier
    channels) and without."""
    from squant import int8

    if int8.gemm_kernel(64) != "squant":
        pytest.skip("squant's int8 GEMM does not run on this CPU")
    g = torch.Generator().manual_seed(batch)
    seq, inputs = 37, 64
    width = 3 * heads * dim
    x_q = torch.randint(0, 256, (batch * seq, inputs), dtype=torch.uint8, generator=g)
    w_q = torch.randint(-127, 128, (width, inputs), dtype=torch.int8, generator=g)
    w_scale = torch.rand(width, generator=g) * 1e-3
    bias = torch.randn(width, generator=g)
    packed, compensation = int8.pack_weight_blocked(w_q)
    row_scale = side_x = side_w = None
    if dynamic:
        row_scale = torch.rand(batch * seq, 1, generator=g) + 0.1
        side_x = torch.randn(batch * seq, 2, generator=g)
        side_w = torch.randn(2, width, generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, 30:] = 0
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for isa in paths:
            y = torch.ops.squant.int8_linear(
                x_q, packed, compensation, 0.02, 128, w_scale, bias, width,
                row_scale=row_scale, side_x=side_x, side_w=side_w,
            )  # fmt: skip
            want = torch.ops.squant.int8_attention(y.view(batch, seq, width), mask, heads, 0.2, isa)
            got = torch.ops.squant.int8_linear_attention(
                x_q, packed, compensation, 0.02, 128, w_scale, bias, width,
                row_scale, side_x, side_w, mask, batch, heads, 0.2, isa,
            )  # fmt: skip
            assert got.shape == (batch, seq, heads * dim) and torch.equal(got, want), isa
    finally:
        torch.set_num_threads(before)
    with pytest.raises(RuntimeError, match=f"do not split into {batch * seq + 1} batch rows"):
        torch.ops.squant.int8_linear_attention(
            x_q, packed, compensation, 0.02, 128, w_scale, bias, width,
            None, None, None, None, batch * seq + 1, heads, 0.2,
        )  # fmt: skip
