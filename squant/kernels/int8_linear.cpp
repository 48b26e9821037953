// INT8 linear for x86 CPUs:
//   y[m,n] = act(x_scale·row_scale[m]·w_scale[n]·Σ_k (x[m,k] - zp)·w[n,k] + bias[n]
//                + Σ_j side_x[m,j]·side_w[j,n])
// row_scale (optional): the per-token scale of dynamically quantized inputs. side_x/side_w
// (optional): a few input channels kept in float beside the int8 product (outlier channels),
// added before the activation, so their layer is still one call.
//
// Why squant has its own: PyTorch's oneDNN qlinear builds a oneDNN primitive descriptor on
// every call, ~20-25 us before any arithmetic (2 threads, AVX512-VNNI Zen 5), and a BERT layer
// makes four such calls. Its opt-in cache (ONEDNN_CACHE_CONTEXT_UNSAFE=1) is keyed by the
// weight's address alone, with one argument list per weight shared by every calling thread.
// This kernel keeps no per-call state at all: the micro-kernel is oneDNN's brgemm, reached
// through PyTorch's at::native::cpublas::brgemm (which caches the generated code per block
// shape); the blocking, the zero-point compensation and the epilogue (scales, bias,
// activation, output dtype) are here.
//
// Layout of the packed weight (pack_weight_blocked in quant/int8.py): [N/64][K/4][64][4] int8, the
// "VNNI" layout whose 4 consecutive k of one output column feed one vpdpbusd lane; N padded
// to a multiple of 64 with zero columns, K a multiple of 4. compensation[n] = Σ_k w[n,k],
// subtracted zp times from each u8 sum (the activations are u8 with a zero point).
//
// Work is split into 64-row x 64-column output blocks over the OpenMP team; each block is one
// brgemm call over the whole K into an int32 tile on the stack, then the epilogue writes the
// tile's rows. The epilogue has an AVX512 path (chosen at run time by cpuid) and a plain C++
// one; the AVX512 epilogue's exact GELU evaluates Φ by piecewise polynomials (gelu_table).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include "internal.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace squant_kernels {
namespace {

constexpr int64_t kBlockN = kLinearBlockN;  // output columns per packed block (4 AVX512 vectors)
constexpr int64_t kBlockM = 64;  // output rows per brgemm call

enum class Act { none, gelu, gelu_tanh, relu };

Act parse_activation(const std::string& name) {
  if (name == "none") return Act::none;
  if (name == "gelu") return Act::gelu;
  if (name == "gelu_tanh") return Act::gelu_tanh;
  if (name == "relu") return Act::relu;
  TORCH_CHECK(false, "squant::int8_linear: unknown activation '", name,
              "' (supported: none, gelu, gelu_tanh, relu)");
}

inline float activate(float v, Act act) {
  switch (act) {
    case Act::none:
      return v;
    case Act::relu:
      return v > 0.f ? v : 0.f;
    case Act::gelu:
      return 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f));
    case Act::gelu_tanh: {
      const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
      return 0.5f * v * (1.f + std::tanh(u));
    }
  }
  return v;
}

struct Epilogue {
  const int32_t* compensation;  // [N padded]
  const float* w_scale;         // [N]
  const float* bias;            // [N] or null
  const float* row_scale;       // [M] or null
  const float* side_x;          // [M, side] or null
  const float* side_w;          // [side, N] or null
  int64_t side;
  float x_scale;
  int32_t x_zero_point;
  Act act;
};

template <typename Out>
inline void store(Out* out, float v) {
  *out = static_cast<Out>(v);
}

// Plain C++: any CPU, and the reference the AVX512 path must agree with.
template <typename Out>
void epilogue_scalar(const int32_t* acc, int64_t rows, int64_t m0, int64_t cols, int64_t n0,
                     int64_t N, const Epilogue& e, Out* out, int64_t ld) {
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t m = m0 + i;
    Out* row = out + i * ld;
    const float x_scale = e.row_scale ? e.x_scale * e.row_scale[m] : e.x_scale;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t n = n0 + j;
      const int32_t sum = acc[i * kBlockN + j] - e.x_zero_point * e.compensation[n];
      float v = static_cast<float>(sum) * (x_scale * e.w_scale[n]);
      if (e.bias) v += e.bias[n];
      for (int64_t c = 0; c < e.side; ++c) v += e.side_x[m * e.side + c] * e.side_w[c * N + n];
      store(row + j, activate(v, e.act));
    }
  }
}

