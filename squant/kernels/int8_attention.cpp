// INT8 self-attention for encoders on x86 CPUs: softmax(Q·Kᵀ·scale + key padding) · V.
//
// One call per attention layer, reading the fused QKV projection's output [B, S, 3·H·D] as it
// is (no transposes, no [B, H, S, S] score tensor in memory). Per (batch, head):
//   - K rows are quantized to s8 with one scale per key row (dynamic, from the row's |max|),
//     packed for the dot-product instruction of the path, with their column sums;
//   - Q rows are quantized the same way, four rows at a time;
//   - Q·Kᵀ runs in integers: exact s32 sums, then one float scale per (query, key) pair;
//   - softmax in FP32 over the valid keys only (padded keys are skipped, not masked);
//   - P·V in FP32 (as OpenVINO does: the probabilities are where INT8 costs accuracy);
//   - the output row is written where the attention-output GEMM reads it: [B, S, H·D].
//
// Paths, chosen at run time from what this CPU has (or forced by name, for tests):
//   "avx512_vnni": vpdpbusd, u8 (query + 128) x s8 (key), minus 128·Σkey, 16 keys per vector;
//   "avx2":        vpmaddwd on s16-widened values (exact, no vpmaddubsw saturation), 6 query
//                  rows x 16 keys (or 16 value columns) per register tile;
//   "scalar":      plain C++ (any CPU, and the reference the vector paths must agree with).
// All three compute the same integer dot products; only exp() and summation order differ.
// The vector paths are compiled with per-function target attributes, so this file builds on
// any x86-64 compiler and host, and a path only runs where cpuid says the CPU has it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace squant_kernels {
namespace {

constexpr int kRows = 4;  // AVX512-VNNI: query rows computed together (they share each key load)

bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

bool cpu_has_avx512_vnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

// One (batch, head) problem: row r of Q, K, V starts at q + r * stride (same for k, v).
struct Head {
  const float* q;
  const float* k;
  const float* v;
  int64_t stride;
  float* out;  // row r of the output at out + r * out_stride
  int64_t out_stride;
  int64_t seq;
  int64_t dim;
  const int32_t* keys;  // indices of the keys to attend to
  int64_t n_keys;
  float scaling;
};

// Symmetric s8 quantization of one row: returns the scale (|max| / 127; 1 for an all-zero row).
inline float quantize_row(const float* x, int64_t n, int8_t* out) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0.f ? amax / 127.f : 1.f;
  const float inv = 1.f / scale;
  for (int64_t i = 0; i < n; ++i) {
    const long r = std::lrint(x[i] * inv);
    out[i] = static_cast<int8_t>(std::min(127L, std::max(-127L, r)));
  }
  return scale;
}

// ------------------------------------------------------------------------------------------
// scalar path

void head_scalar(const Head& h) {
  const int64_t n = h.n_keys, d = h.dim;
  std::vector<int8_t> kq(n * d), qq(d);
  std::vector<float> ks(n), p(n), acc(d);
  for (int64_t j = 0; j < n; ++j) ks[j] = quantize_row(h.k + h.keys[j] * h.stride, d, &kq[j * d]);
  for (int64_t i = 0; i < h.seq; ++i) {
    const float qs = quantize_row(h.q + i * h.stride, d, qq.data()) * h.scaling;
    float m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      int32_t dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += int32_t(qq[c]) * int32_t(kq[j * d + c]);
      p[j] = float(dot) * qs * ks[j];
      m = std::max(m, p[j]);
    }
    float sum = 0.f;
    for (int64_t j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - m));
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t j = 0; j < n; ++j) {
      const float* vr = h.v + h.keys[j] * h.stride;
      for (int64_t c = 0; c < d; ++c) acc[c] += p[j] * vr[c];
    }
    float* o = h.out + i * h.out_stride;
    for (int64_t c = 0; c < d; ++c) o[c] = acc[c] / sum;
  }
}

// ------------------------------------------------------------------------------------------
// AVX2 path

#define SQ_AVX2 __attribute__((target("avx2,fma")))

// exp(x) for x <= 0 (softmax after subtracting the max): Cephes' polynomial, |rel err| ~1e-7.
SQ_AVX2 inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                              _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.f));
  __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

SQ_AVX2 inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

