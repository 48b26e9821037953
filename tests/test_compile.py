"""Golden tests of squant.compile: which kernels run, what is fused, and numerics vs eager."""

import dataclasses
import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import squant
from squant import int8
from squant.quant.qlinear import QuantLinear
from squant.runtime.compiler import CompileConfig
from tests.helpers import (
    UNBIASED_GEMM_CALL,
    cosine,
    gelu_gemm_calls,
    int8_gemm_calls,
    last_hidden,
    tiny_model,
    token_batches,
)

LAYERS = 2

pytestmark = pytest.mark.compile


def _compiled_code(model, inputs, config, python_wrapper=True):
    # golden tests read inductor's Python wrapper, which names every kernel call as text; the
    # graph and its kernels are the same under the default C++ wrapper (its own test below)
    if python_wrapper and config.cpp_wrapper:
        config = dataclasses.replace(config, cpp_wrapper=False)
    compiled = squant.compile(model, config)
    out, code = run_and_get_code(lambda: compiled(**inputs))
    return compiled, out, "\n".join(code)


@pytest.fixture(scope="module")
def bert_static():
    model = tiny_model("bert", outliers=True)
    # every GEMM static (the golden test below reads the fully static graph)
    config = squant.SmoothQuantConfig(mode="static", dynamic_sites=())
    q = squant.quantize(model, config, token_batches(), progress=False)
    return model, q


def test_default_static_graph_keeps_every_gemm_int8():
    """The default static config quantizes attn_out and FFN-out per token: still one int8
    GEMM per linear, no float GEMM, GELU still in the (static) FFN-in epilogue."""
    model = tiny_model("bert", outliers=True)
    q = squant.quantize(model, squant.SmoothQuantConfig(), token_batches(), progress=False)
    inputs = token_batches(n=1, seed=4)[0]
    _, _, code = _compiled_code(q, inputs, CompileConfig(float_dtype="fp32"))
    assert len(int8_gemm_calls(code)) == 4 * LAYERS
    float_gemms = re.findall(r"(extern_kernels\.(?:mm|addmm)|mkldnn\._linear_pointwise)\(", code)
    assert len(float_gemms) <= 1
    assert len(gelu_gemm_calls(code)) == LAYERS


@pytest.mark.parametrize("float_dtype", ["fp32", "bf16"])
def test_static_graph_runs_only_int8_gemms_with_fused_quantize(bert_static, float_dtype):
    _, q = bert_static
    inputs = token_batches(n=1, seed=4)[0]
    _, _, code = _compiled_code(q, inputs, CompileConfig(float_dtype=float_dtype))
    calls = int8_gemm_calls(code)
    assert len(calls) == 4 * LAYERS  # fused QKV, attn out, FFN in, FFN out per layer
    # no float GEMM for any quantized linear: the only float linear left is the pooler (one
    # row per sequence, kept in float on purpose), which inductor may also inline
    float_gemms = re.findall(r"(extern_kernels\.(?:mm|addmm)|mkldnn\._linear_pointwise)\(", code)
    assert len(float_gemms) <= 1
    # dequant scale and bias run inside the int8 GEMM: every call gets a bias tensor
    assert "'none', [None]" in code or "squant.int8_linear" in code
    assert not re.search(UNBIASED_GEMM_CALL, code)
    # GELU runs in the FFN-in GEMM's epilogue, nowhere else
    assert len(gelu_gemm_calls(code)) == LAYERS
    kernels = set(re.findall(r"cpp_fused_\w+", code))
    assert not {k for k in kernels if "gelu" in k}
    # every activation-quantize step is fused into the kernel that produces its input
    # (LayerNorm + residual add -> quantize, attention context -> quantize) except the FFN-out
    # input: the GEMM before it ends with GELU, and the per-channel smoothing must follow it
    assert {k for k in kernels if "layer_norm" in k and "round" in k}
    quant_only = [
        k for k in kernels if "round" in k and not re.search("layer_norm|transpose|clone|view", k)
    ]
    assert len(quant_only) == LAYERS