// exp(x) for x in [-86, 88]: x = n·ln2 + r, |r| <= ln2/2, e^r by a degree-6 polynomial,
// times 2^n (scalef, exact). The lower clamp keeps n >= -124, so the result is a normal
// float: on Intel cores a subnormal result or operand costs a microcode assist of ~100+
// cycles per instruction (an epilogue full of them ran 15x slower); AMD's cores have no such
// penalty.
SQ_AVX512 inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.f)), _mm512_set1_ps(-86.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// Exact GELU without a division or an exp, for the AVX512 epilogue:
//   GELU(v) = v·Φ(v) = v/2 + |v|·g(|v|),   g(a) = erf(a/√2)/2 = Φ(a) - 1/2
// (v·(Φ(v) - 1/2) = |v|·g(|v|), as g is odd). g on [0, 5.625) is 15 pieces of width 0.375,
// each a degree-5 polynomial in the position u ∈ [0, 1) within its piece, interpolating g at
// the 6 Chebyshev nodes (computed once, in double, from std::erf: |error| < 1e-8, below float
// rounding); from 5.625 on, g rounds to 1/2 in float, so the 16th piece is the constant 1/2
// and large inputs give exactly v (positive) or 0 (negative). The 16 pieces' coefficients are
// one AVX512 register each, picked per lane by vpermps: ~19 vector instructions per 16
// outputs, where erf by Abramowitz & Stegun 7.1.26 (an exp and a division) took ~32 and a
// division, and GELU was most of the FFN-in epilogue's time on an AMX Xeon.
constexpr int kGeluPieces = 16, kGeluDegree = 5;
constexpr double kGeluPieceWidth = 0.375;

struct GeluTable {
  alignas(64) float c[kGeluDegree + 1][kGeluPieces];  // c[j][piece]: coefficient of u^j
};

GeluTable make_gelu_table() {
  GeluTable t{};
  constexpr int n = kGeluDegree + 1;
  for (int piece = 0; piece < kGeluPieces; ++piece) {
    if (piece == kGeluPieces - 1) {  // g rounds to 1/2 from here on
      for (int j = 0; j < n; ++j) t.c[j][piece] = j == 0 ? 0.5f : 0.f;
      continue;
    }
    // interpolate at the Chebyshev nodes of [0, 1]: solve the Vandermonde system in double
    double a[n][n + 1];
    for (int i = 0; i < n; ++i) {
      const double u = 0.5 - 0.5 * std::cos((2 * i + 1) * M_PI / (2 * n));
      const double x = (piece + u) * kGeluPieceWidth;
      for (int j = 0; j < n; ++j) a[i][j] = std::pow(u, j);
      a[i][n] = 0.5 * std::erf(x / std::sqrt(2.0));
    }
    for (int col = 0; col < n; ++col) {  // Gaussian elimination with partial pivoting
      int best = col;
      for (int r = col + 1; r < n; ++r)
        if (std::fabs(a[r][col]) > std::fabs(a[best][col])) best = r;
      for (int k = 0; k <= n; ++k) std::swap(a[col][k], a[best][k]);
      for (int r = 0; r < n; ++r) {
        if (r == col) continue;
        const double f = a[r][col] / a[col][col];
        for (int k = col; k <= n; ++k) a[r][k] -= f * a[col][k];
      }
    }
    for (int j = 0; j < n; ++j) t.c[j][piece] = static_cast<float>(a[j][n] / a[j][j]);
  }
  return t;
}

const GeluTable& gelu_table() {
  static const GeluTable table = make_gelu_table();
  return table;
}

// What an activation needs in registers across an epilogue's loop (the GELU coefficients):
// loaded once per call, not per vector (the compiler cannot hoist loads from a table past the
// epilogue's float stores, which might alias it).
struct Activation512 {
  __m512 c[kGeluDegree + 1];
};

template <Act act>
SQ_AVX512 inline Activation512 activation512() {
  Activation512 a{};
  if constexpr (act == Act::gelu) {
    const GeluTable& t = gelu_table();
    for (int j = 0; j <= kGeluDegree; ++j) a.c[j] = _mm512_load_ps(t.c[j]);
  }
  return a;
}

template <Act act>
SQ_AVX512 inline __m512 activate512(__m512 v, const Activation512& ctx) {
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.f);
  switch (act) {
    case Act::none:
      return v;
    case Act::relu:
      return _mm512_max_ps(v, _mm512_setzero_ps());
    case Act::gelu: {
      const __m512 a = _mm512_abs_ps(v);
      // position in pieces, kept below 16 so every input past 6 lands in the constant piece
      const __m512 s = _mm512_min_ps(_mm512_mul_ps(a, _mm512_set1_ps(float(1.0 / kGeluPieceWidth))),
                                     _mm512_set1_ps(15.99f));
      const __m512 piece = _mm512_roundscale_ps(s, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
      const __m512i index = _mm512_cvttps_epi32(piece);
      const __m512 u = _mm512_sub_ps(s, piece);
      __m512 g = _mm512_permutexvar_ps(index, ctx.c[kGeluDegree]);
      for (int j = kGeluDegree - 1; j >= 0; --j)
        g = _mm512_fmadd_ps(g, u, _mm512_permutexvar_ps(index, ctx.c[j]));
      // a NaN input: min() takes the bound, so g is 1/2, and v/2 carries the NaN through
      return _mm512_fmadd_ps(a, g, _mm512_mul_ps(half, v));
    }
    case Act::gelu_tanh: {
      const __m512 v3 = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
      const __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                     _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), v3, v));
      // tanh(u) = 1 - 2 / (e^{2u} + 1)
      const __m512 e2 = exp512(_mm512_add_ps(u, u));
      const __m512 th = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.f), _mm512_add_ps(e2, one)));
      return _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, th));
    }
  }
  return v;
}

// One activation per instantiation, and the epilogue's fields in locals: with the switch and
// the field loads inside the loop (the compiler cannot prove the float stores leave them
// alone), they took a third of the epilogue's time on an AMX Xeon. `held` outlier channels'
// weight vectors (the default count, 4, or none) stay in registers across a block's rows;
// any others are loaded per row.
template <Act act, int held>
SQ_AVX512 void epilogue_avx512_with(const int32_t* acc, int64_t rows, int64_t m0, int64_t cols,
                                    int64_t n0, int64_t N, const Epilogue& e, float* out,
                                    int64_t ld) {
  const __m512i zp = _mm512_set1_epi32(e.x_zero_point);
  const float* const row_scales = e.row_scale;
  const float* const side_x = e.side_x;
  const float* const side_w = e.side_w;
  const int64_t side = e.side;
  const Activation512 ctx = activation512<act>();
  for (int64_t j = 0; j < cols; j += 16) {
    const __mmask16 mask = tail_mask(cols - j);
    const int64_t n = n0 + j;
    const __m512i comp = _mm512_mullo_epi32(zp, _mm512_loadu_si512(e.compensation + n));
    const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(e.x_scale),
                                       _mm512_maskz_loadu_ps(mask, e.w_scale + n));
    const __m512 bias = e.bias ? _mm512_maskz_loadu_ps(mask, e.bias + n) : _mm512_setzero_ps();
    __m512 sw[held > 0 ? held : 1];
    for (int c = 0; c < held; ++c) sw[c] = _mm512_maskz_loadu_ps(mask, side_w + c * N + n);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t m = m0 + i;
      const __m512i sum = _mm512_sub_epi32(_mm512_loadu_si512(acc + i * kBlockN + j), comp);
      const __m512 row_scale =
          row_scales ? _mm512_mul_ps(scale, _mm512_set1_ps(row_scales[m])) : scale;
      __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), row_scale, bias);
      const float* sx = side_x + m * side;
      for (int c = 0; c < held; ++c) v = _mm512_fmadd_ps(_mm512_set1_ps(sx[c]), sw[c], v);
      for (int64_t c = held; c < side; ++c) {
        v = _mm512_fmadd_ps(_mm512_set1_ps(sx[c]), _mm512_maskz_loadu_ps(mask, side_w + c * N + n), v);
      }
      _mm512_mask_storeu_ps(out + i * ld + j, mask, activate512<act>(v, ctx));
    }
  }
}

