"""Roofline formulas against hand-computed values, incl. the paper's BERT-large shapes."""

import json

import pytest

from squant import analyze
from squant.bench.hotspots import breakdown, categorize
from squant.bench.peaks import Peaks, theoretical_peaks
from squant.bench.roofline import (
    Gemm,
    arithmetic_intensity,
    attainable,
    balance_point,
    encoder_gemms,
    gemm_bytes,
    gemm_flops,
    linear_block_seconds,
    roofline_seconds,
    speedup_ceiling,
)
from squant.hardware import CpuFeatures


def test_paper_bert_large_arithmetic_intensity():
    # paper, 256 x 1024 x 1024: FP32 85.33, BF16 146.29, INT8 227.56 ops/byte
    assert arithmetic_intensity(256, 1024, 1024, "fp32") == pytest.approx(85.33, abs=0.005)
    assert arithmetic_intensity(256, 1024, 1024, "bf16") == pytest.approx(146.29, abs=0.005)
    assert arithmetic_intensity(256, 1024, 1024, "int8") == pytest.approx(227.56, abs=0.005)


def test_flops_bytes_and_roofline_by_hand():
    assert gemm_flops(2, 3, 4) == 48
    assert gemm_bytes(2, 3, 4, "bf16") == (6 + 12) * 2 + 8 * 4
    assert balance_point(1e12, 1e11) == 10.0
    # memory bound: 1e9 bytes at 1e10 B/s = 0.1 s beats 1e9 ops at 1e12 = 1 ms
    assert roofline_seconds(1e9, 1e9, 1e12, 1e10) == pytest.approx(0.1)
    assert roofline_seconds(1e12, 1e3, 1e12, 1e10) == pytest.approx(1.0)
    assert attainable(5.0, 1e12, 1e11) == 5e11
    assert attainable(50.0, 1e12, 1e11) == 1e12


def test_encoder_gemm_inventory_bert_large():
    gemms = {g.name: g for g in encoder_gemms(1, 256, 1024, 4096, 16, 24)}
    assert (gemms["Q/K/V projection"].count, gemms["Q/K/V projection"].k) == (72, 1024)
    assert (gemms["FFN in"].m, gemms["FFN in"].k, gemms["FFN in"].n) == (256, 1024, 4096)
    assert gemms["attention scores QK^T"].count == 16 * 24
    assert (gemms["attention context PV"].k, gemms["attention context PV"].n) == (256, 64)
    total = sum(g.count * g.flops for g in gemms.values() if g.weights)
    assert total == 24 * 2 * 256 * (4 * 1024 * 1024 + 2 * 1024 * 4096)


def test_speedup_ceiling_is_amdahl():
    gemms = [Gemm("g", 1024, 1024, 1024)]
    peaks = {"fp32": 1e11, "bf16": 4e11, "int8": 8e11}
    bw = 1e15  # compute bound
    assert speedup_ceiling(gemms, peaks, bw, "int8", "bf16") == pytest.approx(2.0)
    t_bf16 = linear_block_seconds(gemms, "bf16", peaks["bf16"], bw)
    # a fixed non-GEMM part as long as the BF16 GEMMs caps the gain at (1+1)/(0.5+1)
    assert speedup_ceiling(gemms, peaks, bw, "int8", "bf16", other_seconds=t_bf16) == pytest.approx(
        4 / 3
    )


def test_theoretical_peaks_from_isa_clock_cores():
    cpu = CpuFeatures("x", 2, 2, 1, ((0, 1),), ("avx512f", "avx512_vnni", "avx512_bf16"))
    peaks = theoretical_peaks(cpu, threads=2, ghz=2.5)
    assert peaks["fp32"] == 64 * 2.5e9 * 2
    assert peaks["bf16"] == 128 * 2.5e9 * 2
    assert peaks["int8"] == 256 * 2.5e9 * 2
    assert theoretical_peaks(cpu, 2, None)["int8"] is None


def _peaks():
    return Peaks(
        threads=2,
        gemm_ops_per_s={"fp32": 2e11, "bf16": 4e11, "int8": 8e11},
        bandwidth_bytes_per_s=2e10,
        theoretical_ops_per_s={"fp32": 3.2e11, "bf16": 6.4e11, "int8": 1.28e12},
        clock_ghz=2.5,
        gemm_shape=(1024, 4096, 4096),
    )


def test_realized_vs_ceiling_from_a_recorded_bench_json(tmp_path):
    gemms = encoder_gemms(1, 256, 768, 3072, 12, 6)
    record = {
        "results": {
            "distilbert-base-uncased": {
                "bf16-compiled": {"median_ms": 64.0},
                "squant-static": {"median_ms": 40.0},
                "openvino-int8": {"median_ms": 35.0},  # not ours: no dtype, skipped
                "pt2e-static": {"error": "boom"},
            }
        }
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(record))
    bench = analyze.read_bench(path)
    rows = analyze.realized_vs_ceiling(bench, gemms, _peaks())
    assert [r[0] for r in rows] == ["bf16-compiled", "squant-static"]
    bound_int8 = 1e3 * linear_block_seconds(gemms, "int8", 8e11, 2e10)
    assert rows[1][3] == f"{bound_int8:.1f}"
    assert rows[1][4] == f"{100 * bound_int8 / 40.0:.0f}%"


def test_tables_have_a_row_per_item():
    gemms = encoder_gemms(1, 256, 1024, 4096, 16, 24)
    assert len(analyze.gemm_table(gemms)) == 6
    assert len(analyze.roofline_table(gemms, _peaks())) == 4
    assert [r[0] for r in analyze.peaks_table(_peaks())] == ["fp32", "bf16", "int8"]
    c = analyze.ceilings(gemms, _peaks(), other_ms=10.0)
    assert c["int8_vs_bf16_linear"] > c["int8_vs_bf16_end_to_end"] > 1.0


def test_hotspot_categories():
    assert categorize("onednn::qlinear_pointwise") == "linear"
    assert categorize("squant::int8_linear") == "linear"
    assert categorize("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert categorize("graph_0_cpp_fused__softmax__to_copy_add_3") == "attention"
    assert categorize("squant::int8_attention") == "attention"
    assert categorize("squant::int8_linear_attention") == "attention"
    assert categorize("squant::int8_linear_quantize_rows") == "linear"
    assert categorize("graph_0_cpp_fused_add_native_layer_norm_round_5") == "layernorm"
    assert categorize("## Call CompiledFxGraph None ##") == "other"
    pct = breakdown({"onednn::qlinear_pointwise": 60.0, "aten::bmm": 30.0, "aten::view": 10.0})
    assert pct == {"linear": 60.0, "attention": 30.0, "layernorm": 0.0, "other": 10.0}