def test_no_graph_breaks(bert_static):
    _, q = bert_static
    inputs = token_batches(n=1, seed=4)[0]
    with torch._inductor.config.patch(freezing=True), torch.no_grad():
        explanation = torch._dynamo.explain(q)(**inputs)
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1


@pytest.mark.parametrize(("float_dtype", "min_cos"), [("fp32", 0.9999), ("bf16", 0.999)])
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_compiled_matches_eager(mode, float_dtype, min_cos):
    model = tiny_model("distilbert", "sequence-classification", outliers=True)
    q = squant.quantize(model, squant.SmoothQuantConfig(mode=mode), token_batches(), progress=False)
    inputs = token_batches(n=1, seed=6)[0]
    compiled = squant.compile(q, CompileConfig(float_dtype=float_dtype), inputs)
    with torch.no_grad():
        ref, out = q(**inputs).logits, compiled(**inputs).logits
    assert out.dtype == torch.float32  # outputs come back as float32 whatever runs inside
    assert cosine(ref, out) > min_cos
    assert compiled.check_cosine > min_cos
    hidden = last_hidden(compiled.model, inputs)  # the compiled-from module still runs eagerly
    assert hidden.shape[-1] == 64


def test_compile_does_not_touch_inputs_or_the_source_model(bert_static):
    _, q = bert_static
    inputs = token_batches(n=1, seed=8)[0]
    kept = {k: v.clone() for k, v in inputs.items()}
    before = {k: v.clone() for k, v in q.state_dict().items()}
    compiled = squant.compile(q, CompileConfig(float_dtype="bf16"), inputs)
    first = compiled(**inputs).last_hidden_state
    second = compiled(**inputs).last_hidden_state
    assert all(torch.equal(inputs[k], kept[k]) for k in kept)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    assert all(torch.equal(before[k], v) for k, v in q.state_dict().items())
    assert next(q.parameters()).dtype == torch.float32


def test_compile_refuses_a_model_that_disagrees_with_eager(bert_static):
    _, q = bert_static
    inputs = token_batches(n=1, seed=8)[0]
    # bf16 float parts cannot reproduce the float32 eager output bit for bit
    with pytest.raises(squant.SquantError, match="disagrees"):
        squant.compile(q, CompileConfig(float_dtype="bf16", min_cosine=1.0), inputs)