template <Act act>
SQ_AVX512 void epilogue_avx512_for(const int32_t* acc, int64_t rows, int64_t m0, int64_t cols,
                                   int64_t n0, int64_t N, const Epilogue& e, float* out,
                                   int64_t ld) {
  if (e.side == 4) return epilogue_avx512_with<act, 4>(acc, rows, m0, cols, n0, N, e, out, ld);
  return epilogue_avx512_with<act, 0>(acc, rows, m0, cols, n0, N, e, out, ld);
}

SQ_AVX512 void epilogue_avx512(const int32_t* acc, int64_t rows, int64_t m0, int64_t cols,
                               int64_t n0, int64_t N, const Epilogue& e, float* out,
                               int64_t ld) {
  switch (e.act) {
    case Act::none: return epilogue_avx512_for<Act::none>(acc, rows, m0, cols, n0, N, e, out, ld);
    case Act::relu: return epilogue_avx512_for<Act::relu>(acc, rows, m0, cols, n0, N, e, out, ld);
    case Act::gelu: return epilogue_avx512_for<Act::gelu>(acc, rows, m0, cols, n0, N, e, out, ld);
    case Act::gelu_tanh:
      return epilogue_avx512_for<Act::gelu_tanh>(acc, rows, m0, cols, n0, N, e, out, ld);
  }
}

}  // namespace

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

namespace {

// Per-token quantization of a linear's input, the step before a dynamic int8_linear:
//   v = x·multiplier;  scale[m] = max(max_k |v[m,k]| / 127, 1e-12);
//   q[m,k] = clamp(round_half_even(v[m,k] / scale[m]), -127, 127) + 128   (u8, zero point 128)
//   side_x[m,j] = x[m, side_index[j]]   (outlier channels, kept in float, unscaled)
// The same arithmetic as squant.quant.int8.quantize_per_token: a multiply by the row's
// reciprocal 1 / scale (itself one correctly rounded division), so every integer matches; a
// vector division per element costs ~16 cycles per 16 floats on Intel cores (Sapphire Rapids),
// as much as the rest of the step together. Each row is read twice while it sits
// in L1; a compiler-generated version of these steps made one pass over all rows for the
// maxima and a second pass over all rows for the integers, reading the tensor from memory twice.
constexpr float kTiny = 1e-12f;

// The two steps of a row's quantization, on any part of the row: |max| of x·mult, then the
// u8 values at a given 1 / scale; quantize_row runs both over a whole row.
float abs_max_scalar(const float* x, const float* mult, int64_t K) {
  float amax = 0.f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(mult ? x[k] * mult[k] : x[k]));
  return amax;
}

void quantize_with_scalar(const float* x, const float* mult, int64_t K, float inv, uint8_t* q) {
  for (int64_t k = 0; k < K; ++k) {
    const float v = std::nearbyint((mult ? x[k] * mult[k] : x[k]) * inv);
    q[k] = static_cast<uint8_t>(std::min(127.f, std::max(-127.f, v)) + 128.f);
  }
}

SQ_AVX512 float abs_max_avx512(const float* x, const float* mult, int64_t K) {
  __m512 vmax = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    __m512 v = _mm512_maskz_loadu_ps(m, x + k);
    if (mult) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, mult + k));
    vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v));
  }
  return _mm512_reduce_max_ps(vmax);
}

// round(v·inv) by the conversion's own round-to-nearest-even (embedded, as roundscale
// rounds), +128 in integers and an unsigned saturating narrow to u8. |v·inv| <= 127 by the
// scale's construction (the row's |max| / 127), so the clamp to [-127, 127] of the plain C++
// path only matters for a NaN (-> -127 by the max, as there) and +inf (-> 255 by the
// saturation, as the clamp gives); the same integers with 3 fewer instructions per 16 values.
template <bool with_mult>
SQ_AVX512 void quantize_with_avx512_as(const float* x, const float* mult, int64_t K, float inv,
                                       uint8_t* q) {
  const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.f);
  const __m512i zp = _mm512_set1_epi32(128);
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = tail_mask(K - k);
    __m512 v = _mm512_maskz_loadu_ps(m, x + k);
    if constexpr (with_mult) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, mult + k));
    v = _mm512_max_ps(_mm512_mul_ps(v, vinv), lo);
    const __m512i i = _mm512_add_epi32(
        _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zp);
    _mm_mask_storeu_epi8(q + k, m, _mm512_cvtusepi32_epi8(i));
  }
}

SQ_AVX512 void quantize_with_avx512(const float* x, const float* mult, int64_t K, float inv,
                                    uint8_t* q) {
  if (mult) {
    quantize_with_avx512_as<true>(x, mult, K, inv, q);
  } else {
    quantize_with_avx512_as<false>(x, mult, K, inv, q);
  }
}

