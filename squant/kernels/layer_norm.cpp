// Residual add + LayerNorm + the next GEMM's input quantization, one pass over each row:
//   v = x + residual;  y = (v - mean(v)) / sqrt(var(v) + eps) · weight + bias   (float32 out)
//   static:    q = clamp(round_half_even(y · multiplier) + zero_point, 0, 255)    (u8)
//   per token: q, scale, side = quantize_per_token(y, multiplier, side_index)    (its integers)
// A post-LayerNorm encoder layer runs this twice (after attention and after the FFN), each
// time feeding an int8 GEMM. Inductor's kernel for the same graph makes three passes over the
// rows (sum, squared deviations, normalize + quantize), each its own parallel loop with a
// barrier, plus a one-thread step between the first two. Here each row is read once from
// memory, its other passes run on the row while it sits in L1, and one parallel loop covers
// all rows: 256 x 768 with the static quantize on an AMX Xeon, called alone from Python, 40 vs
// 73-74 us with 2 threads, 97-101 vs 179-181 us with one.
//
// The statistics are the two-pass ones inductor computes (mean, then the mean squared
// deviation from it), in float32 with 16 partial sums per pass; only the summation order
// differs, so outputs agree with inductor's to float rounding. The per-token variant calls
// quantize_per_token's row arithmetic on the row it normalized, so its integers are exactly
// that op's on this op's float output.
// Paths: AVX512 (chosen at run time by cpuid) and plain C++; the compile rewrite that calls
// this op only does so where the AVX512 path runs (see layer_norm_vectorized).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "internal.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

namespace squant_kernels {
namespace {

constexpr const char* kOp = "squant::add_layer_norm_quantize";

// Mean and 1 / sqrt(var + eps) of v[0, H), and v = x + r written to out (r may be null).
float row_stats_scalar(const float* x, const float* r, int64_t H, double eps, float* out,
                       float* rstd) {
  float sum = 0.f;
  for (int64_t k = 0; k < H; ++k) {
    out[k] = r ? x[k] + r[k] : x[k];
    sum += out[k];
  }
  const float mean = sum / static_cast<float>(H);
  float ss = 0.f;
  for (int64_t k = 0; k < H; ++k) ss += (out[k] - mean) * (out[k] - mean);
  *rstd = 1.f / std::sqrt(ss / static_cast<float>(H) + static_cast<float>(eps));
  return mean;
}

// out = (out - mean) · rstd · w + b in place; then the static u8 (when q is given).
void normalize_scalar(float* out, int64_t H, float mean, float rstd, const float* w,
                      const float* b, const float* mult, float zp, uint8_t* q) {
  for (int64_t k = 0; k < H; ++k) {
    const float y = (out[k] - mean) * rstd * w[k] + (b ? b[k] : 0.f);
    out[k] = y;
    if (q) q[k] = static_cast<uint8_t>(std::min(255.f, std::max(0.f, std::nearbyint(y * mult[k]) + zp)));
  }
}

SQ_AVX512 float row_stats_avx512(const float* x, const float* r, int64_t H, double eps,
                                    float* out, float* rstd) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k = 0; k < H; k += 16) {
    const __mmask16 m = tail_mask(H - k);
    __m512 v = _mm512_maskz_loadu_ps(m, x + k);
    if (r) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, r + k));
    _mm512_mask_storeu_ps(out + k, m, v);
    acc = _mm512_add_ps(acc, v);
  }
  const float mean = _mm512_reduce_add_ps(acc) / static_cast<float>(H);
  const __m512 vmean = _mm512_set1_ps(mean);
  acc = _mm512_setzero_ps();
  for (int64_t k = 0; k < H; k += 16) {
    const __mmask16 m = tail_mask(H - k);
    const __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, out + k), vmean);
    acc = _mm512_fmadd_ps(d, d, acc);
  }
  *rstd = 1.f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(H) +
                          static_cast<float>(eps));
  return mean;
}

SQ_AVX512 void normalize_avx512(float* out, int64_t H, float mean, float rstd, const float* w,
                                   const float* b, const float* mult, float zp, uint8_t* q) {
  const __m512 vmean = _mm512_set1_ps(mean), vrstd = _mm512_set1_ps(rstd);
  const __m512 vzp = _mm512_set1_ps(zp), lo = _mm512_setzero_ps(), hi = _mm512_set1_ps(255.f);
  for (int64_t k = 0; k < H; k += 16) {
    const __mmask16 m = tail_mask(H - k);
    const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, out + k), vmean);
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(d, vrstd), _mm512_maskz_loadu_ps(m, w + k));
    if (b) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, b + k));
    _mm512_mask_storeu_ps(out + k, m, y);
    if (q) {
      // round half to even, + zp, clamp to [0, 255] in float (exact integers), then narrow
      __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, mult + k)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(v, vzp), lo), hi);
      _mm_mask_storeu_epi8(q + k, m, _mm512_cvtusepi32_epi8(_mm512_cvttps_epi32(v)));
    }
  }
}

// The checked operands: x and residual float32 of one shape (rows = all but the last dim),
// weight and bias float32 [H].
struct Rows {
  at::Tensor x, r, w, b;
  int64_t T, H;
};

Rows check_rows(const at::Tensor& x, const std::optional<at::Tensor>& residual,
                const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat, kOp,
              ": x must be float32 [..., hidden], got ", x.scalar_type(), " ", x.sizes());
  const int64_t H = x.size(-1);
  TORCH_CHECK(H > 0, kOp, ": x has no hidden features");
  Rows rows{x.contiguous(), at::Tensor(), weight.contiguous(), at::Tensor(), x.numel() / H, H};
  if (residual) {
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == at::kFloat, kOp,
                ": residual must be float32 of x's shape ", x.sizes(), ", got ",
                residual->scalar_type(), " ", residual->sizes());
    rows.r = residual->contiguous();
  }
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.numel() == H, kOp,
              ": weight must be float32 [", H, "]");
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == H, kOp,
                ": bias must be float32 [", H, "]");
    rows.b = bias->contiguous();
  }
  return rows;
}