def test_auto_float_parts_of_an_int8_model_are_fp32_without_a_bf16_attempt(
    bert_static, monkeypatch
):
    """On a CPU with native BF16, "auto" gives an INT8 model FP32 float parts at once: BF16
    parts bought no speed there and were refused by the guard on real weights. One compile,
    one check, no warning; a float model on the same CPU still gets BF16 parts."""
    import types
    import warnings

    import squant.runtime.compiler as compiler

    model, q = bert_static
    inputs = token_batches(n=1, seed=8)[0]
    monkeypatch.setattr(compiler, "cpu_features", lambda: types.SimpleNamespace(native_bf16=True))
    real_agreement, calls = compiler.agreement, []

    def counted(reference, output, mask):
        calls.append(real_agreement(reference, output, mask))
        return calls[-1]

    monkeypatch.setattr(compiler, "agreement", counted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        compiled = squant.compile(q, CompileConfig(), inputs)
    assert compiled.float_dtype == torch.float32
    assert "refused_float" not in compiled.describe()["selection"]
    assert len(calls) == 2  # the noise floor's check and the one compiled candidate's
    assert CompileConfig().resolved_dtype(q) == torch.float32
    assert CompileConfig().resolved_dtype(model) == torch.bfloat16
    assert CompileConfig(float_dtype="bf16").resolved_dtype(q) == torch.bfloat16


def test_auto_float_parts_fall_back_to_fp32_when_bf16_disagrees(bert_static, monkeypatch):
    """A float model's BF16 parts that disagree with eager: "auto" falls back to FP32 float
    parts. The first check (BF16) is made to fail here, whatever the CPU, so the fallback
    path runs."""
    import types

    import squant.runtime.compiler as compiler

    q, _ = bert_static  # the float model
    inputs = token_batches(n=1, seed=8)[0]
    monkeypatch.setattr(compiler, "cpu_features", lambda: types.SimpleNamespace(native_bf16=True))
    real_agreement, calls = compiler.agreement, []

    def first_check_fails(reference, output, mask):
        calls.append(real_agreement(reference, output, mask))
        return 0.5 if len(calls) == 1 else calls[-1]

    monkeypatch.setattr(compiler, "agreement", first_check_fails)
    monkeypatch.setattr(compiler, "noise_floor", lambda *args: 1.0)  # the guard at min_cosine
    with pytest.warns(UserWarning, match="compiling with FP32 float parts"):
        compiled = squant.compile(q, CompileConfig(), inputs)
    assert compiled.float_dtype == torch.float32
    assert len(calls) == 2
    info = compiled.describe()
    assert info["selection"]["refused_float"]["bf16"]["gemm:onednn"]["cosine"] == 0.5
    assert info["selection"]["gemm:onednn"]["status"] == "ok"
    assert compiled.check_cosine == calls[1] > 0.9999
    # an explicit dtype is never swapped for another: refused outright
    calls.clear()
    with pytest.raises(squant.SquantError, match="Try float_dtype='fp32'"):
        squant.compile(q, CompileConfig(float_dtype="bf16"), inputs)


def test_compile_leaves_global_inductor_config_alone(bert_static):
    _, q = bert_static
    before = torch._inductor.config.freezing
    squant.compile(q, CompileConfig(), token_batches(n=1)[0])
    assert torch._inductor.config.freezing == before


def test_compile_config_validation():
    with pytest.raises(squant.SquantError, match="float_dtype"):
        CompileConfig(float_dtype="fp16")
    with pytest.raises(squant.SquantError, match="min_cosine"):
        CompileConfig(min_cosine=0.0)


def test_attention_is_chosen_by_measurement(bert_static):
    """A model quantized with float attention: compile times squant's and sdpa's."""
    model, _ = bert_static
    config = squant.SmoothQuantConfig(mode="static", attention="float")
    q = squant.quantize(model, config, token_batches(), progress=False)
    compiled = squant.compile(q, CompileConfig(attention="auto"), token_batches(n=1)[0])
    info = compiled.describe()
    assert set(info["selection"]["attention_ms"]) == {"squant", "sdpa"}
    timings = info["selection"]["attention_ms"]
    assert info["attention_used"] == min(timings, key=timings.get)
    assert info["selection"]["gemm:onednn"]["status"] == "ok"


def test_the_guard_reads_real_tokens_not_padding():
    from squant.runtime.compiler import agreement

    torch.manual_seed(0)
    ref = torch.randn(2, 6, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    out = ref.clone()
    out[1, 3:] = 100 * torch.randn(3, 8)  # padding positions: values nobody reads
    assert agreement(ref, out, mask) == pytest.approx(1.0, abs=1e-6)
    assert agreement(ref, out, None) < 0.5  # what the old, flattened guard saw
    out[0, 0] = -ref[0, 0]  # a real token that disagrees still counts
    assert agreement(ref, out, mask) < 0.99
    logits = torch.randn(2, 3)  # per-sequence outputs are compared whole
    assert agreement(logits, logits, mask) == pytest.approx(1.0, abs=1e-6)


def test_cpp_wrapper_calls_the_int8_kernels_from_cpp_and_runs_in_two_threads(bert_static):
    """cpp_wrapper=True: the generated wrapper is C++ (the int8 GEMMs are called from it,
    through the AOTI C shim or the dispatcher, not torch.ops from Python), outputs match eager,
    and two threads calling the one compiled model at once each get their own right answer."""
    import threading

    _, q = bert_static
    inputs = token_batches(n=1, seed=4)[0]
    config = CompileConfig(float_dtype="fp32", cpp_wrapper=True)
    assert CompileConfig().cpp_wrapper  # the default
    compiled, out, code = _compiled_code(q, inputs, config, python_wrapper=False)
    assert not int8_gemm_calls(code)  # not from Python
    from_cpp = re.findall(
        r'aoti_torch_cpu__qlinear_pointwise\w*\(|findSchemaOrThrow\("squant::int8_linear\w*"',
        code,
    )
    assert len(from_cpp) >= 4 * LAYERS
    # the wrapper is built apart from the kernels (at -O1): its -O3 build with them was most
    # of a big model's compile time
    assert re.search(r"^kernel_src = \($", code, re.M)
    with torch.no_grad():
        ref = q(**inputs).last_hidden_state
    assert cosine(ref, out.last_hidden_state) > 0.9999
    others = token_batches(n=2, seed=9)  # same shape, different tokens per thread
    results: dict[int, torch.Tensor] = {}

    def call(i: int) -> None:
        with torch.no_grad():
            for _ in range(3):
                results[i] = compiled(**others[i]).last_hidden_state

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for i in range(2):
        with torch.no_grad():
            expected = compiled(**others[i]).last_hidden_state
        torch.testing.assert_close(results[i], expected, rtol=0, atol=0)


class _Sensitive(torch.nn.Module):
    """An embedding and sin(gain · x): gain 1 is a smooth model, gain 1e7 one where a change of
    a few float32 ulps moves the output as far as quantization roundings that flip do."""

    def __init__(self, gain: float):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.gain = gain

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, attention_mask=None):
        return (torch.sin(self.embed(input_ids) * self.gain),)


def test_the_noise_floor_measures_how_far_rounding_moves_eager():
    from squant.runtime.compiler import noise_floor

    torch.manual_seed(0)
    inputs = {"input_ids": torch.randint(0, 50, (2, 64)), "attention_mask": torch.ones(2, 64)}
    smooth, sensitive = _Sensitive(1.0), _Sensitive(1e7)
    sensitive.embed.load_state_dict(smooth.embed.state_dict())
    with torch.no_grad():
        floors = {m: noise_floor(m, inputs, m(**inputs)[0]) for m in (smooth, sensitive)}
    assert floors[smooth] > 0.99999  # float rounding alone: no visible change
    assert floors[sensitive] < 0.9  # the same change, amplified
    assert noise_floor(torch.nn.Identity(), inputs, torch.ones(1)) == 1.0  # no embeddings


def test_compile_records_the_guard_it_applied(bert_static):
    _, q = bert_static
    inputs = token_batches(n=1, seed=8)[0]
    compiled = squant.compile(q, CompileConfig(float_dtype="fp32"), inputs)
    floor, applied = compiled.selection["noise_floor"], compiled.selection["min_cosine"]
    assert applied == min(CompileConfig().min_cosine, floor)
    assert compiled.check_cosine is not None and compiled.check_cosine >= applied


@pytest.fixture
def onednn_gemm(monkeypatch):
    """QuantLinear on oneDNN's qlinear (the kernel where squant's own does not run)."""
    monkeypatch.setenv(int8.GEMM_ENV, "onednn")


@pytest.fixture
def squant_gemm():
    if int8.gemm_kernel(64) != "squant":
        pytest.skip("squant's int8 GEMM does not run on this CPU")


def test_outlier_share_fuses_along_the_output_channels(onednn_gemm):
    """oneDNN GEMM: the float outlier channels' share (FFN-out, static default) joins the
    residual + LayerNorm kernel vectorized over output channels: no tile transposes, no
    gathers per token (laid out the other way, that kernel took 3x as long on MiniLM at
    8 x 128)."""
    model = tiny_model("bert", outliers=True)
    q = squant.quantize(model, squant.SmoothQuantConfig(), token_batches(), progress=False)
    assert any(m.outlier_index is not None for m in q.modules() if hasattr(m, "outlier_index"))
    inputs = token_batches(n=1, seed=4)[0]
    _, _, code = _compiled_code(q, inputs, CompileConfig(float_dtype="fp32"))
    kernels = re.findall(r"(cpp_fused_\w*index_select\w*) = async_compile\.cpp_pybinding", code)
    assert len(kernels) == LAYERS
    for name in kernels:
        body = code.split(f"{name} = async_compile.cpp_pybinding")[1].split("''')")[0]
        assert "transpose_mxn" not in body
        assert "tmpbuf" not in body  # the per-lane gather inductor emits for strided loads


def test_guards_on_the_frozen_model_are_dropped_and_those_on_the_call_kept():
    from torch._dynamo.source import (
        AttrSource,
        DictGetItemSource,
        GlobalSource,
        LocalSource,
    )

    from squant.runtime.guards import guards_on_frozen_model

    model = LocalSource("self", is_input=True)
    kwargs = LocalSource("kwargs", is_input=True, is_varkw=True)
    assert guards_on_frozen_model(AttrSource(AttrSource(model, "config"), "is_causal"))
    assert guards_on_frozen_model(GlobalSource("__import_squant_dot_quant_dot_int8"))
    assert guards_on_frozen_model(LocalSource("func", is_derefed_cell_contents=True))
    assert not guards_on_frozen_model(DictGetItemSource(kwargs, "input_ids"))
    assert not guards_on_frozen_model(LocalSource("hidden_states"))  # a resumed frame's local
    assert not guards_on_frozen_model(None)  # global state (grad mode, ...)


def test_compiled_model_checks_only_its_call_arguments_and_still_follows_them(
    bert_static, monkeypatch
):
    """The compiled model drops dynamo's guards on itself (frozen) but a new sequence length
    and a new keyword still get a graph of their own, with the right outputs."""
    import squant.runtime.compiler as compiler_module
    from squant.runtime.guards import keep_call_guards

    seen: list[tuple[str, bool]] = []

    def recording(entries):
        keep = keep_call_guards(entries)
        seen.extend((e.guard_type, k) for e, k in zip(entries, keep, strict=True))
        return keep

    monkeypatch.setattr(compiler_module, "keep_call_guards", recording)
    _, q = bert_static
    compiled = squant.compile(q, CompileConfig(float_dtype="fp32"))
    short, longer = token_batches(n=1, seed=4)[0], token_batches(n=1, seed=5, seq=20)[0]
    assert short["input_ids"].shape != longer["input_ids"].shape
    for inputs in (short, longer, short):
        with torch.no_grad():
            ref = q(**inputs).last_hidden_state
        assert cosine(ref, compiled(**inputs).last_hidden_state) > 0.9999
    with torch.no_grad():
        out = compiled(**short, output_hidden_states=True)
    assert out.hidden_states is not None and len(out.hidden_states) == LAYERS + 1
    dropped = [kind for kind, kept in seen if not kept]
    assert len(dropped) > 10 * len([1 for _, kept in seen if kept])  # most guards were on it
    assert ("TENSOR_MATCH", True) in seen  # the inputs' shapes are still checked
    assert ("GRAD_MODE", True) in seen


def test_two_compiled_copies_of_one_architecture_answer_with_their_own_weights():
    """Both models' graphs live on the one forward code of their class: each must still run
    its own frozen weights (the guard on which model is calling stays)."""
    inputs = token_batches(n=1, seed=4)[0]
    compiled, references = [], []
    for seed in (0, 1):
        model = tiny_model("bert", seed=seed, outliers=True)
        q = squant.quantize(model, squant.SmoothQuantConfig(), token_batches(), progress=False)
        with torch.no_grad():
            references.append(q(**inputs).last_hidden_state)
        compiled.append(squant.compile(q, CompileConfig(float_dtype="fp32")))
    assert cosine(references[0], references[1]) < 0.99  # two different models
    for _ in range(2):
        for model, reference in zip(compiled, references, strict=True):
            assert cosine(reference, model(**inputs).last_hidden_state) > 0.9999


def test_dynamic_gelu_runs_once_per_element(onednn_gemm):
    """oneDNN GEMM, dynamic FFN-in: the GELU after the per-token dequant is computed once and
    stored, not recomputed by each kernel that reads it (the FFN-out input's absmax, its
    quantization, its outlier channels): one vectorized erf in one kernel per layer, no
    scalar erf."""
    model = tiny_model("bert", outliers=True)
    config = squant.SmoothQuantConfig(mode="dynamic")
    q = squant.quantize(model, config, token_batches(), progress=False)
    inputs = token_batches(n=1, seed=4)[0]
    _, out, code = _compiled_code(q, inputs, CompileConfig(float_dtype="fp32"))
    kernels = re.split(r"async_compile\.cpp_pybinding\(", code)
    erfs = [k.count(".erf()") for k in kernels]
    assert sorted(e for e in erfs if e) == [1] * LAYERS
    assert "std::erf" not in code
    with torch.no_grad():
        assert cosine(q(**inputs).last_hidden_state, out.last_hidden_state) > 0.9999


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_squant_gemm_takes_the_whole_epilogue(squant_gemm, mode):
    """squant's GEMM: each quantized linear is one call whose epilogue applies the per-token
    scale (dynamic), bias, the float outlier channels' share and GELU. Inductor's kernels
    compute no erf and no outlier sum; each layer with outlier channels hands the GEMM its
    float side input."""
    model = tiny_model("bert", outliers=True)
    config = squant.SmoothQuantConfig(mode=mode, outlier_sites=("qkv", "ffn_in", "ffn_out"))
    q = squant.quantize(model, config, token_batches(), progress=False)
    linears = [m for m in q.modules() if isinstance(m, QuantLinear)]
    with_outliers = sum(1 for m in linears if m.outliers)
    per_token = sum(1 for m in linears if m.mode == "dynamic")  # static's default: 2 per layer
    assert with_outliers >= LAYERS and per_token >= 2 * LAYERS
    inputs = token_batches(n=1, seed=4)[0]
    _, out, code = _compiled_code(q, inputs, CompileConfig(float_dtype="fp32"))
    calls = re.findall(r"torch\.ops\.squant\.int8_linear\.default\(([^\n]*)\)", code)
    # the FFN-in GEMM, whose output only feeds the FFN-out's per-token quantize, does both;
    # the Q|K|V GEMM runs in one call with the attention
    fused = re.findall(r"torch\.ops\.squant\.int8_linear_quantize_rows\.default\(([^\n]*)\)", code)
    qkv = re.findall(r"torch\.ops\.squant\.int8_linear_attention\.default\(([^\n]*)\)", code)
    assert len(calls) == 2 * LAYERS and len(fused) == LAYERS and len(qkv) == LAYERS
    assert not re.findall(r"onednn\.qlinear_pointwise", code)
    assert ".erf()" not in code and "std::erf" not in code
    assert len(gelu_gemm_calls(code)) == LAYERS
    # row_scale, side_x, side_w: the last three arguments before `epilogue` (inductor names
    # the trailing ones when they are None: "side_x=None"); the fused ops' 10th to 12th and
    # 9th to 11th
    tails = (
        [
            [a.split("=")[-1] for a in re.split(r",\s*", c.split(", epilogue=")[0])[-3:]]
            for c in calls
        ]
        + [re.split(r",\s*", c)[9:12] for c in fused]
        + [re.split(r",\s*", c)[8:11] for c in qkv]
    )
    assert sum(1 for t in tails if t[1] != "None" and t[2] != "None") == with_outliers
    assert sum(1 for t in tails if t[0] != "None") == per_token
    with torch.no_grad():
        assert cosine(q(**inputs).last_hidden_state, out.last_hidden_state) > 0.9999


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_ffn_gemm_and_the_next_quantize_fuse_without_changing_outputs(
    squant_gemm, mode, monkeypatch
):
    """The default configs: each layer's FFN-in GEMM (+ GELU) and the FFN-out's per-token
    quantize of its output run as one call, and so do its Q|K|V GEMM and the INT8 attention
    (squant.runtime.fusion); the compiled model's outputs are bit-identical to the same
    compile without the rewrites (the LayerNorm rewrite, which is not, off in both)."""
    from squant.runtime import fusion

    monkeypatch.setattr(fusion, "fuse_layer_norm_quantize", lambda graph: 0)
    monkeypatch.setattr(fusion.SquantFusions, "uuid", lambda self: "no-layer-norm")
    model = tiny_model("bert", outliers=True)
    config = squant.SmoothQuantConfig(mode=mode)
    q = squant.quantize(model, config, token_batches(), progress=False)
    inputs = token_batches(n=1, seed=4)[0]
    _, out, code = _compiled_code(q, inputs, CompileConfig(float_dtype="fp32"))
    assert len(re.findall(r"squant\.int8_linear_quantize_rows\.default\(", code)) == LAYERS
    assert len(re.findall(r"squant\.int8_linear_attention\.default\(", code)) == LAYERS
    assert "squant.int8_attention.default(" not in code
    # the rewrite off (a new uuid, so inductor's cache cannot hand back the fused graph)
    monkeypatch.setattr(fusion.SquantFusions, "__call__", lambda self, graph: None)
    monkeypatch.setattr(fusion.SquantFusions, "uuid", lambda self: "off")
    _, plain, plain_code = _compiled_code(q, inputs, CompileConfig(float_dtype="fp32"))
    assert "int8_linear_quantize_rows" not in plain_code
    assert "int8_linear_attention" not in plain_code
    quantizes = r"squant\.quantize_per_token\.default\("
    assert len(re.findall(quantizes, plain_code)) == len(re.findall(quantizes, code)) + LAYERS
    assert torch.equal(out.last_hidden_state, plain.last_hidden_state)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_residual_layer_norm_and_the_next_quantize_run_as_one_call(mode, monkeypatch):
    """Each LayerNorm that feeds an int8 GEMM (two per layer but the last) is one
    add_layer_norm_quantize(_rows) call with its residual add and the GEMM's input quantize:
    no inductor LayerNorm kernel feeds a GEMM, the separate per-token quantize of the Q|K|V
    and FFN-in inputs is gone, and the outputs match the compile without the rewrite to float
    rounding."""
    from squant import kernels
    from squant.runtime import fusion

    kernels.load()
    if not torch.ops.squant.layer_norm_vectorized():
        pytest.skip("the rewrite runs only where the CPU has AVX512")
    model = tiny_model("bert", outliers=True)
    q = squant.quantize(model, squant.SmoothQuantConfig(mode=mode), token_batches(), progress=False)
    inputs = token_batches(n=1, seed=4)[0]
    _, out, code = _compiled_code(q, inputs, CompileConfig(float_dtype="fp32"))
    name = "add_layer_norm_quantize_rows" if mode == "dynamic" else "add_layer_norm_quantize"
    assert len(re.findall(rf"squant\.{name}\.default\(", code)) == 2 * LAYERS - 1
    # inductor keeps the embeddings' LayerNorm and the last one (it feeds no GEMM)
    assert len(set(re.findall(r"cpp_fused\w*native_layer_norm\w*", code))) == 2
    monkeypatch.setattr(fusion, "fuse_layer_norm_quantize", lambda graph: 0)
    monkeypatch.setattr(fusion.SquantFusions, "uuid", lambda self: "no-layer-norm")
    _, plain, plain_code = _compiled_code(q, inputs, CompileConfig(float_dtype="fp32"))
    assert "add_layer_norm_quantize" not in plain_code
    quantizes = r"squant\.quantize_per_token\.default\("
    fused_away = 2 * LAYERS - 1 if mode == "dynamic" else 0
    assert len(re.findall(quantizes, plain_code)) == len(re.findall(quantizes, code)) + fused_away
    assert cosine(plain.last_hidden_state, out.last_hidden_state) > 0.99999


def test_inductor_cache_key_follows_the_kernel_sources(monkeypatch):
    """A compiled graph's C++ wrapper calls each squant op with the argument list of the
    schema it was generated for: a kernel build whose sources (and so maybe schemas) changed
    must not be handed an old cached graph, so the rewrite pass's cache key covers them."""
    from squant.runtime import fusion

    before = fusion.SQUANT_FUSIONS.uuid()
    assert fusion.SQUANT_FUSIONS.uuid() == before
    monkeypatch.setattr(fusion, "build_key", lambda: "other-kernel-sources")
    assert fusion.SQUANT_FUSIONS.uuid() != before