inline float abs_max(bool vector, const float* x, const float* mult, int64_t K) {
  return vector ? abs_max_avx512(x, mult, K) : abs_max_scalar(x, mult, K);
}

inline void quantize_with(bool vector, const float* x, const float* mult, int64_t K, float inv,
                          uint8_t* q) {
  if (vector) {
    quantize_with_avx512(x, mult, K, inv, q);
  } else {
    quantize_with_scalar(x, mult, K, inv, q);
  }
}

// A row's scale from its |max|: one division per row; the elements multiply by 1 / scale.
inline float row_scale_of(float amax) { return std::max(amax / 127.f, kTiny); }

inline void quantize_row(bool vector, const float* x, const float* mult, int64_t K,
                         float* scale, uint8_t* q) {
  const float s = row_scale_of(abs_max(vector, x, mult, K));
  *scale = s;
  quantize_with(vector, x, mult, K, 1.f / s, q);
}

}  // namespace

// The per-token quantize's optional operands, checked for an input of K features: the
// multiplier (float32 [K]; contiguous, or undefined) and the outlier channels' indices.
at::Tensor checked_multiplier(const std::optional<at::Tensor>& multiplier, int64_t K,
                              const char* op) {
  if (!multiplier) return at::Tensor();
  TORCH_CHECK(multiplier->scalar_type() == at::kFloat && multiplier->numel() == K, op,
              ": multiplier must be float32 [", K, "]");
  return multiplier->contiguous();
}

// The outlier channels' indices, checked against `width` channels: int64 [channels],
// contiguous (undefined when there are none).
at::Tensor checked_side_index(const std::optional<at::Tensor>& side_index, int64_t width,
                              const char* op, const char* what) {
  if (!side_index) return at::Tensor();
  TORCH_CHECK(side_index->dim() == 1 && side_index->scalar_type() == at::kLong, op,
              ": side_index must be int64 [channels]");
  at::Tensor ic = side_index->contiguous();
  const int64_t* idx = ic.data_ptr<int64_t>();
  for (int64_t c = 0; c < ic.numel(); ++c) {
    TORCH_CHECK(idx[c] >= 0 && idx[c] < width, op, ": side_index ", idx[c],
                " is out of range for ", width, " ", what);
  }
  return ic;
}

namespace {

// This core's L2 in bytes (1 MB where the OS does not say).
int64_t l2_bytes() {
  static const int64_t bytes = [] {
    const long b = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return b > 0 ? int64_t(b) : int64_t(1) << 20;
  }();
  return bytes;
}

// Task order: by row block (each row block's activations stay in L1 while the weight blocks
// pass) or, where the weights do not fit in a core's L2, by weight block (each thread then
// reads its share of the weights once, its range of tasks running in this order, see
// run_claimed; row-block order read all of them once per row block from L3: 256 x 4096 ->
// 1024 with 2 threads on an AMX Xeon 0.60 -> 0.46 ms, 256 x 3072 -> 768 0.34 -> 0.27 ms; but
// 256 x 768 -> 2304, whose 1.8 MB of weights fit, 0.27 -> 0.30 ms).
bool weight_major(int64_t K, int64_t N) { return K * N > l2_bytes(); }

template <typename Out>
void run(const at::Tensor& x, const at::Tensor& packed, const Epilogue& e, at::Tensor& out,
         bool vector_epilogue) {
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  const int64_t n_blocks = packed.size(0), m_blocks = (M + kBlockM - 1) / kBlockM;
  const uint8_t* a = x.data_ptr<uint8_t>();
  const int8_t* b = packed.data_ptr<int8_t>();
  Out* y = out.data_ptr<Out>();
  const bool by_weight = weight_major(K, N);
  const int64_t tasks = m_blocks * n_blocks;
  run_claimed(tasks, [&](auto claim) {
    alignas(64) int32_t acc[kBlockM * kBlockN];
    for (int64_t task = claim(); task < tasks; task = claim()) {
      const int64_t mb = by_weight ? task % m_blocks : task / n_blocks;
      const int64_t nb = by_weight ? task / m_blocks : task % n_blocks;
      const int64_t m0 = mb * kBlockM, rows = std::min(kBlockM, M - m0);
      const int64_t n0 = nb * kBlockN, cols = std::min(kBlockN, N - n0);
      at::native::cpublas::brgemm(rows, kBlockN, K, K, kBlockN, kBlockN, false, a + m0 * K,
                                  b + nb * K * kBlockN, acc, true);
      Out* dst = y + m0 * N + n0;
      if constexpr (std::is_same_v<Out, float>) {
        if (vector_epilogue) {
          epilogue_avx512(acc, rows, m0, cols, n0, N, e, dst, N);
          continue;
        }
      }
      epilogue_scalar(acc, rows, m0, cols, n0, N, e, dst, N);
    }
    at::native::cpublas::brgemm_release(true);
  });
}

// The checked operands of one int8 linear, made contiguous and kept alive for its Epilogue.
struct Linear {
  at::Tensor x, packed, compensation, w_scale, bias, row_scale, side_x, side_w;
  Epilogue e;
  bool vector_epilogue;
};

Linear check_linear(const at::Tensor& x, const at::Tensor& packed_weight,
                    const at::Tensor& compensation, double x_scale, int64_t x_zero_point,
                    const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                    int64_t out_features, const std::string& activation,
                    const std::optional<at::Tensor>& row_scale,
                    const std::optional<at::Tensor>& side_x,
                    const std::optional<at::Tensor>& side_w, const std::string& epilogue) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kByte,
              "squant::int8_linear: x must be uint8 [tokens, in], got ", x.scalar_type(), " ",
              x.sizes());
  TORCH_CHECK(packed_weight.dim() == 4 && packed_weight.scalar_type() == at::kChar &&
                  packed_weight.size(2) == kBlockN && packed_weight.size(3) == 4,
              "squant::int8_linear: packed_weight must be int8 [N/64, K/4, 64, 4], got ",
              packed_weight.sizes());
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(packed_weight.size(1) * 4 == K, "squant::int8_linear: x has ", K,
              " input features, the packed weight ", packed_weight.size(1) * 4);
  TORCH_CHECK(out_features > 0 && out_features <= packed_weight.size(0) * kBlockN,
              "squant::int8_linear: out_features ", out_features, " does not fit the packed weight");
  TORCH_CHECK(compensation.scalar_type() == at::kInt &&
                  compensation.numel() == packed_weight.size(0) * kBlockN,
              "squant::int8_linear: compensation must be int32 [N padded to 64]");
  TORCH_CHECK(weight_scale.scalar_type() == at::kFloat && weight_scale.numel() == out_features,
              "squant::int8_linear: weight_scale must be float32 [out_features]");
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == out_features,
                "squant::int8_linear: bias must be float32 [out_features]");
  }
  if (row_scale) {
    TORCH_CHECK(row_scale->scalar_type() == at::kFloat && row_scale->numel() == M,
                "squant::int8_linear: row_scale must be float32 with one value per row of x");
  }
  TORCH_CHECK(side_x.has_value() == side_w.has_value(),
              "squant::int8_linear: side_x and side_w come together");
  int64_t side = 0;
  if (side_x) {
    side = side_x->dim() == 2 ? side_x->size(1) : -1;
    TORCH_CHECK(side_x->scalar_type() == at::kFloat && side_x->dim() == 2 &&
                    side_x->size(0) == M,
                "squant::int8_linear: side_x must be float32 [rows of x, channels]");
    TORCH_CHECK(side_w->scalar_type() == at::kFloat && side_w->dim() == 2 &&
                    side_w->size(0) == side && side_w->size(1) == out_features,
                "squant::int8_linear: side_w must be float32 [channels, out_features]");
  }
  TORCH_CHECK(epilogue == "auto" || epilogue == "avx512" || epilogue == "scalar",
              "squant::int8_linear: epilogue must be auto, avx512 or scalar");
  const bool vector_epilogue = epilogue != "scalar" && cpu_has_avx512();
  TORCH_CHECK(epilogue != "avx512" || vector_epilogue,
              "squant::int8_linear: this CPU has no AVX512 for the vector epilogue");

  Linear l;
  l.x = x.contiguous();
  l.packed = packed_weight.contiguous();
  l.compensation = compensation.contiguous();
  l.w_scale = weight_scale.contiguous();
  if (bias) l.bias = bias->contiguous();
  if (row_scale) l.row_scale = row_scale->contiguous();
  if (side_x) {
    l.side_x = side_x->contiguous();
    l.side_w = side_w->contiguous();
  }
  l.e = Epilogue{l.compensation.data_ptr<int32_t>(),
                 l.w_scale.data_ptr<float>(),
                 bias ? l.bias.data_ptr<float>() : nullptr,
                 row_scale ? l.row_scale.data_ptr<float>() : nullptr,
                 side_x ? l.side_x.data_ptr<float>() : nullptr,
                 side_x ? l.side_w.data_ptr<float>() : nullptr,
                 side,
                 static_cast<float>(x_scale),
                 static_cast<int32_t>(x_zero_point),
                 parse_activation(activation)};
  l.vector_epilogue = vector_epilogue;
  return l;
}