SQ_AVX2 inline float hmax256(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// In place: p[0, n) <- exp(p - max) (padded tail untouched); returns the sum.
SQ_AVX2 float softmax_unnormalized_avx2(float* p, int64_t n) {
  __m256 vm = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(p + j));
  float m = hmax256(vm);
  for (; j < n; ++j) m = std::max(m, p[j]);
  const __m256 bm = _mm256_set1_ps(m);
  __m256 vs = _mm256_setzero_ps();
  j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p + j), bm));
    _mm256_storeu_ps(p + j, e);
    vs = _mm256_add_ps(vs, e);
  }
  float sum = hsum256(vs);
  for (; j < n; ++j) sum += (p[j] = std::exp(p[j] - m));
  return sum;
}

// quantize_row with AVX2 (the same rounding: cvtps2dq is nearest-even like lrint).
SQ_AVX2 float quantize_row_avx2(const float* x, int64_t n, int8_t* out) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 vmax = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  float amax = hmax256(vmax);
  for (; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0.f ? amax / 127.f : 1.f;
  const float inv = 1.f / scale;
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i lo = _mm256_set1_epi32(-127);
  for (i = 0; i + 8 <= n; i += 8) {
    // |x · inv| <= 127 by construction; the saturating packs keep it in s8, the max in -127..
    const __m256i q = _mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv)), lo);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_packs_epi16(w, w));
  }
  for (; i < n; ++i) out[i] = static_cast<int8_t>(std::min(127L, std::max(-127L, std::lrint(x[i] * inv))));
  return scale;
}

// The AVX2 register tile: 6 query rows x 16 (keys or value columns) = 12 accumulators, plus
// 2 loads and 1 broadcast, fills 15 of the 16 ymm registers. Each loaded key or value vector
// then serves 6 rows, so the loops run on the FMA/multiply ports, not on loads (with 2 rows
// per value load, P·V took ~60% of the kernel and ran at a third of the FMA peak).
constexpr int kRowsAvx2 = 6;

// o[r][c0, c0 + 8W) = inv[r] · Σ_j p[r][j] · V[j][c0, c0 + 8W), for the tile's 6 rows.
template <int W>
SQ_AVX2 void weighted_sum_tile_avx2(const float* const* p, const float* vbuf, int64_t n,
                                    int64_t d, int64_t c0, const float* inv, float* const* o) {
  __m256 acc[kRowsAvx2][W];
  for (int r = 0; r < kRowsAvx2; ++r)
    for (int w = 0; w < W; ++w) acc[r][w] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const float* vr = vbuf + j * d + c0;
    __m256 v[W];
    for (int w = 0; w < W; ++w) v[w] = _mm256_loadu_ps(vr + 8 * w);
    for (int r = 0; r < kRowsAvx2; ++r) {
      const __m256 x = _mm256_broadcast_ss(p[r] + j);
      for (int w = 0; w < W; ++w) acc[r][w] = _mm256_fmadd_ps(x, v[w], acc[r][w]);
    }
  }
  for (int r = 0; r < kRowsAvx2; ++r) {
    const __m256 s = _mm256_set1_ps(inv[r]);
    for (int w = 0; w < W; ++w) _mm256_storeu_ps(o[r] + c0 + 8 * w, _mm256_mul_ps(acc[r][w], s));
  }
}