// Runs row(t, out_row) for every row after its LayerNorm, over the OpenMP team, with rows
// split so that each task has ~32K elements (a short input stays on one thread).
template <typename Quantize>
at::Tensor normalize_rows(const Rows& in, double eps, bool vector, const float* mult, float zp,
                          uint8_t* q, Quantize&& row) {
  at::Tensor out = pooled_empty(in.x.sizes(), in.x.options());
  const float* xp = in.x.data_ptr<float>();
  const float* rp = in.r.defined() ? in.r.data_ptr<float>() : nullptr;
  const float* wp = in.w.data_ptr<float>();
  const float* bp = in.b.defined() ? in.b.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const int64_t H = in.H;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / H);
  at::parallel_for(0, in.T, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float rstd;
      float* o = op + t * H;
      const float* r = rp ? rp + t * H : nullptr;
      uint8_t* qt = q ? q + t * H : nullptr;
      if (vector) {
        const float mean = row_stats_avx512(xp + t * H, r, H, eps, o, &rstd);
        normalize_avx512(o, H, mean, rstd, wp, bp, mult, zp, qt);
      } else {
        const float mean = row_stats_scalar(xp + t * H, r, H, eps, o, &rstd);
        normalize_scalar(o, H, mean, rstd, wp, bp, mult, zp, qt);
      }
      row(t, o);
    }
  });
  return out;
}

bool pick_vector(c10::string_view path) {
  const std::string p(path);
  TORCH_CHECK(p == "auto" || p == "avx512" || p == "scalar", kOp,
              ": path must be auto, avx512 or scalar");
  const bool vector = p != "scalar" && cpu_has_avx512();
  TORCH_CHECK(p != "avx512" || vector, kOp, ": this CPU has no AVX512");
  return vector;
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm_quantize(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, double eps, const at::Tensor& multiplier,
    int64_t zero_point, c10::string_view path) {
  const Rows in = check_rows(x, residual, weight, bias);
  const bool vector = pick_vector(path);
  const at::Tensor mc = checked_multiplier(multiplier, in.H, kOp);
  TORCH_CHECK(zero_point >= 0 && zero_point <= 255, kOp, ": zero_point must be in [0, 255]");
  at::Tensor q = pooled_empty({in.T, in.H}, x.options().dtype(at::kByte));
  at::Tensor out = normalize_rows(in, eps, vector, mc.data_ptr<float>(),
                                  static_cast<float>(zero_point), q.data_ptr<uint8_t>(),
                                  [](int64_t, const float*) {});
  return {out, q};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_quantize_rows(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, double eps, const std::optional<at::Tensor>& multiplier,
    const std::optional<at::Tensor>& side_index, c10::string_view path) {
  const Rows in = check_rows(x, residual, weight, bias);
  const bool vector = pick_vector(path);
  const at::Tensor mc = checked_multiplier(multiplier, in.H, kOp);
  const at::Tensor ic = checked_side_index(side_index, in.H, kOp, "hidden features");
  const int64_t n_side = ic.defined() ? ic.numel() : 0;
  at::Tensor q = pooled_empty({in.T, in.H}, x.options().dtype(at::kByte));
  at::Tensor scale = pooled_empty({in.T, 1}, x.options());
  at::Tensor side = pooled_empty({in.T, n_side}, x.options());
  const float* mp = mc.defined() ? mc.data_ptr<float>() : nullptr;
  const int64_t* ip = n_side ? ic.data_ptr<int64_t>() : nullptr;
  uint8_t* qp = q.data_ptr<uint8_t>();
  float* sp = scale.data_ptr<float>();
  float* side_p = side.data_ptr<float>();
  const int64_t H = in.H;
  at::Tensor out = normalize_rows(in, eps, vector, nullptr, 0.f, nullptr,
                                  [&](int64_t t, const float* y) {
                                    quantize_token_row(vector, y, mp, H, sp + t, qp + t * H);
                                    for (int64_t c = 0; c < n_side; ++c)
                                      side_p[t * n_side + c] = y[ip[c]];
                                  });
  return {out, q, scale, side};
}

// Whether this CPU runs the vector path (the compile rewrite fuses only where it does: the
// plain C++ loop is slower than inductor's vectorized kernel).
bool layer_norm_vectorized() { return cpu_has_avx512(); }

}  // namespace
}  // namespace squant_kernels

TORCH_LIBRARY_FRAGMENT(squant, m) {
  m.def(
      "add_layer_norm_quantize(Tensor x, Tensor? residual, Tensor weight, Tensor? bias, "
      "float eps, Tensor multiplier, int zero_point, str path=\"auto\") -> (Tensor, Tensor)");
  m.def(
      "add_layer_norm_quantize_rows(Tensor x, Tensor? residual, Tensor weight, Tensor? bias, "
      "float eps, Tensor? multiplier=None, Tensor? side_index=None, str path=\"auto\") "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def("layer_norm_vectorized() -> bool", &squant_kernels::layer_norm_vectorized);
}

TORCH_LIBRARY_IMPL(squant, CPU, m) {
  m.impl("add_layer_norm_quantize", &squant_kernels::add_layer_norm_quantize);
  m.impl("add_layer_norm_quantize_rows", &squant_kernels::add_layer_norm_quantize_rows);
}