// Output rows [m0, m0 + rows) and columns [c0, c1) of a checked linear, float32, into out
// (row stride ld; column c0 at out[0]): each group of up to 64 rows, one brgemm call and the
// epilogue per output block. c0 is a multiple of the 64-column block; c1 one too, or N.
void linear_cols(const Linear& l, int64_t N, int64_t m0, int64_t rows, int64_t c0, int64_t c1,
                 float* out, int64_t ld) {
  const int64_t K = l.x.size(1);
  const uint8_t* a = l.x.data_ptr<uint8_t>();
  const int8_t* b = l.packed.data_ptr<int8_t>();
  alignas(64) int32_t acc[kBlockM * kBlockN];
  for (int64_t r0 = 0; r0 < rows; r0 += kBlockM) {
    const int64_t m = m0 + r0, count = std::min(kBlockM, rows - r0);
    for (int64_t n0 = c0; n0 < c1; n0 += kBlockN) {
      const int64_t cols = std::min(kBlockN, c1 - n0);
      at::native::cpublas::brgemm(count, kBlockN, K, K, kBlockN, kBlockN, false, a + m * K,
                                  b + (n0 / kBlockN) * K * kBlockN, acc, true);
      float* dst = out + r0 * ld + (n0 - c0);
      if (l.vector_epilogue) {
        epilogue_avx512(acc, count, m, cols, n0, N, l.e, dst, ld);
      } else {
        epilogue_scalar(acc, count, m, cols, n0, N, l.e, dst, ld);
      }
    }
  }
}

void linear_rows(const Linear& l, int64_t N, int64_t m0, int64_t rows, float* out) {
  linear_cols(l, N, m0, rows, 0, N, out, N);
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed_weight,
                       const at::Tensor& compensation, double x_scale, int64_t x_zero_point,
                       const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                       int64_t out_features, const std::string& activation,
                       std::optional<at::ScalarType> out_dtype,
                       const std::optional<at::Tensor>& row_scale,
                       const std::optional<at::Tensor>& side_x,
                       const std::optional<at::Tensor>& side_w, const std::string& epilogue) {
  const Linear l = check_linear(x, packed_weight, compensation, x_scale, x_zero_point,
                                weight_scale, bias, out_features, activation, row_scale, side_x,
                                side_w, epilogue);
  const at::ScalarType dtype = out_dtype.value_or(at::kFloat);
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "squant::int8_linear: out_dtype must be float32 or bfloat16");
  at::Tensor out = pooled_empty({x.size(0), out_features}, x.options().dtype(dtype));
  if (x.size(0) == 0) return out;
  if (dtype == at::kFloat) {
    run<float>(l.x, l.packed, l.e, out, l.vector_epilogue);
  } else {
    run<at::BFloat16>(l.x, l.packed, l.e, out, false);
  }
  return out;
}