// Keys packed for vpmaddwd: [block of 16 keys][pair of dims][key][2] as s16 (dims padded to
// even); 6 query rows x 16 keys per step: 2 key loads, 6 broadcasts, 12 vpmaddwd.
SQ_AVX2 void head_avx2(const Head& h) {
  constexpr int64_t kKeys = 16;
  constexpr int R = kRowsAvx2;
  const int64_t n = h.n_keys, d = h.dim, dp = (d + 1) / 2 * 2, pairs = dp / 2;
  const int64_t blocks = (n + kKeys - 1) / kKeys, width = blocks * kKeys;
  std::vector<int16_t> kp(blocks * pairs * 2 * kKeys, 0);
  std::vector<float> ks(width, 0.f), vbuf(n * d), p(R * width);
  std::vector<int8_t> row(dp, 0);
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = h.k + h.keys[j] * h.stride;
    ks[j] = quantize_row_avx2(kr, d, row.data());
    int16_t* dst = &kp[(j / kKeys) * pairs * 2 * kKeys + (j % kKeys) * 2];
    for (int64_t c = 0; c < pairs; ++c) {
      dst[c * 2 * kKeys] = row[2 * c];
      dst[c * 2 * kKeys + 1] = row[2 * c + 1];
    }
    std::memcpy(&vbuf[j * d], h.v + h.keys[j] * h.stride, d * sizeof(float));
  }
  // Query rows as s16 pairs, one int32 per pair (the broadcast operand of vpmaddwd).
  std::vector<int32_t> qp(R * pairs);
  std::vector<int8_t> qrow(dp, 0);
  float qs[R];
  for (int64_t i0 = 0; i0 < h.seq; i0 += R) {
    // A short last tile repeats its last row: the repeats compute (and write) the same values.
    const int64_t rows = std::min<int64_t>(R, h.seq - i0);
    for (int64_t r = 0; r < rows; ++r) {
      qs[r] = quantize_row_avx2(h.q + (i0 + r) * h.stride, d, qrow.data()) * h.scaling;
      for (int64_t c = 0; c < pairs; ++c) {
        const uint16_t lo = uint16_t(int16_t(qrow[2 * c]));
        const uint16_t hi = uint16_t(int16_t(qrow[2 * c + 1]));
        qp[r * pairs + c] = int32_t(uint32_t(lo) | (uint32_t(hi) << 16));
      }
    }
    for (int64_t r = rows; r < R; ++r) {
      qs[r] = qs[rows - 1];
      std::memcpy(&qp[r * pairs], &qp[(rows - 1) * pairs], pairs * sizeof(int32_t));
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const int16_t* kb = &kp[b * pairs * 2 * kKeys];
      __m256i s[R][2];
      for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = _mm256_setzero_si256();
      for (int64_t c = 0; c < pairs; ++c) {
        const __m256i k0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb + c * 32));
        const __m256i k1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb + c * 32 + 16));
        for (int r = 0; r < R; ++r) {
          const __m256i qv = _mm256_set1_epi32(qp[r * pairs + c]);
          s[r][0] = _mm256_add_epi32(s[r][0], _mm256_madd_epi16(qv, k0));
          s[r][1] = _mm256_add_epi32(s[r][1], _mm256_madd_epi16(qv, k1));
        }
      }
      for (int half = 0; half < 2; ++half) {
        const __m256 kscale = _mm256_loadu_ps(&ks[b * kKeys + 8 * half]);
        for (int r = 0; r < R; ++r) {
          const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s[r][half]),
                                         _mm256_mul_ps(kscale, _mm256_set1_ps(qs[r])));
          _mm256_storeu_ps(&p[r * width + b * kKeys + 8 * half], f);
        }
      }
    }
    float inv[R];
    const float* pr[R];
    float* o[R];
    for (int64_t r = 0; r < R; ++r) {
      const int64_t rr = std::min(r, rows - 1);
      if (r == rr) inv[r] = 1.f / softmax_unnormalized_avx2(&p[r * width], n);
      else inv[r] = inv[rr];
      pr[r] = &p[rr * width];
      o[r] = h.out + (i0 + rr) * h.out_stride;
    }
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) weighted_sum_tile_avx2<2>(pr, vbuf.data(), n, d, c, inv, o);
    if (c + 8 <= d) {
      weighted_sum_tile_avx2<1>(pr, vbuf.data(), n, d, c, inv, o);
      c += 8;
    }
    for (; c < d; ++c) {  // head dims that are not a multiple of 8
      for (int64_t r = 0; r < rows; ++r) {
        float a = 0.f;
        for (int64_t j = 0; j < n; ++j) a += pr[r][j] * vbuf[j * d + c];
        o[r][c] = a * inv[r];
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// AVX512-VNNI path

#define SQ_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))

SQ_VNNI inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  __m512 fx = _mm512_roundscale_ps(
      _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), x);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.f));
  __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

SQ_VNNI float quantize_row_vnni(const float* x, int64_t n, int8_t* out) {
  __m512 vmax = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  float amax = _mm512_reduce_max_ps(vmax);
  for (; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0.f ? amax / 127.f : 1.f;
  const float inv = 1.f / scale;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(q, lo), hi)));
  }
  for (; i < n; ++i) out[i] = static_cast<int8_t>(std::min(127L, std::max(-127L, std::lrint(x[i] * inv))));
  return scale;
}

SQ_VNNI float softmax_unnormalized_vnni(float* p, int64_t n) {
  __m512 vm = _mm512_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(p + j));
  float m = _mm512_reduce_max_ps(vm);
  for (; j < n; ++j) m = std::max(m, p[j]);
  const __m512 bm = _mm512_set1_ps(m);
  __m512 vs = _mm512_setzero_ps();
  j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(p + j), bm));
    _mm512_storeu_ps(p + j, e);
    vs = _mm512_add_ps(vs, e);
  }
  float sum = _mm512_reduce_add_ps(vs);
  for (; j < n; ++j) sum += (p[j] = std::exp(p[j] - m));
  return sum;
}