// The columns order (see int8_linear_quantize_rows) where it measured faster: weights that do
// not fit in a core's L2, more than one thread, and threads that run at once (OpenMP's team;
// inside another parallel region the call runs on one thread, where rows cost the same).
bool columns_order_pays(const Linear& l, int64_t N, int64_t threads) {
  return AT_PARALLEL_OPENMP && threads > 1 && l.packed.size(0) > 1 &&
         weight_major(l.x.size(1), N) && !at::in_parallel_region();
}

// The float output of a checked linear, piece by piece of rows, each thread computing the
// columns of its own weight blocks (`owners` of them split the blocks), then
// quantize(m, row, c0, c1, scale) for each row m of the piece and each owner's columns
// [c0, c1) (row: their float values) once the row's scale is known from every owner's |max|
// (of the values times mult, where given). A thread waits for the others at each piece by a
// spin on a shared count: at::parallel_for runs its chunks at once on OpenMP's team, and a
// thread given several owners (a smaller team, or a nested call run inline) counts them all.
template <typename Quantize>
void quantize_rows_by_columns(const Linear& l, int64_t N, int64_t owners,
                              const Quantize& quantize, const float* mult) {
  const int64_t M = l.x.size(0), K = l.x.size(1), n_blocks = l.packed.size(0);
  auto columns_of = [&](int64_t o) {
    return std::pair<int64_t, int64_t>{std::min(N, o * n_blocks / owners * kBlockN),
                                       std::min(N, (o + 1) * n_blocks / owners * kBlockN)};
  };
  const int64_t widest = (n_blocks + owners - 1) / owners * kBlockN;
  // rows per piece: the most 64-row groups whose float output fills at most half of L2
  const int64_t groups = std::max<int64_t>(1, l2_bytes() / 2 / (kBlockM * widest * 4));
  const int64_t piece_rows = std::min(groups * kBlockM, (M + kBlockM - 1) / kBlockM * kBlockM);
  std::vector<float> part_max(owners * M);
  std::atomic<int64_t> arrived{0};
  std::atomic<bool> failed{false};
  const uint8_t* a = l.x.data_ptr<uint8_t>();
  const int8_t* b = l.packed.data_ptr<int8_t>();
  at::parallel_for(0, owners, 1, [&](int64_t begin, int64_t end) {
    try {
      // uninitialized: every element is written before it is read
      const LineBuffer<float> buffer((end - begin) * piece_rows * widest);
      alignas(64) int32_t acc[kBlockM * kBlockN];
      for (int64_t p0 = 0, piece = 1; p0 < M; p0 += piece_rows, ++piece) {
        const int64_t rows = std::min(piece_rows, M - p0);
        for (int64_t o = begin; o < end; ++o) {
          const auto [c0, c1] = columns_of(o);
          const int64_t w = c1 - c0;
          float* out = buffer.get() + (o - begin) * piece_rows * widest;
          for (int64_t n0 = c0; n0 < c1; n0 += kBlockN) {  // weight blocks outer
            const int64_t cols = std::min(kBlockN, c1 - n0);
            for (int64_t r0 = 0; r0 < rows; r0 += kBlockM) {
              const int64_t m = p0 + r0, count = std::min(kBlockM, rows - r0);
              at::native::cpublas::brgemm(count, kBlockN, K, K, kBlockN, kBlockN, false,
                                          a + m * K, b + (n0 / kBlockN) * K * kBlockN, acc, true);
              float* dst = out + r0 * w + (n0 - c0);
              if (l.vector_epilogue) {
                epilogue_avx512(acc, count, m, cols, n0, N, l.e, dst, w);
              } else {
                epilogue_scalar(acc, count, m, cols, n0, N, l.e, dst, w);
              }
            }
          }
          for (int64_t i = 0; i < rows; ++i) {
            part_max[o * M + p0 + i] =
                abs_max(l.vector_epilogue, out + i * w, mult ? mult + c0 : nullptr, w);
          }
        }
        arrived.fetch_add(end - begin, std::memory_order_acq_rel);
        while (arrived.load(std::memory_order_acquire) < owners * piece) {
          if (failed.load(std::memory_order_relaxed)) return;
          _mm_pause();
        }
        for (int64_t o = begin; o < end; ++o) {
          const auto [c0, c1] = columns_of(o);
          const float* out = buffer.get() + (o - begin) * piece_rows * widest;
          for (int64_t i = 0; i < rows; ++i) {
            float amax = 0.f;
            for (int64_t t = 0; t < owners; ++t) amax = std::max(amax, part_max[t * M + p0 + i]);
            quantize(p0 + i, out + i * (c1 - c0), c0, c1, row_scale_of(amax));
          }
        }
      }
    } catch (...) {
      failed = true;  // the other threads stop waiting for this one
      at::native::cpublas::brgemm_release(true);
      throw;
    }
    at::native::cpublas::brgemm_release(true);
  });
}

// int8_linear (float32 output) followed by quantize_per_token of that output, in one call:
// the same integers, scales and outlier channels as the two calls, without writing the float
// output to memory and reading it back. In a BERT layer this is the FFN's first GEMM (+ GELU)
// feeding the second one's per-token input: 6 MB of float per layer at 8 x 128 tokens. Two
// orders of work, both keeping the float output in the core's L2 ("auto" picks; tests force
// each):
//   rows:    each task computes whole rows (all output blocks of up to 64 rows) into an L2
//            buffer (64 x 4096 floats = 1 MB), then quantizes them; where the weights fit in
//            a core's L2, or on one thread;
//   columns: each thread owns whole weight blocks (its columns) and computes them for a piece
//            of rows, as many 64-row groups as fill half its L2, weight blocks outer, so each
//            block is read once per piece; once every thread's |max| of the piece's rows is
//            known (one spin barrier inside the one parallel region), each quantizes its
//            columns. Where the weights do not fit, a row task reads all of them from L3 for
//            every 64 rows: at 256 x 1024 -> 4096 (BERT-large) two row tasks per thread read
//            8 MB each, the columns order 4 MB. AMX Xeon, 2 threads, bit-identical, in-process
//            A/B: 0.89x the rows order's time at 256 x 1024 -> 4096 with GELU (weights cycled
//            from 8 copies), 0.91x at 256 x 768 -> 3072, 0.92-0.93x at 1024 rows, 0.94x at
//            128 x 1024 -> 4096; whole models 1 x 256 static, per-round median 0.98x on
//            BERT-large and on distilbert.
// Measured slower on the same host (whole models, in-process A/B, interleaved):
//   - 64-row pieces by thread-owned columns, each piece in two parallel regions (compute,
//     then quantize): 1.024x the rows order's time on distilbert 1 x 256, 1.045x on
//     BERT-large; 64 rows per piece read the weights as often as row tasks do, and the
//     regions' fork and join cost more than the one barrier here;
//   - the GEMM over all rows first, by weight blocks (each read once), each tile's row |max|
//     taken while it is in L1, then the rows quantized from memory: 1.08x on distilbert,
//     1.02x on BERT-large (the float output's round trip through memory);
//   - 128-row tasks, weight blocks outer: 1.026x on distilbert (the 1.5 MB buffer leaves L2).
std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_linear_quantize_rows(
    const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& compensation,
    double x_scale, int64_t x_zero_point, const at::Tensor& weight_scale,
    const std::optional<at::Tensor>& bias, int64_t out_features, const std::string& activation,
    const std::optional<at::Tensor>& row_scale, const std::optional<at::Tensor>& side_x,
    const std::optional<at::Tensor>& side_w, const std::optional<at::Tensor>& multiplier,
    const std::optional<at::Tensor>& side_index, const std::string& path,
    const std::string& order) {
  const Linear l = check_linear(x, packed_weight, compensation, x_scale, x_zero_point,
                                weight_scale, bias, out_features, activation, row_scale, side_x,
                                side_w, path);
  const int64_t M = x.size(0), N = out_features;
  constexpr const char* op = "squant::int8_linear_quantize_rows";
  TORCH_CHECK(order == "auto" || order == "rows" || order == "columns", op,
              ": order must be auto, rows or columns");
  const at::Tensor mc = checked_multiplier(multiplier, N, op);
  const at::Tensor ic = checked_side_index(side_index, N, op, "outputs");
  const int64_t n_side = ic.defined() ? ic.numel() : 0;
  at::Tensor q = pooled_empty({M, N}, x.options().dtype(at::kByte));
  at::Tensor scale = pooled_empty({M, 1}, x.options().dtype(at::kFloat));
  at::Tensor side = pooled_empty({M, n_side}, x.options().dtype(at::kFloat));
  if (M == 0) return {q, scale, side};
  const float* mp = mc.defined() ? mc.data_ptr<float>() : nullptr;
  const int64_t* ip = side_index ? ic.data_ptr<int64_t>() : nullptr;
  uint8_t* qp = q.data_ptr<uint8_t>();
  float* sp = scale.data_ptr<float>();
  float* side_p = side.data_ptr<float>();
  const bool vector = l.vector_epilogue;
  // output row m (float, N values) -> its u8 row, scale and outlier channels
  auto quantize_output_row = [&](const float* row, int64_t m) {
    quantize_row(vector, row, mp, N, sp + m, qp + m * N);
    for (int64_t c = 0; c < n_side; ++c) side_p[m * n_side + c] = row[ip[c]];
  };
  const int64_t threads = at::get_num_threads();
  if (order == "columns" || (order == "auto" && columns_order_pays(l, N, threads))) {
    // row m's columns [c0, c1) (their floats at row) at the row's scale s
    auto quantize_columns = [&](int64_t m, const float* row, int64_t c0, int64_t c1, float s) {
      quantize_with(vector, row, mp ? mp + c0 : nullptr, c1 - c0, 1.f / s, qp + m * N + c0);
      if (c0 == 0) sp[m] = s;
      for (int64_t c = 0; c < n_side; ++c)
        if (ip[c] >= c0 && ip[c] < c1) side_p[m * n_side + c] = row[ip[c] - c0];
    };
    const int64_t owners = std::min(threads, l.packed.size(0));
    quantize_rows_by_columns(l, N, owners, quantize_columns, mp);
    return {q, scale, side};
  }
  // up to 64 rows per task, fewer where that leaves a thread without rows (short inputs)
  const int64_t block_m = std::max<int64_t>(1, std::min<int64_t>(kBlockM, (M + threads - 1) / threads));
  const int64_t tasks = (M + block_m - 1) / block_m;
  run_claimed(tasks, [&](auto claim) {
    // uninitialized: every element is written before it is read
    const LineBuffer<float> rows_out(block_m * N);
    for (int64_t task = claim(); task < tasks; task = claim()) {
      const int64_t m0 = task * block_m, rows = std::min(block_m, M - m0);
      linear_rows(l, N, m0, rows, rows_out.get());
      for (int64_t i = 0; i < rows; ++i) quantize_output_row(rows_out.get() + i * N, m0 + i);
    }
    at::native::cpublas::brgemm_release(true);
  });
  return {q, scale, side};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_per_token(
    const at::Tensor& x, const std::optional<at::Tensor>& multiplier,
    const std::optional<at::Tensor>& side_index, c10::string_view path) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "squant::quantize_per_token: x must be float32 or bfloat16 [tokens, in], got ",
              x.scalar_type(), " ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K > 0, "squant::quantize_per_token: x has no input features");
  constexpr const char* op = "squant::quantize_per_token";
  const at::Tensor mc = checked_multiplier(multiplier, K, op);
  const std::string p(path);
  TORCH_CHECK(p == "auto" || p == "avx512" || p == "scalar",
              "squant::quantize_per_token: path must be auto, avx512 or scalar");
  const bool vector = p != "scalar" && cpu_has_avx512();
  TORCH_CHECK(p != "avx512" || vector, "squant::quantize_per_token: this CPU has no AVX512");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor q = pooled_empty({M, K}, x.options().dtype(at::kByte));
  at::Tensor scale = pooled_empty({M, 1}, x.options().dtype(at::kFloat));
  // the outlier channels gathered in the same pass over the rows (an index_select call cost
  // as much as a fifth of this op at 256 x 768)
  const at::Tensor ic = checked_side_index(side_index, K, op, "input features");
  const int64_t n_side = ic.defined() ? ic.numel() : 0;
  at::Tensor side = pooled_empty({M, n_side}, xf.options());
  const float* xp = xf.data_ptr<float>();
  const float* mp = mc.defined() ? mc.data_ptr<float>() : nullptr;
  const int64_t* ip = n_side ? ic.data_ptr<int64_t>() : nullptr;
  float* sp = scale.data_ptr<float>();
  float* side_p = side.data_ptr<float>();
  uint8_t* qp = q.data_ptr<uint8_t>();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      quantize_row(vector, xp + m * K, mp, K, sp + m, qp + m * K);
      for (int64_t c = 0; c < n_side; ++c) side_p[m * n_side + c] = xp[m * K + ip[c]];
    }
  });
  return {q, scale, side};
}