SQ_VNNI void weighted_sum_vnni(const float* p, const float* vbuf, int64_t n, int64_t d,
                               float inv_sum, float* out) {
  for (int64_t c0 = 0; c0 < d; c0 += 64) {
    const int64_t w = std::min<int64_t>(64, d - c0) / 16;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < n; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const float* vr = vbuf + j * d + c0;
      a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr), a0);
      if (w > 1) a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 16), a1);
      if (w > 2) a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 32), a2);
      if (w > 3) a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 48), a3);
    }
    const __m512 s = _mm512_set1_ps(inv_sum);
    _mm512_storeu_ps(out + c0, _mm512_mul_ps(a0, s));
    if (w > 1) _mm512_storeu_ps(out + c0 + 16, _mm512_mul_ps(a1, s));
    if (w > 2) _mm512_storeu_ps(out + c0 + 32, _mm512_mul_ps(a2, s));
    if (w > 3) _mm512_storeu_ps(out + c0 + 48, _mm512_mul_ps(a3, s));
  }
}

// Keys packed for vpdpbusd: [block of 16 keys][quad of dims][key][4] as s8; dims padded to 4.
SQ_VNNI void head_vnni(const Head& h) {
  const int64_t n = h.n_keys, d = h.dim, dp = (d + 3) / 4 * 4, quads = dp / 4;
  const int64_t blocks = (n + 15) / 16;
  std::vector<int8_t> kp(blocks * quads * 64, 0), row(dp, 0);
  std::vector<int32_t> kcomp(blocks * 16, 0);  // 128 · Σ key, removed from the u8 · s8 sums
  std::vector<float> ks(blocks * 16, 0.f), vbuf(n * d), p(kRows * blocks * 16);
  for (int64_t j = 0; j < n; ++j) {
    ks[j] = quantize_row_vnni(h.k + h.keys[j] * h.stride, d, row.data());
    int8_t* dst = &kp[(j / 16) * quads * 64 + (j % 16) * 4];
    int32_t sum = 0;
    for (int64_t c = 0; c < dp; ++c) {
      dst[(c / 4) * 64 + c % 4] = row[c];
      sum += row[c];
    }
    kcomp[j] = 128 * sum;
    std::memcpy(&vbuf[j * d], h.v + h.keys[j] * h.stride, d * sizeof(float));
  }
  std::vector<int32_t> qp(kRows * quads);
  std::vector<int8_t> qrow(dp, 0);
  float qs[kRows];
  for (int64_t i0 = 0; i0 < h.seq; i0 += kRows) {
    const int64_t rows = std::min<int64_t>(kRows, h.seq - i0);
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t i = i0 + std::min(r, rows - 1);
      qs[r] = quantize_row_vnni(h.q + i * h.stride, d, qrow.data()) * h.scaling;
      for (int64_t c = 0; c < quads; ++c) {
        uint32_t packed = 0;
        for (int t = 0; t < 4; ++t) packed |= uint32_t(uint8_t(qrow[4 * c + t] + 128)) << (8 * t);
        qp[r * quads + c] = int32_t(packed);
      }
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const int8_t* kb = &kp[b * quads * 64];
      __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
      for (int64_t c = 0; c < quads; ++c) {
        const __m512i kv = _mm512_loadu_si512(kb + c * 64);
        s0 = _mm512_dpbusd_epi32(s0, _mm512_set1_epi32(qp[c]), kv);
        s1 = _mm512_dpbusd_epi32(s1, _mm512_set1_epi32(qp[quads + c]), kv);
        s2 = _mm512_dpbusd_epi32(s2, _mm512_set1_epi32(qp[2 * quads + c]), kv);
        s3 = _mm512_dpbusd_epi32(s3, _mm512_set1_epi32(qp[3 * quads + c]), kv);
      }
      const __m512i comp = _mm512_loadu_si512(&kcomp[b * 16]);
      const __m512 kscale = _mm512_loadu_ps(&ks[b * 16]);
      const __m512i sums[kRows] = {s0, s1, s2, s3};
      for (int64_t r = 0; r < kRows; ++r) {
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sums[r], comp)),
                                       _mm512_mul_ps(kscale, _mm512_set1_ps(qs[r])));
        _mm512_storeu_ps(&p[r * blocks * 16 + b * 16], f);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* pr = &p[r * blocks * 16];
      const float sum = softmax_unnormalized_vnni(pr, n);
      float* o = h.out + (i0 + r) * h.out_stride;
      if (d % 16 == 0) {
        weighted_sum_vnni(pr, vbuf.data(), n, d, 1.f / sum, o);
      } else {
        for (int64_t c = 0; c < d; ++c) {
          float a = 0.f;
          for (int64_t j = 0; j < n; ++j) a += pr[j] * vbuf[j * d + c];
          o[c] = a / sum;
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// dispatch

using HeadFn = void (*)(const Head&);

HeadFn pick(const std::string& isa) {
  if (isa == "auto") {
    if (cpu_has_avx512_vnni()) return head_vnni;
    if (cpu_has_avx2()) return head_avx2;
    return head_scalar;
  }
  if (isa == "avx512_vnni") {
    TORCH_CHECK(cpu_has_avx512_vnni(), "squant int8 attention: this CPU has no AVX512-VNNI");
    return head_vnni;
  }
  if (isa == "avx2") {
    TORCH_CHECK(cpu_has_avx2(), "squant int8 attention: this CPU has no AVX2");
    return head_avx2;
  }
  TORCH_CHECK(isa == "scalar", "squant int8 attention: unknown isa '", isa,
              "' (auto, avx512_vnni, avx2, scalar)");
  return head_scalar;
}

at::Tensor int8_attention(const at::Tensor& qkv, const std::optional<at::Tensor>& key_mask,
                          int64_t num_heads, double scaling, c10::string_view isa) {
  TORCH_CHECK(qkv.device().is_cpu(), "squant int8 attention runs on CPU");
  TORCH_CHECK(qkv.dim() == 3, "qkv must be [batch, seq, 3 * heads * head_dim]");
  TORCH_CHECK(num_heads > 0 && qkv.size(2) % (3 * num_heads) == 0,
              "qkv's last dimension must be 3 * heads * head_dim");
  const auto in_dtype = qkv.scalar_type();
  TORCH_CHECK(in_dtype == at::kFloat || in_dtype == at::kBFloat16,
              "qkv must be float32 or bfloat16");
  at::Tensor x = qkv.to(at::kFloat);
  if (x.stride(2) != 1) x = x.contiguous();
  const int64_t batch = x.size(0), seq = x.size(1), width = x.size(2) / 3;
  const int64_t dim = width / num_heads;
  at::Tensor mask;
  if (key_mask.has_value()) {
    TORCH_CHECK(key_mask->dim() == 2 && key_mask->size(0) == batch && key_mask->size(1) == seq,
                "key_mask must be [batch, seq]");
    mask = key_mask->to(at::kBool).contiguous();
  }
  // Keys to attend to, per batch row; a row with no valid key attends to all (as a softmax
  // over equal -inf-like biases would).
  std::vector<std::vector<int32_t>> keys(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const bool* m = mask.defined() ? mask.data_ptr<bool>() + b * seq : nullptr;
    for (int64_t j = 0; j < seq; ++j)
      if (m == nullptr || m[j]) keys[b].push_back(int32_t(j));
    if (keys[b].empty())
      for (int64_t j = 0; j < seq; ++j) keys[b].push_back(int32_t(j));
  }
  at::Tensor out = at::empty({batch, seq, width}, x.options());
  if (batch == 0 || seq == 0) return out.to(in_dtype);
  const HeadFn fn = pick(std::string(isa));
  const float* base = x.data_ptr<float>();
  float* obase = out.data_ptr<float>();
  const int64_t sb = x.stride(0), ss = x.stride(1);
  at::parallel_for(0, batch * num_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / num_heads, hd = t % num_heads;
      const float* row0 = base + b * sb + hd * dim;
      Head h{row0,
             row0 + width,
             row0 + 2 * width,
             ss,
             obase + b * seq * width + hd * dim,
             width,
             seq,
             dim,
             keys[b].data(),
             int64_t(keys[b].size()),
             float(scaling)};
      fn(h);
    }
  });
  return out.to(in_dtype);
}

std::vector<std::string> supported_isas() {
  std::vector<std::string> out;
  if (cpu_has_avx512_vnni()) out.emplace_back("avx512_vnni");
  if (cpu_has_avx2()) out.emplace_back("avx2");
  out.emplace_back("scalar");
  return out;
}

}  // namespace
}  // namespace squant_kernels

TORCH_LIBRARY(squant, m) {
  m.def(
      "int8_attention(Tensor qkv, Tensor? key_mask, int num_heads, float scaling, "
      "str isa=\"auto\") -> Tensor");
  m.def("int8_attention_isas() -> str[]", &squant_kernels::supported_isas);
}

TORCH_LIBRARY_IMPL(squant, CPU, m) { m.impl("int8_attention", &squant_kernels::int8_attention); }