// Whether at::native::cpublas::brgemm runs u8 x s8 exactly on this CPU (oneDNN's ukernel has
// no path for every ISA): one small product of near-extreme values, checked against the exact
// sum, so a path that adds pairs of products in saturating 16 bits (vpmaddubsw) fails it.
bool int8_linear_supported() {
  static const bool supported = [] {
    try {
      constexpr int64_t M = 2, K = 8;
      alignas(64) uint8_t a[M * K];
      alignas(64) int8_t b[(K / 4) * kBlockN * 4];
      alignas(64) int32_t c[M * kBlockN];
      for (int64_t i = 0; i < M * K; ++i) a[i] = static_cast<uint8_t>(255 - i % 3);
      for (int64_t i = 0; i < (K / 4) * kBlockN * 4; ++i) b[i] = static_cast<int8_t>(127 - i % 5);
      at::native::cpublas::brgemm(M, kBlockN, K, K, kBlockN, kBlockN, false, a, b, c, true);
      at::native::cpublas::brgemm_release(true);
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < kBlockN; ++n) {
          int32_t want = 0;
          for (int64_t k = 0; k < K; ++k) want += a[m * K + k] * b[((k / 4) * kBlockN + n) * 4 + k % 4];
          if (c[m * kBlockN + n] != want) return false;
        }
      }
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }();
  return supported;
}

}  // namespace

LinearRows int8_linear_rows(const at::Tensor& x, const at::Tensor& packed_weight,
                            const at::Tensor& compensation, double x_scale, int64_t x_zero_point,
                            const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                            int64_t out_features, const std::optional<at::Tensor>& row_scale,
                            const std::optional<at::Tensor>& side_x,
                            const std::optional<at::Tensor>& side_w) {
  const Linear l = check_linear(x, packed_weight, compensation, x_scale, x_zero_point,
                                weight_scale, bias, out_features, "none", row_scale, side_x,
                                side_w, "auto");
  return [l, out_features](int64_t m0, int64_t rows, int64_t c0, int64_t c1, float* out,
                           int64_t ld) { linear_cols(l, out_features, m0, rows, c0, c1, out, ld); };
}

void linear_rows_release() { at::native::cpublas::brgemm_release(true); }

void quantize_token_row(bool vector, const float* x, const float* mult, int64_t K, float* scale,
                        uint8_t* q) {
  quantize_row(vector, x, mult, K, scale, q);
}

}  // namespace squant_kernels

TORCH_LIBRARY_FRAGMENT(squant, m) {
  m.def(
      "int8_linear(Tensor x, Tensor packed_weight, Tensor compensation, float x_scale, "
      "int x_zero_point, Tensor weight_scale, Tensor? bias, int out_features, "
      "str activation=\"none\", ScalarType? out_dtype=None, Tensor? row_scale=None, "
      "Tensor? side_x=None, Tensor? side_w=None, str epilogue=\"auto\") -> Tensor");
  m.def(
      "int8_linear_quantize_rows(Tensor x, Tensor packed_weight, Tensor compensation, "
      "float x_scale, int x_zero_point, Tensor weight_scale, Tensor? bias, int out_features, "
      "str activation=\"none\", Tensor? row_scale=None, Tensor? side_x=None, "
      "Tensor? side_w=None, Tensor? multiplier=None, Tensor? side_index=None, "
      "str path=\"auto\", str order=\"auto\") -> (Tensor, Tensor, Tensor)");
  m.def(
      "quantize_per_token(Tensor x, Tensor? multiplier=None, Tensor? side_index=None, "
      "str path=\"auto\") -> (Tensor, Tensor, Tensor)");
  m.def("int8_linear_supported() -> bool", &squant_kernels::int8_linear_supported);
}

TORCH_LIBRARY_IMPL(squant, CPU, m) {
  m.impl("int8_linear", &squant_kernels::int8_linear);
  m.impl("quantize_per_token", &squant_kernels::quantize_per_token);
  m.impl("int8_linear_quantize_rows", &squant_kernels::int8_linear_quantize_rows);
}
