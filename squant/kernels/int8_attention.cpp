// INT8 self-attention for encoders on x86 CPUs: softmax(Q·Kᵀ·scale + key padding) · V.
//
// One call per attention layer, reading the fused QKV projection's output [B, S, 3·H·D] as it
// is (no transposes, no [B, H, S, S] score tensor in memory). Per (batch, head):
//   - K rows are quantized to s8 with one scale per key row (dynamic, from the row's |max|),
//     packed for the dot-product instruction of the path, with their column sums;
//   - Q rows are quantized the same way, four rows at a time;
//   - Q·Kᵀ runs in integers: exact s32 sums, then one float scale per (query, key) pair;
//   - softmax in FP32 over the valid keys only (padded keys are skipped, not masked);
//   - P·V in 16-bit integers (see kProbSteps below): INT8 probabilities would cost accuracy,
//     16-bit ones cost less than the Q·Kᵀ rounding does and do twice the multiply-adds of an
//     FP32 FMA per instruction;
//   - the output row is written where the attention-output GEMM reads it: [B, S, H·D].
//
// Paths, chosen at run time from what this CPU has (or forced by name, for tests):
//   "amx":         Q·Kᵀ and P·V on AMX tiles, 16 query rows a group (P·V as 8-bit digits,
//                  exact, see the AMX section); softmax as "avx512_vnni"; picked by "auto"
//                  where it measured faster (see pick);
//   "avx512_vnni": vpdpbusd, u8 (query + 128) x s8 (key), minus 128·Σkey, 16 keys per vector;
//                  P·V with vpdpwssd, 4 query rows x up to 64 value columns per tile;
//   "avx2":        vpmaddwd on s16-widened values (exact, no vpmaddubsw saturation), 6 query
//                  rows x 16 keys (or 16 value columns) per register tile;
//   "scalar":      plain C++ (any CPU, and the reference the vector paths must agree with).
// All three compute the same integer dot products (Q·Kᵀ and P·V); only exp() and float
// summation order differ, so a 16-bit probability may differ by one step between paths.
// The vector paths are compiled with per-function target attributes, so this file builds on
// any x86-64 compiler and host, and a path only runs where cpuid says the CPU has it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include "internal.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
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

// Scratch memory for the vector paths' heads, one arena per thread: a head took a dozen
// buffers from malloc and gave them back (3% of the AVX512-VNNI path's perf samples at
// MiniLM's 32-dim heads went to malloc's frees and consolidation). Standalone attention on an
// AMX Xeon, same process, outputs equal, against a buffer from malloc per take: 0.95x the time
// at 8 x 128 x 12 x 32 (AVX512-VNNI), 0.92x at 1 x 128 x 12 x 32 (AVX512-VNNI and AMX), 0.97x
// at 1 x 256 x 12 x 64, 0.97-0.99x on the AVX2 path. Buffers start on cache lines (see
// CacheLineAllocator) and live until the thread starts its next head. A head that
// needs more than the arena's block gets another; the next head then starts with one block
// the size of all of them, so after the first head of a shape no call allocates.
template <typename T>
struct Scratch {
  T* p;
  T* data() const { return p; }
  T& operator[](int64_t i) const { return p[i]; }
};

class HeadArena {
 public:
  // This thread's arena, emptied: the buffers of the head before are dead from here on.
  static HeadArena& start_head() {
    thread_local HeadArena arena;
    arena.reset();
    return arena;
  }
  template <typename T>
  Scratch<T> take(int64_t count) {  // uninitialized
    const std::size_t bytes =
        (std::size_t(count) * sizeof(T) + kCacheLine - 1) / kCacheLine * kCacheLine;
    if (blocks_.empty() || used_ + bytes > blocks_.back().size) {
      blocks_.push_back(Block{alloc(std::max(bytes, kMinBlock)), std::max(bytes, kMinBlock)});
      used_ = 0;
    }
    T* out = reinterpret_cast<T*>(blocks_.back().p + used_);
    used_ += bytes;
    return Scratch<T>{out};
  }
  template <typename T>
  Scratch<T> take(int64_t count, T fill) {
    Scratch<T> out = take<T>(count);
    std::fill(out.p, out.p + count, fill);
    return out;
  }
  HeadArena() = default;
  HeadArena(const HeadArena&) = delete;
  HeadArena& operator=(const HeadArena&) = delete;
  ~HeadArena() {
    for (const Block& b : blocks_) free(b);
  }

 private:
  struct Block {
    char* p;
    std::size_t size;
  };
  static constexpr std::size_t kMinBlock = 64 * 1024;
  static char* alloc(std::size_t size) { return CacheLineAllocator<char>().allocate(size); }
  static void free(const Block& b) { CacheLineAllocator<char>().deallocate(b.p, b.size); }
  void reset() {
    used_ = 0;
    if (blocks_.size() <= 1) return;
    std::size_t total = 0;
    for (const Block& b : blocks_) {
      total += b.size;
      free(b);
    }
    blocks_.assign(1, Block{alloc(total), total});
  }
  std::vector<Block> blocks_;
  std::size_t used_ = 0;
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

// P·V in 16-bit integers, on every path:
//   - the normalized probabilities p / Σp <= 1 as s16 with one fixed step, 1 / kProbSteps (an
//     absolute error <= 1.5e-5 per probability, where u8 probabilities would be 2e-3), and the
//     row's sums divided by Σ_j p_q, the quantized probabilities' own total: rounding n equal
//     probabilities up would otherwise scale the output by up to 1 + n / (2 · kProbSteps);
//   - V with one scale per column (|max| / kValueSteps) per (batch, head): 15-bit values;
//   - exact s32 sums: Σ_j p_q <= kProbSteps + n / 2, so |Σ_j p_q · v_q| < 2^31 for any n
//     under kMaxKeys, where also the largest probability (>= 1 / n) never rounds to 0.
// Values are packed as key pairs for vpmaddwd / vpdpwssd, in blocks of 16 columns (one zmm,
// two ymm) so a tile walks its block's memory in order: see value_index. The head dim is
// padded with zero columns to dv (a multiple of 16), odd n by a zero key; the output is
// Σ_j p_q · v_q times vscale[c] (the column's scale) / Σ_j p_q.
constexpr float kProbSteps = 32767.f;
constexpr float kValueSteps = 16383.f;
constexpr int64_t kMaxKeys = 65000;
constexpr int64_t kValueBlock = 16;

inline int64_t padded_value_dim(int64_t d) { return (d + kValueBlock - 1) / kValueBlock * kValueBlock; }

// Where key j's column c lives in the packed values of a head with `pairs` key pairs.
inline int64_t value_index(int64_t pairs, int64_t j, int64_t c) {
  return (c / kValueBlock) * pairs * 2 * kValueBlock + (j / 2) * 2 * kValueBlock +
         (c % kValueBlock) * 2 + j % 2;
}

inline int16_t round_s16(float x, float limit) {
  return static_cast<int16_t>(std::min<long>(long(limit), std::max<long>(-long(limit), std::lrint(x))));
}

// Column |max| -> inv (1 / scale, 0 on padded columns) and vscale (the scale); every path's.
inline void value_scales(const float* amax, int64_t d, int64_t dv, float* inv, float* vscale) {
  std::fill(inv, inv + dv, 0.f);
  std::fill(vscale, vscale + dv, 0.f);
  for (int64_t c = 0; c < d; ++c) {
    const float scale = amax[c] > 0.f ? amax[c] / kValueSteps : 1.f;
    inv[c] = 1.f / scale;
    vscale[c] = scale;
  }
}

void quantize_values(const Head& h, std::vector<int16_t>& vq, std::vector<float>& vscale) {
  const int64_t n = h.n_keys, d = h.dim, pairs = (n + 1) / 2, dv = padded_value_dim(d);
  std::vector<float> amax(dv, 0.f), inv(dv);
  for (int64_t j = 0; j < n; ++j) {
    const float* vr = h.v + h.keys[j] * h.stride;
    for (int64_t c = 0; c < d; ++c) amax[c] = std::max(amax[c], std::fabs(vr[c]));
  }
  vscale.resize(dv);
  value_scales(amax.data(), d, dv, inv.data(), vscale.data());
  vq.assign(pairs * 2 * dv, 0);
  for (int64_t j = 0; j < n; ++j) {
    const float* vr = h.v + h.keys[j] * h.stride;
    for (int64_t c = 0; c < d; ++c) vq[value_index(pairs, j, c)] = round_s16(vr[c] * inv[c], kValueSteps);
  }
}

// ------------------------------------------------------------------------------------------
// scalar path

void head_scalar(const Head& h) {
  const int64_t n = h.n_keys, d = h.dim, pairs = (n + 1) / 2;
  std::vector<int8_t> kq(n * d), qq(d);
  std::vector<float> ks(n), p(n), vscale;
  std::vector<int16_t> vq, pq(2 * pairs, 0);
  std::vector<int32_t> acc(d);
  for (int64_t j = 0; j < n; ++j) ks[j] = quantize_row(h.k + h.keys[j] * h.stride, d, &kq[j * d]);
  quantize_values(h, vq, vscale);
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
    const float k = kProbSteps / sum;
    int32_t total = 0;
    for (int64_t j = 0; j < n; ++j) total += (pq[j] = round_s16(p[j] * k, kProbSteps));
    const float inv_total = 1.f / float(total);
    std::fill(acc.begin(), acc.end(), 0);
    for (int64_t j = 0; j < 2 * pairs; ++j)
      for (int64_t c = 0; c < d; ++c) acc[c] += int32_t(pq[j]) * int32_t(vq[value_index(pairs, j, c)]);
    float* o = h.out + i * h.out_stride;
    for (int64_t c = 0; c < d; ++c) o[c] = float(acc[c]) * vscale[c] * inv_total;
  }
}

// ------------------------------------------------------------------------------------------
// AVX2 path

#define SQ_AVX2 __attribute__((target("avx2,fma")))

// exp(x) for x <= 0 (softmax after subtracting the max): Cephes' polynomial, |rel err| ~1e-7.
SQ_AVX2 inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-86.f));  // 2^n >= 2^-124: no subnormal results
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

// The value columns' |max| over the head's keys -> inv and vscale (value_scales), 8 columns a
// step; every vector path's value quantization starts here.
// inv and vscale: padded_value_dim(d) floats each; amax's from the arena.
SQ_AVX2 void value_column_scales_avx2(const Head& h, HeadArena& arena, float* inv,
                                      float* vscale) {
  const int64_t n = h.n_keys, d = h.dim, d8 = d / 8 * 8, dv = padded_value_dim(d);
  const __m256 sign = _mm256_set1_ps(-0.f);
  const Scratch<float> amax = arena.take<float>(dv, 0.f);
  // 32 columns at a time in registers over all keys, not a running |max| stored and reloaded
  // per key (this pass was 5-6% of the AVX512-VNNI head's perf samples at 32 dims; the change
  // measured within noise)
  for (int64_t c0 = 0; c0 < d8; c0 += 32) {
    const int64_t k = std::min<int64_t>(4, (d8 - c0) / 8);
    __m256 m0 = _mm256_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
    for (int64_t j = 0; j < n; ++j) {
      const float* vr = h.v + h.keys[j] * h.stride + c0;
      m0 = _mm256_max_ps(m0, _mm256_andnot_ps(sign, _mm256_loadu_ps(vr)));
      if (k > 1) m1 = _mm256_max_ps(m1, _mm256_andnot_ps(sign, _mm256_loadu_ps(vr + 8)));
      if (k > 2) m2 = _mm256_max_ps(m2, _mm256_andnot_ps(sign, _mm256_loadu_ps(vr + 16)));
      if (k > 3) m3 = _mm256_max_ps(m3, _mm256_andnot_ps(sign, _mm256_loadu_ps(vr + 24)));
    }
    const __m256 m[4] = {m0, m1, m2, m3};
    for (int64_t i = 0; i < k; ++i) _mm256_storeu_ps(&amax[c0 + 8 * i], m[i]);
  }
  for (int64_t j = 0; j < n && d8 < d; ++j) {
    const float* vr = h.v + h.keys[j] * h.stride;
    for (int64_t c = d8; c < d; ++c) amax[c] = std::max(amax[c], std::fabs(vr[c]));
  }
  value_scales(amax.data(), d, dv, inv, vscale);
}

// quantize_values with AVX2: 8 columns per step, two keys' columns interleaved as s16 pairs.
struct QuantizedValues {
  Scratch<int16_t> q;  // at value_index
  Scratch<float> scale;  // per column, padded_value_dim(d) of them
};

SQ_AVX2 QuantizedValues quantize_values_avx2(const Head& h, HeadArena& arena) {
  const int64_t n = h.n_keys, d = h.dim, pairs = (n + 1) / 2, d8 = d / 8 * 8;
  const int64_t dv = padded_value_dim(d);
  const Scratch<float> inv = arena.take<float>(dv), vscale = arena.take<float>(dv);
  value_column_scales_avx2(h, arena, inv.data(), vscale.data());
  const Scratch<int16_t> vq = arena.take<int16_t>(pairs * 2 * dv, 0);
  const __m256i lo = _mm256_set1_epi32(-int(kValueSteps)), hi = _mm256_set1_epi32(int(kValueSteps));
  const __m256i low16 = _mm256_set1_epi32(0xffff);
  for (int64_t jp = 0; jp < pairs; ++jp) {
    const float* a = h.v + h.keys[2 * jp] * h.stride;
    const float* b = 2 * jp + 1 < n ? h.v + h.keys[2 * jp + 1] * h.stride : nullptr;
    for (int64_t c = 0; c < d8; c += 8) {
      const __m256 s = _mm256_loadu_ps(&inv[c]);
      const __m256i qa = _mm256_min_epi32(
          _mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(a + c), s)), lo), hi);
      const __m256i qb = b == nullptr ? _mm256_setzero_si256() : _mm256_min_epi32(
          _mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(b + c), s)), lo), hi);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(&vq[value_index(pairs, 2 * jp, c)]),
                          _mm256_or_si256(_mm256_and_si256(qa, low16), _mm256_slli_epi32(qb, 16)));
    }
    for (int64_t c = d8; c < d; ++c) {
      vq[value_index(pairs, 2 * jp, c)] = round_s16(a[c] * inv[c], kValueSteps);
      if (b != nullptr) vq[value_index(pairs, 2 * jp + 1, c)] = round_s16(b[c] * inv[c], kValueSteps);
    }
  }
  return QuantizedValues{vq, vscale};
}

// Softmax of R rows, side by side: row r's n scores at p[r] (max m[r]) <- exp(p - m) in place,
// then out[r][0, n) <- round(exp · k) as s16 with k = kProbSteps / Σ exp (so <= kProbSteps),
// out[r][n] <- 0 when n is odd, inv_total[r] <- 1 / Σ out[r]. The tail of n % 8 values goes
// through std::exp and round_s16. Row by row, each pass ended in a horizontal sum and a
// division the next pass waited for; with R rows in flight they overlap (see
// softmax_rows_vnni for the measurement).
template <int R>
SQ_AVX2 void softmax_rows_avx2(float* const* p, int64_t n, const float* m, int16_t* const* out,
                               float* inv_total) {
  __m256 vs[R];
  for (int r = 0; r < R; ++r) vs[r] = _mm256_setzero_ps();
  const int64_t full = n / 8 * 8;
  for (int64_t j = 0; j < full; j += 8) {
    for (int r = 0; r < R; ++r) {
      const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p[r] + j), _mm256_set1_ps(m[r])));
      _mm256_storeu_ps(p[r] + j, e);
      vs[r] = _mm256_add_ps(vs[r], e);
    }
  }
  float k[R];
  for (int r = 0; r < R; ++r) {
    float sum = hsum256(vs[r]);
    for (int64_t j = full; j < n; ++j) sum += (p[r][j] = std::exp(p[r][j] - m[r]));
    k[r] = kProbSteps / sum;
  }
  __m256i vt[R];
  for (int r = 0; r < R; ++r) vt[r] = _mm256_setzero_si256();
  for (int64_t j = 0; j < full; j += 8) {
    for (int r = 0; r < R; ++r) {
      const __m256i q =
          _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p[r] + j), _mm256_set1_ps(k[r])));
      vt[r] = _mm256_add_epi32(vt[r], q);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out[r] + j),
                       _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vt[r]);
    int32_t total = 0;
    for (int t = 0; t < 8; ++t) total += lanes[t];
    for (int64_t j = full; j < n; ++j) total += (out[r][j] = round_s16(p[r][j] * k[r], kProbSteps));
    if (n % 2) out[r][n] = 0;
    inv_total[r] = 1.f / float(total);
  }
}

// The Q·Kᵀ register tile: 6 query rows x one block of 16 keys, 12 s32 accumulators;
// s[2r + half] = Σ_c qp[c][r] · keys (half · 8, half · 8 + 8) over the pairs of dims c (2 key
// loads, 6 broadcasts, 12 vpmaddwd each). Named accumulators and out of line: with an array,
// or inlined where the caller keeps other vectors live, GCC kept an accumulator in memory, a
// store/load chain that halved the loop's speed.
static_assert(kRowsAvx2 == 6, "dot_tile_avx2 is written for 6 rows");
SQ_AVX2 __attribute__((noinline)) void dot_tile_avx2(const int32_t* qp, int64_t pairs,
                                                    const int16_t* kb, __m256i* s) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0;
  __m256i d0 = a0, d1 = a0, e0 = a0, e1 = a0, f0 = a0, f1 = a0;
  for (int64_t c = 0; c < pairs; ++c) {
    const __m256i k0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb + c * 32));
    const __m256i k1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb + c * 32 + 16));
    const int32_t* q = qp + c * kRowsAvx2;
#define SQ_ROW(x0, x1, r)                                          \
  {                                                                \
    const __m256i qv = _mm256_set1_epi32(q[r]);                    \
    x0 = _mm256_add_epi32(x0, _mm256_madd_epi16(qv, k0));          \
    x1 = _mm256_add_epi32(x1, _mm256_madd_epi16(qv, k1));          \
  }
    SQ_ROW(a0, a1, 0) SQ_ROW(b0, b1, 1) SQ_ROW(c0, c1, 2)
    SQ_ROW(d0, d1, 3) SQ_ROW(e0, e1, 4) SQ_ROW(f0, f1, 5)
#undef SQ_ROW
  }
  s[0] = a0, s[1] = a1, s[2] = b0, s[3] = b1, s[4] = c0, s[5] = c1;
  s[6] = d0, s[7] = d1, s[8] = e0, s[9] = e1, s[10] = f0, s[11] = f1;
}

inline int32_t load_pair(const int16_t* x) {
  int32_t v;
  std::memcpy(&v, x, sizeof(v));
  return v;
}

// The P·V register tile: 6 query rows x one block of 16 value columns, 12 s32 accumulators;
// s[2r + half] = Σ_jp pq[r] pair jp · vb pair jp (half · 8, half · 8 + 8) (2 value loads, 6
// broadcasts, 12 vpmaddwd per pair of keys). Written like dot_tile_avx2, for the same reason.
SQ_AVX2 __attribute__((noinline)) void weighted_sum_tile_avx2(const int16_t* const* pq,
                                                             const int16_t* vb, int64_t pairs,
                                                             __m256i* s) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0;
  __m256i d0 = a0, d1 = a0, e0 = a0, e1 = a0, f0 = a0, f1 = a0;
  const int16_t *p0 = pq[0], *p1 = pq[1], *p2 = pq[2], *p3 = pq[3], *p4 = pq[4], *p5 = pq[5];
  for (int64_t jp = 0; jp < pairs; ++jp) {
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vb + jp * 32));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vb + jp * 32 + 16));
#define SQ_ROW(x0, x1, pr)                                         \
  {                                                                \
    const __m256i x = _mm256_set1_epi32(load_pair(pr + 2 * jp));   \
    x0 = _mm256_add_epi32(x0, _mm256_madd_epi16(x, v0));           \
    x1 = _mm256_add_epi32(x1, _mm256_madd_epi16(x, v1));           \
  }
    SQ_ROW(a0, a1, p0) SQ_ROW(b0, b1, p1) SQ_ROW(c0, c1, p2)
    SQ_ROW(d0, d1, p3) SQ_ROW(e0, e1, p4) SQ_ROW(f0, f1, p5)
#undef SQ_ROW
  }
  s[0] = a0, s[1] = a1, s[2] = b0, s[3] = b1, s[4] = c0, s[5] = c1;
  s[6] = d0, s[7] = d1, s[8] = e0, s[9] = e1, s[10] = f0, s[11] = f1;
}

// o[r][c0, c0 + 16) = the P·V tile's sums · vscale · inv_total[r] (1 / Σ p_q of row r);
// columns at or past d are not written.
SQ_AVX2 void store_weighted_sums_avx2(const __m256i* sums, int64_t d, int64_t c0,
                                      const float* vscale, const float* inv_total,
                                      float* const* o) {
  for (int w = 0; w < 2; ++w) {
    const int64_t c = c0 + 8 * w, valid = std::min<int64_t>(8, d - c);
    if (valid <= 0) break;
    const __m256 s = _mm256_loadu_ps(vscale + c);
    for (int r = 0; r < kRowsAvx2; ++r) {
      const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(sums[2 * r + w]),
                                     _mm256_mul_ps(s, _mm256_set1_ps(inv_total[r])));
      if (valid == 8) {
        _mm256_storeu_ps(o[r] + c, f);
      } else {
        float tmp[8];
        _mm256_storeu_ps(tmp, f);
        std::memcpy(o[r] + c, tmp, valid * sizeof(float));
      }
    }
  }
}

// Keys packed for vpmaddwd: [block of 16 keys][pair of dims][key][2] as s16 (dims padded to
// even); queries as s16 pairs; the tiles are dot_tile_avx2 (Q·Kᵀ) and weighted_sum_tile_avx2
// (P·V).
SQ_AVX2 void head_avx2(const Head& h) {
  constexpr int64_t kKeys = 16;
  constexpr int R = kRowsAvx2;
  const int64_t n = h.n_keys, d = h.dim, dp = (d + 1) / 2 * 2, pairs = dp / 2;
  const int64_t blocks = (n + kKeys - 1) / kKeys, width = blocks * kKeys;
  HeadArena& arena = HeadArena::start_head();
  const Scratch<int16_t> kp = arena.take<int16_t>(blocks * pairs * 2 * kKeys, 0);
  const int64_t vpairs = (n + 1) / 2;
  const Scratch<float> ks = arena.take<float>(width, 0.f), p = arena.take<float>(R * width);
  const Scratch<int16_t> pq = arena.take<int16_t>(R * 2 * vpairs);
  const QuantizedValues values = quantize_values_avx2(h, arena);
  const Scratch<int16_t> vq = values.q;
  const Scratch<float> vscale = values.scale;
  const Scratch<int8_t> row = arena.take<int8_t>(dp, 0);
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = h.k + h.keys[j] * h.stride;
    ks[j] = quantize_row_avx2(kr, d, row.data());
    int16_t* dst = &kp[(j / kKeys) * pairs * 2 * kKeys + (j % kKeys) * 2];
    for (int64_t c = 0; c < pairs; ++c) {
      dst[c * 2 * kKeys] = row[2 * c];
      dst[c * 2 * kKeys + 1] = row[2 * c + 1];
    }
  }
  // Query rows as s16 pairs, one int32 per pair (the broadcast operand of vpmaddwd), stored
  // [pair][row] so the tile broadcasts its 6 rows from one place.
  const Scratch<int32_t> qp = arena.take<int32_t>(pairs * R);
  const Scratch<int8_t> qrow = arena.take<int8_t>(dp, 0);
  float qs[R];
  for (int64_t i0 = 0; i0 < h.seq; i0 += R) {
    // A short last tile repeats its last row: the repeats compute (and write) the same values.
    const int64_t rows = std::min<int64_t>(R, h.seq - i0);
    for (int64_t r = 0; r < rows; ++r) {
      qs[r] = quantize_row_avx2(h.q + (i0 + r) * h.stride, d, qrow.data()) * h.scaling;
      for (int64_t c = 0; c < pairs; ++c) {
        const uint16_t lo = uint16_t(int16_t(qrow[2 * c]));
        const uint16_t hi = uint16_t(int16_t(qrow[2 * c + 1]));
        qp[c * R + r] = int32_t(uint32_t(lo) | (uint32_t(hi) << 16));
      }
    }
    for (int64_t r = rows; r < R; ++r) {
      qs[r] = qs[rows - 1];
      for (int64_t c = 0; c < pairs; ++c) qp[c * R + r] = qp[c * R + rows - 1];
    }
    // Scores, and each row's max over its n keys (the padded tail of the last block is -inf).
    __m256 vmax[R];
    for (int r = 0; r < R; ++r) vmax[r] = _mm256_set1_ps(-INFINITY);
    for (int64_t b = 0; b < blocks; ++b) {
      __m256i sums[2 * R];
      dot_tile_avx2(qp.data(), pairs, &kp[b * pairs * 2 * kKeys], sums);
      for (int half = 0; half < 2; ++half) {
        const int64_t j0 = b * kKeys + 8 * half;
        const __m256 kscale = _mm256_loadu_ps(&ks[j0]);
        const __m256 valid = _mm256_castsi256_ps(
            _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::min<int64_t>(n - j0, 8))),
                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
        for (int r = 0; r < R; ++r) {
          __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(sums[2 * r + half]),
                                   _mm256_mul_ps(kscale, _mm256_set1_ps(qs[r])));
          f = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), f, valid);
          vmax[r] = _mm256_max_ps(vmax[r], f);
          _mm256_storeu_ps(&p[r * width + j0], f);
        }
      }
    }
    int16_t* prob_rows[R];
    float* sr[R];
    float* o[R];
    float inv_total[R], row_max[R];
    for (int64_t r = 0; r < R; ++r) {
      const int64_t rr = std::min(r, rows - 1);
      row_max[r] = hmax256(vmax[rr]);
      sr[r] = &p[rr * width];
      prob_rows[r] = &pq[rr * 2 * vpairs];
      o[r] = h.out + (i0 + rr) * h.out_stride;
    }
    // three rows at a time: six rows' sums, maxima and exp() constants overflow the 16 ymm
    // registers
    for (int64_t r = 0; r < rows; r += 3) {
      switch (std::min<int64_t>(3, rows - r)) {
        case 3: softmax_rows_avx2<3>(sr + r, n, row_max + r, prob_rows + r, inv_total + r); break;
        case 2: softmax_rows_avx2<2>(sr + r, n, row_max + r, prob_rows + r, inv_total + r); break;
        default: softmax_rows_avx2<1>(sr + r, n, row_max + r, prob_rows + r, inv_total + r);
      }
    }
    for (int64_t r = rows; r < R; ++r) inv_total[r] = inv_total[rows - 1];
    for (int64_t c = 0; c < d; c += kValueBlock) {
      __m256i sums[2 * R];
      weighted_sum_tile_avx2(prob_rows, &vq[value_index(vpairs, 0, c)], vpairs, sums);
      store_weighted_sums_avx2(sums, d, c, vscale.data(), inv_total, o);
    }
  }
}

// ------------------------------------------------------------------------------------------
// AVX512-VNNI path

#define SQ_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))

// acc + the dot products of u8 (a) and s8 (b) quads, and of s16 pairs: vpdpbusd and vpdpwssd
// as inline assembly that updates acc in its register. With the intrinsics GCC 12 copied
// every accumulator to a new register and back on each step of a loop (two moves per
// vpdpwssd in the P·V tile), and the loop ran on those moves.
SQ_VNNI inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

SQ_VNNI inline __m512i dpwssd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// exp(x) for x <= 0 (softmax after subtracting the max): x·log2(e) = n + f, |f| <= 1/2,
// 2^f by its degree-5 Taylor polynomial (relative error <= 2.4e-6, a tenth of a probability
// step), times 2^n by scalef: 9 instructions, where a Cephes-style exp takes 16 (this loop is
// a quarter of the kernel's time). The clamp keeps n >= -124: a subnormal result would cost
// a microcode assist per instruction on Intel cores.
SQ_VNNI inline __m512 exp512(__m512 x) {
  const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-86.f)),
                                 _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.3333558146428443e-3f);  // ln2^5 / 5!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2402265069591007f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471805599453f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// Rows of one head are a few cache lines each, a whole token's Q|K|V (3·H·D floats) apart:
// too far for the hardware prefetcher to follow, so each row is fetched a few rows ahead.
constexpr int64_t kAhead = 8;

inline void prefetch_row(const float* row, int64_t d) {
  for (int64_t c = 0; c < d; c += 16) _mm_prefetch(reinterpret_cast<const char*>(row + c), _MM_HINT_T0);
}

// Where quantize_rows_words puts word w of row j:
//   words[(j / 16) · block + (j % 16) · row + w · word]
// (keys: 16 rows side by side in a block; queries: one row after another).
struct WordLayout {
  int64_t block, row, word;
};

// quantize_row with AVX512 (the same rounding) for `rows` rows (row j at x + (index ? index[j] :
// j) · stride, n values each), written straight from registers as 4-byte words (word w = dims
// 4w to 4w + 3) where `at` says, each byte XORed with `flip` (0x80 gives u8 = s8 + 128); the
// bytes past n in a row's last word are 0 ^ flip, words past it are not written. scales[j] =
// row j's scale; comp[j] = 128 · Σ of its integers (the u8 · s8 compensation), when given.
// 16 rows a step, in passes (|max|, scales, integers), so that the rows' reductions and
// divisions overlap: row by row, that chain made quantization 20% of the AVX512-VNNI head's
// time at 32 dims. And a row stored byte-masked, then read back as words, made the reads wait
// for the stores (store forwarding fails there).
SQ_VNNI void quantize_rows_words(const float* x, int64_t stride, const int32_t* index,
                                 int64_t rows, int64_t n, int32_t* words, WordLayout at,
                                 uint8_t flip, float* scales, int32_t* comp) {
  const int64_t full = n / 16 * 16;
  const __mmask16 tail = __mmask16((1u << (n - full)) - 1);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m128i vflip = _mm_set1_epi8(char(flip));
  const int ws = int(at.word);
  const __m128i spread = _mm_setr_epi32(0, ws, 2 * ws, 3 * ws);
  auto row = [&](int64_t j) { return x + (index != nullptr ? index[j] : j) * stride; };
  alignas(64) float amax[16], inv[16];
  for (int64_t j0 = 0; j0 < rows; j0 += 16) {
    const int64_t count = std::min<int64_t>(16, rows - j0);
    for (int64_t r = 0; r < 16; ++r) {
      if (r >= count) {
        amax[r] = 0.f;
        continue;
      }
      if (j0 + r + kAhead < rows) prefetch_row(row(j0 + r + kAhead), n);
      const float* xr = row(j0 + r);
      __m512 vmax = _mm512_setzero_ps();
      for (int64_t i = 0; i < full; i += 16)
        vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(xr + i)));
      vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_maskz_loadu_ps(tail, xr + full)));
      amax[r] = _mm512_reduce_max_ps(vmax);
    }
    // quantize_row's divisions, 16 rows at once: scale = |max| / 127 (1 for an all-zero row)
    const __m512 a = _mm512_load_ps(amax);
    const __m512 scale = _mm512_mask_div_ps(_mm512_set1_ps(1.f),
                                            _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_GT_OQ),
                                            a, _mm512_set1_ps(127.f));
    _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.f), scale));
    _mm512_mask_storeu_ps(scales + j0, __mmask16((1u << count) - 1), scale);
    for (int64_t r = 0; r < count; ++r) {
      const float* xr = row(j0 + r);
      int32_t* dst = words + j0 / 16 * at.block + r * at.row;
      const __m512 vinv = _mm512_set1_ps(inv[r]);
      __m512i vsum = _mm512_setzero_si512();
      for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = i < full ? __mmask16(0xffff) : tail;
        // nearest-even, as lrint in the scalar path
        __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), vinv));
        q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
        vsum = _mm512_add_epi32(vsum, q);
        const __m128i bytes = _mm_xor_si128(_mm512_cvtepi32_epi8(q), vflip);
        const __mmask8 wm = __mmask8((1u << ((std::min<int64_t>(16, n - i) + 3) / 4)) - 1);
        int32_t* w = dst + i / 4 * at.word;
        if (at.word == 1) _mm_mask_storeu_epi32(w, wm, bytes);
        else _mm_mask_i32scatter_epi32(w, wm, spread, bytes, 4);
      }
      if (comp != nullptr) comp[j0 + r] = 128 * _mm512_reduce_add_epi32(vsum);
    }
  }
}

// In place: p[0, n) <- exp(p - m); returns the sum (the tail of n % 16 values by std::exp).
SQ_VNNI float softmax_exp_vnni(float* p, int64_t n, float m) {
  const __m512 bm = _mm512_set1_ps(m);
  __m512 vs = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(p + j), bm));
    _mm512_storeu_ps(p + j, e);
    vs = _mm512_add_ps(vs, e);
  }
  float sum = _mm512_reduce_add_ps(vs);
  for (; j < n; ++j) sum += (p[j] = std::exp(p[j] - m));
  return sum;
}

// The P·V tile: kRows query rows x W blocks of 16 value columns from c0, one vpdpwssd per
// (row, block, pair of keys); o[r][c] = sums · vscale[c] · inv_total[r], columns past d not
// written.
template <int W>
SQ_VNNI __attribute__((noinline)) void weighted_sum_tile_vnni(
    const int16_t* const* pq, const int16_t* vq, int64_t pairs, int64_t d, int64_t c0,
    const float* vscale, const float* inv_total, float* const* o) {
  __m512i acc[kRows][W];
  const int16_t* vb[W];
  for (int w = 0; w < W; ++w) vb[w] = vq + value_index(pairs, 0, c0 + kValueBlock * w);
  for (int r = 0; r < kRows; ++r)
    for (int w = 0; w < W; ++w) acc[r][w] = _mm512_setzero_si512();
  for (int64_t jp = 0; jp < pairs; ++jp) {
    __m512i v[W];
    for (int w = 0; w < W; ++w) v[w] = _mm512_loadu_si512(vb[w] + jp * 2 * kValueBlock);
    for (int r = 0; r < kRows; ++r) {
      const __m512i x = _mm512_set1_epi32(load_pair(pq[r] + 2 * jp));
      for (int w = 0; w < W; ++w) acc[r][w] = dpwssd(acc[r][w], x, v[w]);
    }
  }
  for (int w = 0; w < W; ++w) {
    const int64_t c = c0 + kValueBlock * w, valid = std::min<int64_t>(kValueBlock, d - c);
    if (valid <= 0) break;
    const __m512 s = _mm512_loadu_ps(vscale + c);
    const __mmask16 mask = valid == kValueBlock ? __mmask16(0xffff) : __mmask16((1u << valid) - 1);
    for (int r = 0; r < kRows; ++r)
      _mm512_mask_storeu_ps(o[r] + c, mask, _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][w]),
                                                          _mm512_mul_ps(s, _mm512_set1_ps(inv_total[r]))));
  }
}

// softmax_rows_avx2 with AVX512, 16 values a step (the same rounding and results; the tail of
// n % 16 exp values by std::exp, as softmax_exp_vnni). Row by row, each pass ended in a
// horizontal sum and a division that the next pass waited for; with the rows side by side those
// overlap: standalone attention at MiniLM's shapes (AMX Xeon, same process, outputs equal)
// took 0.976x (8 x 128 x 12 x 32) and 0.949x (1 x 256 x 12 x 64) the time of row by row, and
// the AVX2 path 0.93x and 0.97x.
template <int R>
SQ_VNNI void softmax_rows_vnni(float* const* p, int64_t n, const float* m, int16_t* const* out,
                               float* inv_total) {
  __m512 vs[R], bm[R];
  for (int r = 0; r < R; ++r) {
    vs[r] = _mm512_setzero_ps();
    bm[r] = _mm512_set1_ps(m[r]);
  }
  const int64_t full = n / 16 * 16;
  for (int64_t j = 0; j < full; j += 16) {
    for (int r = 0; r < R; ++r) {
      const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(p[r] + j), bm[r]));
      _mm512_storeu_ps(p[r] + j, e);
      vs[r] = _mm512_add_ps(vs[r], e);
    }
  }
  __m512 vk[R];
  __m512i vt[R];
  for (int r = 0; r < R; ++r) {
    float sum = _mm512_reduce_add_ps(vs[r]);
    for (int64_t j = full; j < n; ++j) sum += (p[r][j] = std::exp(p[r][j] - m[r]));
    vk[r] = _mm512_set1_ps(kProbSteps / sum);
    vt[r] = _mm512_setzero_si512();
  }
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
    for (int r = 0; r < R; ++r) {
      const __m512i q =
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, p[r] + j), vk[r]));
      vt[r] = _mm512_add_epi32(vt[r], q);
      _mm256_mask_storeu_epi16(out[r] + j, mask, _mm512_cvtepi32_epi16(q));  // q <= kProbSteps
    }
  }
  for (int r = 0; r < R; ++r) {
    if (n % 2) out[r][n] = 0;
    inv_total[r] = 1.f / float(_mm512_reduce_add_epi32(vt[r]));
  }
}

// Softmax and P·V for up to kRows query rows: row r's scores at scores + r · score_stride
// (n of them), its output at out + r · out_stride; a short group repeats its last row (the
// repeats compute, and write, the same values). pq: kRows rows of 2·vpairs s16 scratch.
SQ_VNNI void attend_rows(float* scores, int64_t score_stride, const float* row_max, int64_t rows,
                         int64_t n, int64_t d, int64_t vpairs, int16_t* pq, const int16_t* vq,
                         const float* vscale, float* out, int64_t out_stride) {
  static_assert(kRows == 4, "attend_rows dispatches 1 to 4 rows");
  int16_t* prob_rows[kRows];
  float* sr[kRows];
  float* o[kRows];
  float inv_total[kRows];
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t rr = std::min(r, rows - 1);
    sr[r] = scores + rr * score_stride;
    prob_rows[r] = &pq[rr * 2 * vpairs];
    o[r] = out + rr * out_stride;
  }
  switch (rows) {
    case 4: softmax_rows_vnni<4>(sr, n, row_max, prob_rows, inv_total); break;
    case 3: softmax_rows_vnni<3>(sr, n, row_max, prob_rows, inv_total); break;
    case 2: softmax_rows_vnni<2>(sr, n, row_max, prob_rows, inv_total); break;
    default: softmax_rows_vnni<1>(sr, n, row_max, prob_rows, inv_total);
  }
  for (int64_t r = rows; r < kRows; ++r) inv_total[r] = inv_total[rows - 1];
  for (int64_t c = 0; c < d; c += 4 * kValueBlock) {
    switch (std::min<int64_t>(4, (d - c + kValueBlock - 1) / kValueBlock)) {
      case 4: weighted_sum_tile_vnni<4>(prob_rows, vq, vpairs, d, c, vscale, inv_total, o); break;
      case 3: weighted_sum_tile_vnni<3>(prob_rows, vq, vpairs, d, c, vscale, inv_total, o); break;
      case 2: weighted_sum_tile_vnni<2>(prob_rows, vq, vpairs, d, c, vscale, inv_total, o); break;
      default: weighted_sum_tile_vnni<1>(prob_rows, vq, vpairs, d, c, vscale, inv_total, o);
    }
  }
}

// Keys packed for vpdpbusd: [block of 16 keys][quad of dims][key] as s8 words (4 dims each,
// zero past d); the head's queries as u8 words, one row of `quads` words per query.
SQ_VNNI void head_vnni(const Head& h) {
  const int64_t n = h.n_keys, d = h.dim, quads = (d + 3) / 4;
  const int64_t blocks = (n + 15) / 16;
  HeadArena& arena = HeadArena::start_head();
  const Scratch<int32_t> kp = arena.take<int32_t>(blocks * quads * 16, 0);
  // 128 · Σ key, removed from the u8 · s8 sums
  const Scratch<int32_t> kcomp = arena.take<int32_t>(blocks * 16, 0);
  const int64_t vpairs = (n + 1) / 2;
  const Scratch<float> ks = arena.take<float>(blocks * 16, 0.f);
  const Scratch<float> p = arena.take<float>(kRows * blocks * 16);
  const Scratch<int16_t> pq = arena.take<int16_t>(kRows * 2 * vpairs);
  // AVX2 is enough: once per head, not per query
  const QuantizedValues values = quantize_values_avx2(h, arena);
  quantize_rows_words(h.k, h.stride, h.keys, n, d, kp.data(), {quads * 16, 1, 16}, 0, ks.data(),
                      kcomp.data());
  // u8 = s8 + 128 (the top bit flipped); the dims past d (u8 128 = s8 0) meet zero key dims
  const Scratch<int32_t> qp = arena.take<int32_t>(h.seq * quads);
  const Scratch<float> qscale = arena.take<float>(h.seq);
  quantize_rows_words(h.q, h.stride, nullptr, h.seq, d, qp.data(), {16 * quads, quads, 1}, 0x80,
                      qscale.data(), nullptr);
  float qs[kRows], row_max[kRows];
  const int32_t* qr[kRows];
  // the last block's keys past n are not scores: its max skips them
  const __mmask16 last = n % 16 == 0 ? __mmask16(0xffff) : __mmask16((1u << (n % 16)) - 1);
  for (int64_t i0 = 0; i0 < h.seq; i0 += kRows) {
    const int64_t rows = std::min<int64_t>(kRows, h.seq - i0);
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t i = i0 + std::min(r, rows - 1);
      qr[r] = &qp[i * quads];
      qs[r] = qscale[i] * h.scaling;
    }
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t* kb = &kp[b * quads * 16];
      __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
      for (int64_t c = 0; c < quads; ++c) {
        const __m512i kv = _mm512_loadu_si512(kb + c * 16);
        s0 = dpbusd(s0, _mm512_set1_epi32(qr[0][c]), kv);
        s1 = dpbusd(s1, _mm512_set1_epi32(qr[1][c]), kv);
        s2 = dpbusd(s2, _mm512_set1_epi32(qr[2][c]), kv);
        s3 = dpbusd(s3, _mm512_set1_epi32(qr[3][c]), kv);
      }
      const __m512i comp = _mm512_loadu_si512(&kcomp[b * 16]);
      const __m512 kscale = _mm512_loadu_ps(&ks[b * 16]);
      const __mmask16 valid = b + 1 < blocks ? __mmask16(0xffff) : last;
      float* pb = &p[b * 16];
      const int64_t ps = blocks * 16;
      const __m512 f0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s0, comp)),
                                      _mm512_mul_ps(kscale, _mm512_set1_ps(qs[0])));
      const __m512 f1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s1, comp)),
                                      _mm512_mul_ps(kscale, _mm512_set1_ps(qs[1])));
      const __m512 f2 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s2, comp)),
                                      _mm512_mul_ps(kscale, _mm512_set1_ps(qs[2])));
      const __m512 f3 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s3, comp)),
                                      _mm512_mul_ps(kscale, _mm512_set1_ps(qs[3])));
      _mm512_storeu_ps(pb, f0);
      _mm512_storeu_ps(pb + ps, f1);
      _mm512_storeu_ps(pb + 2 * ps, f2);
      _mm512_storeu_ps(pb + 3 * ps, f3);
      m0 = _mm512_mask_max_ps(m0, valid, m0, f0);
      m1 = _mm512_mask_max_ps(m1, valid, m1, f1);
      m2 = _mm512_mask_max_ps(m2, valid, m2, f2);
      m3 = _mm512_mask_max_ps(m3, valid, m3, f3);
    }
    row_max[0] = _mm512_reduce_max_ps(m0);
    row_max[1] = _mm512_reduce_max_ps(m1);
    row_max[2] = _mm512_reduce_max_ps(m2);
    row_max[3] = _mm512_reduce_max_ps(m3);
    attend_rows(p.data(), blocks * 16, row_max, rows, n, d, vpairs, pq.data(), values.q.data(),
                values.scale.data(), h.out + i0 * h.out_stride, h.out_stride);
  }
}


// ------------------------------------------------------------------------------------------
// AMX path: per group of 16 query rows, Q·Kᵀ on the tile unit (u8 query · s8 key, as the
// AVX512-VNNI path), softmax as that path, then P·V on the tile unit too, with the same exact
// integer sums as the other paths. AMX multiplies 8-bit numbers only, so the 16-bit
// probabilities and values go in as two 8-bit digits each:
//   p = 256·ph + pl (ph in 0..127, pl in 0..255), v = 256·vh + vl (vh in -64..63, vl in 0..255)
//   Σ p·v = 65536·Σ ph·vh + 256·(Σ ph·vl + Σ pl·vh) + Σ pl·vl
// four tile products (u8·s8 and u8·u8) into four s32 sums, combined in s32: the tile sums
// wrap like s32 adds, and the result is the exact Σ p·v the other paths compute (< 2^31, see
// kProbSteps), so the path's output equals the AVX512-VNNI path's bit for bit. At 256 keys
// and 64 dims, the vector path spends 256 vpdpbusd (Q·Kᵀ) and 512 vpdpwssd (P·V) per query
// row; here a group of 16 rows takes 16 + 64 tile products. The tiles are driven directly
// (one configuration for the whole head), not through oneDNN's brgemm, whose configuration
// is released first and set again by its next call.
// Only where the CPU has AMX-INT8 and the OS grants the tile state.

#define SQ_AMX                                                                              \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,amx-tile,amx-int8")))

bool cpu_has_amx_int8_instructions() {
  return cpu_has_avx512_vnni() && __builtin_cpu_supports("amx-int8") &&
         __builtin_cpu_supports("amx-tile");
}

// Linux hands out the tile state to a process that asks for it (oneDNN asks too; asking
// again is harmless).
bool amx_permitted() {
  static const bool ok = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// The AMX path runs where the CPU has the instructions and the OS grants the tile state.
bool cpu_has_amx_int8() { return cpu_has_amx_int8_instructions() && amx_permitted(); }

constexpr int64_t kTileRows = 16;  // query rows per P·V tile
constexpr int64_t kTileKeys = 64;  // keys per P·V tile step (64 bytes of a tile row)

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

const TileConfig& attention_tiles() {
  static const TileConfig cfg = [] {
    TileConfig c;
    for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
    return c;
  }();
  return cfg;
}

// Digit rows hold each block of 64 keys in the order two pack steps leave them in: byte quad
// 4l + t (l = 128-bit lane, t = source vector) holds key quad 4t + l. The value digits are
// stored in the same order (see key_quad_row), so the tile products pair the right keys.
inline int64_t key_quad_row(int64_t q) {
  const int64_t w = q % 16;
  return q - w + 4 * (w % 4) + w / 4;
}

// One head's values as two digit planes (vh, then vl), each [block of 16 columns][quad of
// keys, in key_quad_row's order][column][4 keys] bytes, keys padded to npad and columns to
// padded_value_dim with zeros; the integers are quantize_values_avx2's (same scales, same rounding).
struct ValueDigits {
  Scratch<uint8_t> digits;  // vh's plane, then vl's
  Scratch<float> scale;  // per column, padded_value_dim(d) of them
};

SQ_VNNI ValueDigits value_digits(const Head& h, int64_t npad, HeadArena& arena) {
  const int64_t n = h.n_keys, d = h.dim, dv = padded_value_dim(d), quads = npad / 4;
  const int64_t plane = dv * npad;
  const Scratch<float> inv = arena.take<float>(dv), vscale = arena.take<float>(dv);
  value_column_scales_avx2(h, arena, inv.data(), vscale.data());
  const Scratch<uint8_t> digits = arena.take<uint8_t>(2 * plane, 0);
  const __m512i lo = _mm512_set1_epi32(-int(kValueSteps)), hi = _mm512_set1_epi32(int(kValueSteps));
  const __m512i byte = _mm512_set1_epi32(255);
  for (int64_t j0 = 0; j0 < n; j0 += 4) {
    for (int64_t c = 0; c < d; c += 16) {
      const __mmask16 m = d - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (d - c)) - 1);
      const __m512 s = _mm512_loadu_ps(&inv[c]);
      __m128i vh[4], vl[4];
      for (int64_t k = 0; k < 4; ++k) {
        __m512i q = _mm512_setzero_si512();
        if (j0 + k < n) {
          const float* vr = h.v + h.keys[j0 + k] * h.stride + c;
          q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, vr), s));
          q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
        }
        vh[k] = _mm512_cvtepi32_epi8(_mm512_srai_epi32(q, 8));
        vl[k] = _mm512_cvtepi32_epi8(_mm512_and_si512(q, byte));
      }
      // 4 keys x 16 columns -> [column][4 keys]
      uint8_t* dst = &digits[((c / 16) * quads + key_quad_row(j0 / 4)) * 64];
      for (int part = 0; part < 2; ++part) {
        const __m128i* x = part == 0 ? vh : vl;
        const __m128i t0 = _mm_unpacklo_epi8(x[0], x[1]), t1 = _mm_unpackhi_epi8(x[0], x[1]);
        const __m128i t2 = _mm_unpacklo_epi8(x[2], x[3]), t3 = _mm_unpackhi_epi8(x[2], x[3]);
        __m128i* o = reinterpret_cast<__m128i*>(dst + part * plane);
        _mm_storeu_si128(o, _mm_unpacklo_epi16(t0, t2));
        _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(t0, t2));
        _mm_storeu_si128(o + 2, _mm_unpacklo_epi16(t1, t3));
        _mm_storeu_si128(o + 3, _mm_unpackhi_epi16(t1, t3));
      }
    }
  }
  return ValueDigits{digits, vscale};
}

// A row's probabilities as the digit rows ph, pl [0, npad) (zeros past n): q = round(p·k),
// as softmax_rows_avx2 rounds them; 64 keys a step, packed to bytes by vpackus (two shuffles
// per 32 keys where vpmovdb takes four). Returns Σ q.
SQ_VNNI int32_t probs_to_digits(const float* p, int64_t n, int64_t npad, float k, uint8_t* ph,
                                uint8_t* pl) {
  const __m512 vk = _mm512_set1_ps(k);
  const __m512i byte = _mm512_set1_epi16(255);
  __m512i vt = _mm512_setzero_si512();
  for (int64_t j = 0; j < npad; j += 64) {
    __m512i q[4];
    for (int t = 0; t < 4; ++t) {
      const int64_t left = n - (j + 16 * t);
      const __mmask16 m = left >= 16 ? __mmask16(0xffff) : left > 0 ? __mmask16((1u << left) - 1) : 0;
      q[t] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + j + 16 * t), vk));
      vt = _mm512_add_epi32(vt, q[t]);
    }
    // q <= kProbSteps: the unsigned saturating packs keep every value
    const __m512i w01 = _mm512_packus_epi32(q[0], q[1]), w23 = _mm512_packus_epi32(q[2], q[3]);
    _mm512_storeu_si512(ph + j, _mm512_packus_epi16(_mm512_srli_epi16(w01, 8), _mm512_srli_epi16(w23, 8)));
    _mm512_storeu_si512(pl + j, _mm512_packus_epi16(_mm512_and_si512(w01, byte), _mm512_and_si512(w23, byte)));
  }
  return _mm512_reduce_add_epi32(vt);
}

// The tile unit works beside the vector units, but a product's results, read back right after
// its tile stores, stall the core until the products are done; and a tile instruction holds
// up retirement, so only work close behind it in the instruction stream overlaps it. So the
// tile work is cut into small units interleaved with the softmax rows of the next group: while
// group g's rows go through softmax (vector), group g+1's Q·Kᵀ and group g-1's P·V run on the
// tiles, one unit or so per row; group g-2's P·V sums are read at the start of step g.
//
// Tiles: 0-4 P·V (0 Σ ph·vh, 1 Σ ph·vl + pl·vh, 2 Σ pl·vl, 3 probability digits, 4 value
// digits), 5-7 Q·Kᵀ (5 scores, 6 queries, 7 keys); every tile 16 rows of 64 bytes.

// Σ p·v of 16 query rows (digit rows ph, pl, npad bytes apart) over all dv columns, into
// three sums [16][dv] one after another (hh, mid, ll), one unit a call: unit u covers the
// 16-column block u / (npad / 64) and the 64 keys u % (npad / 64).
struct WeightedSums {
  const uint8_t* ph;
  const uint8_t* pl;
  const uint8_t* vh;
  const uint8_t* vl;
  int32_t* sums;
  int64_t npad, dv, unit = 0, units = 0;

  SQ_AMX void run(int64_t count) {
    const int64_t steps = npad / 64, quads = npad / 4, ld = dv * int64_t(sizeof(int32_t));
    for (; count > 0 && unit < units; --count, ++unit) {
      const int64_t c = (unit / steps) * 16, s = (unit % steps) * 64;
      const int64_t at = (c / 16) * quads * 64 + s / 4 * 64;
      if (s == 0) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
      }
      _tile_loadd(3, ph + s, npad);
      _tile_loadd(4, vh + at, 64);
      _tile_dpbusd(0, 3, 4);  // ph·vh
      _tile_loadd(4, vl + at, 64);
      _tile_dpbuud(1, 3, 4);  // ph·vl
      _tile_loadd(3, pl + s, npad);
      _tile_dpbuud(2, 3, 4);  // pl·vl
      _tile_loadd(4, vh + at, 64);
      _tile_dpbusd(1, 3, 4);  // pl·vh
      if (s + 64 == npad) {
        _tile_stored(0, sums + c, ld);
        _tile_stored(1, sums + 16 * dv + c, ld);
        _tile_stored(2, sums + 32 * dv + c, ld);
      }
    }
  }
};

// Q·Kᵀ of 16 query rows (qa: u8 rows of dq bytes, dq a multiple of 64) against npad keys
// (kp: [block of 16 keys][quad of dims][key][4] s8) as s32 sums into scores [16][npad], one
// block of 16 keys a unit.
struct Scores {
  const uint8_t* qa;
  const int8_t* kp;
  int32_t* scores;
  int64_t dq, npad, unit = 0, units = 0;

  SQ_AMX void run(int64_t count) {
    const int64_t steps = dq / 64, block = dq * 16, ld = npad * int64_t(sizeof(int32_t));
    for (; count > 0 && unit < units; --count, ++unit) {
      if (steps == 1 && unit == 0) _tile_loadd(6, qa, dq);
      _tile_zero(5);
      for (int64_t s = 0; s < steps; ++s) {
        if (steps > 1) _tile_loadd(6, qa + s * 64, dq);
        _tile_loadd(7, kp + unit * block + s * 1024, 64);
        _tile_dpbusd(5, 6, 7);
      }
      _tile_stored(5, scores + unit * 16, ld);
    }
  }
};

// Output rows from the three P·V sums: (65536·hh + 256·mid + ll) · vscale[c] · inv_total[r],
// in the order weighted_sum_tile_vnni computes it.
SQ_VNNI void store_digit_sums(const int32_t* sums, int64_t rows, int64_t d, int64_t dv,
                              const float* vscale, const float* inv_total, float* out,
                              int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* hh = sums + r * dv;
    float* o = out + r * out_stride;
    for (int64_t c = 0; c < d; c += 16) {
      const __mmask16 m = d - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (d - c)) - 1);
      const __m512i acc = _mm512_add_epi32(
          _mm512_add_epi32(_mm512_slli_epi32(_mm512_loadu_si512(hh + c), 16),
                           _mm512_slli_epi32(_mm512_loadu_si512(hh + 16 * dv + c), 8)),
          _mm512_loadu_si512(hh + 32 * dv + c));
      _mm512_mask_storeu_ps(o + c, m, _mm512_mul_ps(_mm512_cvtepi32_ps(acc),
                                                    _mm512_mul_ps(_mm512_loadu_ps(vscale + c),
                                                                  _mm512_set1_ps(inv_total[r]))));
    }
  }
}

// Scores of one query row as floats (u8·s8 sums minus 128·Σkey, times the key's and the
// query's scales), as the AVX512-VNNI path computes them; returns their max over [0, n).
SQ_VNNI float scale_scores(const int32_t* sr, const int32_t* kcomp, const float* ks, float qs,
                           int64_t n, float* p) {
  const __m512 qscale = _mm512_set1_ps(qs);
  __m512 vm = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 f = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(sr + j), _mm512_loadu_si512(kcomp + j))),
        _mm512_mul_ps(_mm512_loadu_ps(ks + j), qscale));
    _mm512_storeu_ps(p + j, f);
    vm = _mm512_mask_max_ps(vm, n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1), vm, f);
  }
  return _mm512_reduce_max_ps(vm);
}

SQ_AMX void head_amx(const Head& h) {
  const int64_t n = h.n_keys, d = h.dim, dq = (d + 63) / 64 * 64, dquads = dq / 4;
  const int64_t npad = (n + kTileKeys - 1) / kTileKeys * kTileKeys;
  // keys for the tiles: [block of 16 keys][quad of dims][key][4] s8, zero past d and n
  HeadArena& arena = HeadArena::start_head();
  const Scratch<int32_t> kp = arena.take<int32_t>(npad * dquads, 0);
  // 128 · Σ key, removed from the u8 · s8 sums
  const Scratch<int32_t> kcomp = arena.take<int32_t>(npad, 0);
  const Scratch<float> ks = arena.take<float>(npad, 0.f);
  quantize_rows_words(h.k, h.stride, h.keys, n, d, kp.data(), {dquads * 16, 1, 16}, 0, ks.data(),
                      kcomp.data());
  const int64_t dv = padded_value_dim(d);
  const ValueDigits values = value_digits(h, npad, arena);
  const Scratch<uint8_t> vdigits = values.digits;
  const Scratch<float> vscale = values.scale;
  // queries as u8 = s8 + 128; padded dims: u8 128 = s8 0, meet zero keys
  const Scratch<uint8_t> qa = arena.take<uint8_t>(kTileRows * dq, 128);
  // two of each: the groups in flight (see above)
  const Scratch<int32_t> scores = arena.take<int32_t>(2 * kTileRows * npad);
  const Scratch<int32_t> sums = arena.take<int32_t>(2 * 3 * kTileRows * dv);
  const Scratch<uint8_t> pdigits = arena.take<uint8_t>(2 * 2 * kTileRows * npad);
  const Scratch<float> p = arena.take<float>(npad);
  float qs[2][kTileRows], inv_total[2][kTileRows];
  const int64_t groups = (h.seq + kTileRows - 1) / kTileRows;
  auto rows_of = [&](int64_t g) { return std::min<int64_t>(kTileRows, h.seq - g * kTileRows); };
  auto digits_of = [&](int64_t g) { return &pdigits[(g % 2) * 2 * kTileRows * npad]; };
  auto sums_of = [&](int64_t g) { return &sums[(g % 2) * 3 * kTileRows * dv]; };
  // group g's queries quantized for the tiles; its Q·Kᵀ then runs unit by unit
  auto scores_for = [&](int64_t g) {
    const int64_t i0 = g * kTileRows, rows = rows_of(g);
    quantize_rows_words(h.q + i0 * h.stride, h.stride, nullptr, rows, d,
                        reinterpret_cast<int32_t*>(qa.data()), {16 * dquads, dquads, 1}, 0x80,
                        qs[g % 2], nullptr);
    for (int64_t r = 0; r < rows; ++r) qs[g % 2][r] *= h.scaling;
    return Scores{qa.data(), reinterpret_cast<const int8_t*>(kp.data()),
                  &scores[(g % 2) * kTileRows * npad], dq, npad, 0, npad / 16};
  };
  auto weighted_sums_for = [&](int64_t g) {
    const uint8_t* ph = digits_of(g);
    return WeightedSums{ph, ph + kTileRows * npad, vdigits.data(), vdigits.data() + dv * npad,
                        sums_of(g), npad, dv, 0, (dv / 16) * (npad / 64)};
  };
  auto finish = [&](int64_t g) {
    store_digit_sums(sums_of(g), rows_of(g), d, dv, vscale.data(), inv_total[g % 2],
                     h.out + g * kTileRows * h.out_stride, h.out_stride);
  };
  // oneDNN's brgemm keeps its tile configuration loaded between calls: release it (its next
  // call configures again), then load ours for this head
  at::native::cpublas::brgemm_release(true);
  _tile_loadconfig(&attention_tiles());
  Scores next = scores_for(0);
  next.run(next.units);
  WeightedSums previous{};
  for (int64_t g = 0; g <= groups; ++g) {
    if (g >= 2) finish(g - 2);
    Scores current = next;
    if (g + 1 < groups) next = scores_for(g + 1);
    else next.units = next.unit = 0;
    if (g < groups) {
      const int64_t rows = rows_of(g);
      const int64_t pv_per_row = (previous.units + rows - 1) / rows;
      const int64_t qk_per_row = (next.units + rows - 1) / rows;
      uint8_t* ph = digits_of(g);
      uint8_t* pl = ph + kTileRows * npad;
      for (int64_t r = 0; r < rows; ++r) {
        const float m = scale_scores(&current.scores[r * npad], kcomp.data(), ks.data(),
                                     qs[g % 2][r], n, p.data());
        previous.run(pv_per_row);
        next.run(qk_per_row);
        const float sum = softmax_exp_vnni(p.data(), n, m);
        const int32_t total =
            probs_to_digits(p.data(), n, npad, kProbSteps / sum, ph + r * npad, pl + r * npad);
        inv_total[g % 2][r] = 1.f / float(total);
      }
      if (rows < kTileRows) {  // a short group: its missing rows weigh nothing
        std::memset(ph + rows * npad, 0, (kTileRows - rows) * npad);
        std::memset(pl + rows * npad, 0, (kTileRows - rows) * npad);
      }
    }
    previous.run(previous.units);
    next.run(next.units);
    if (g < groups) previous = weighted_sums_for(g);
  }
  finish(groups - 1);
}

// ------------------------------------------------------------------------------------------
// dispatch

using HeadFn = void (*)(const Head&);

// A thread that ran the AMX path gives its tile state back when its share of the heads is done
// (at::native::cpublas::brgemm_release also tells oneDNN its own tile configuration is gone).
void release_tiles(HeadFn fn) {
  if (fn == head_amx) at::native::cpublas::brgemm_release(true);
}

// "auto": the AMX path where it measured faster than AVX512-VNNI: head dims >= 64 (one Xeon
// core, 12 heads, 64 dims: 128 keys 0.36 vs 0.36 ms, 256 keys 1.03-1.09 vs 1.37-1.41 ms, 512
// keys 3.38 vs 5.01 ms). Not at 32 dims (8 x 128 keys: 2.43 vs 2.16 ms, even with half-width
// query and key tiles): there the softmax and the digits cost more than the products save.
HeadFn pick(const std::string& isa, int64_t dim) {
  if (isa == "auto") {
    if (cpu_has_amx_int8() && dim >= 64) return head_amx;
    if (cpu_has_avx512_vnni()) return head_vnni;
    if (cpu_has_avx2()) return head_avx2;
    return head_scalar;
  }
  if (isa == "amx") {
    TORCH_CHECK(cpu_has_amx_int8(),
                "squant int8 attention: this CPU has no AMX-INT8 (or the OS refused its tile state)");
    return head_amx;
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
              "' (auto, amx, avx512_vnni, avx2, scalar)");
  return head_scalar;
}

// Keys to attend to, per batch row; a row with no valid key attends to all (as a softmax
// over equal -inf-like biases would).
std::vector<std::vector<int32_t>> attended_keys(const std::optional<at::Tensor>& key_mask,
                                                int64_t batch, int64_t seq) {
  at::Tensor mask;
  if (key_mask.has_value()) {
    TORCH_CHECK(key_mask->dim() == 2 && key_mask->size(0) == batch && key_mask->size(1) == seq,
                "key_mask must be [batch, seq]");
    mask = key_mask->to(at::kBool).contiguous();
  }
  std::vector<std::vector<int32_t>> keys(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const bool* m = mask.defined() ? mask.data_ptr<bool>() + b * seq : nullptr;
    for (int64_t j = 0; j < seq; ++j)
      if (m == nullptr || m[j]) keys[b].push_back(int32_t(j));
    if (keys[b].empty())
      for (int64_t j = 0; j < seq; ++j) keys[b].push_back(int32_t(j));
  }
  return keys;
}

// One head's problem: its Q rows from q (row stride `stride` floats), its K and V columns
// `part` floats after Q's and after K's; output rows from out (row stride out_stride).
Head head_of(const float* q, int64_t part, int64_t stride, float* out, int64_t out_stride,
             int64_t seq, int64_t dim, const std::vector<int32_t>& keys, double scaling) {
  return Head{q,   q + part, q + 2 * part, stride, out, out_stride, seq,
              dim, keys.data(), int64_t(keys.size()), float(scaling)};
}

void check_seq(int64_t seq) {
  TORCH_CHECK(seq < kMaxKeys, "squant int8 attention: at most ", kMaxKeys - 1,
              " tokens (its 16-bit P·V sums would overflow), got ", seq);
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
  check_seq(seq);
  const auto keys = attended_keys(key_mask, batch, seq);
  at::Tensor out = pooled_empty({batch, seq, width}, x.options());
  if (batch == 0 || seq == 0) return out.to(in_dtype);
  const HeadFn fn = pick(std::string(isa), dim);
  const float* base = x.data_ptr<float>();
  float* obase = out.data_ptr<float>();
  const int64_t sb = x.stride(0), ss = x.stride(1);
  const int64_t tasks = batch * num_heads;
  run_claimed(tasks, [&](auto claim) {
    for (int64_t t = claim(); t < tasks; t = claim()) {
      const int64_t b = t / num_heads, hd = t % num_heads;
      fn(head_of(base + b * sb + hd * dim, width, ss, obase + (b * seq * width + hd * dim), width,
                 seq, dim, keys[b], scaling));
    }
    release_tiles(fn);
  });
  return out.to(in_dtype);
}

// The Q|K|V projection (an int8 linear, float32 output) and the attention in one call:
//   int8_attention(int8_linear(x, ...).view(batch, seq, 3·H·D), key_mask, ...)
// with the same results, bit for bit. Where there is a batch row for every thread, each task
// computes one batch row's Q|K|V rows into a buffer that stays in the core's L2 (128 tokens x
// 1152 floats = 590 KB for MiniLM) and runs that row's heads on it: the projection's output
// never goes to memory, and the heads read it without the cache misses of rows 3·H·D floats
// apart in a tensor of the whole batch. With fewer batch rows than threads, each batch row's
// heads are split into groups (one task per row and group) whose Q, K and V columns are whole
// 64-column blocks of the GEMM: each task computes only its group's columns, again into L2.
// Threads claim tasks as they finish (run_claimed), and there are at least four per thread
// where the heads split that far: distilbert 1 x 256 on 2 threads, 4 or 12 tasks claimed
// against 2 split statically, 5.5-6% faster for the whole model (interleaved rounds, AMX Xeon);
// BERT-large 1 x 256, 8 tasks of 2 heads against 4 of 4, 0.96-0.98x the whole model's time in
// three in-process A/Bs (the thread that finishes first waits for less of a task).
// Where no split exists, the projection runs over all threads first, then the (batch row,
// head) problems do (as the two calls would).
constexpr int64_t kTasksPerThread = 4;

// How many head groups per batch row give every thread kTasksPerThread tasks: the fewest that
// do, among those whose groups' Q|K|V columns are whole GEMM blocks; else the most there are.
int64_t head_groups(int64_t batch, int64_t heads, int64_t dim, int64_t threads) {
  if (batch >= threads * kTasksPerThread) return 1;
  const int64_t want = (threads * kTasksPerThread + batch - 1) / batch;
  int64_t most = 1;
  for (int64_t g = 1; g <= heads; ++g) {
    if (heads % g != 0 || (heads / g * dim) % kLinearBlockN != 0) continue;
    if (g >= want) return g;
    most = g;
  }
  return most;
}

at::Tensor int8_linear_attention(
    const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& compensation,
    double x_scale, int64_t x_zero_point, const at::Tensor& weight_scale,
    const std::optional<at::Tensor>& bias, int64_t out_features,
    const std::optional<at::Tensor>& row_scale, const std::optional<at::Tensor>& side_x,
    const std::optional<at::Tensor>& side_w, const std::optional<at::Tensor>& key_mask,
    int64_t batch, int64_t num_heads, double scaling, c10::string_view isa) {
  const LinearRows linear = int8_linear_rows(x, packed_weight, compensation, x_scale,
                                             x_zero_point, weight_scale, bias, out_features,
                                             row_scale, side_x, side_w);
  TORCH_CHECK(num_heads > 0 && out_features % (3 * num_heads) == 0,
              "squant::int8_linear_attention: out_features must be 3 * heads * head_dim");
  const int64_t M = x.size(0);
  TORCH_CHECK(batch > 0 && M % batch == 0, "squant::int8_linear_attention: ", M,
              " rows do not split into ", batch, " batch rows");
  const int64_t seq = M / batch, width = out_features / 3, dim = width / num_heads;
  check_seq(seq);
  const int64_t groups = head_groups(batch, num_heads, dim, at::get_num_threads());
  if (batch < at::get_num_threads() && groups == 1) {
    // no split: the projection over all threads, then the attention as its own call runs it
    at::Tensor qkv = pooled_empty({M, out_features}, x.options().dtype(at::kFloat));
    float* qp = qkv.data_ptr<float>();
    constexpr int64_t kRowsPerTask = 64;
    const int64_t tasks = (M + kRowsPerTask - 1) / kRowsPerTask;
    run_claimed(tasks, [&](auto claim) {
      for (int64_t t = claim(); t < tasks; t = claim()) {
        const int64_t m0 = t * kRowsPerTask;
        linear(m0, std::min(kRowsPerTask, M - m0), 0, out_features, qp + m0 * out_features,
               out_features);
      }
      linear_rows_release();
    });
    return int8_attention(qkv.view({batch, seq, out_features}), key_mask, num_heads, scaling, isa);
  }
  const auto keys = attended_keys(key_mask, batch, seq);
  at::Tensor out = pooled_empty({batch, seq, width}, x.options().dtype(at::kFloat));
  if (seq == 0) return out;
  const HeadFn fn = pick(std::string(isa), dim);
  float* obase = out.data_ptr<float>();
  // group g of batch row b: heads [g·hg, (g+1)·hg), their Q, K and V columns side by side
  const int64_t hg = num_heads / groups, gw = hg * dim, ld = 3 * gw;
  const int64_t tasks = batch * groups;
  run_claimed(tasks, [&](auto claim) {
    // uninitialized: every element is written before it is read
    const LineBuffer<float> qkv(seq * ld);
    for (int64_t t = claim(); t < tasks; t = claim()) {
      const int64_t b = t / groups, g = t % groups;
      if (groups == 1) {
        linear(b * seq, seq, 0, out_features, qkv.get(), ld);  // the whole row, as it is
      } else {
        for (int64_t part = 0; part < 3; ++part) {
          const int64_t c0 = part * width + g * gw;
          linear(b * seq, seq, c0, c0 + gw, qkv.get() + part * gw, ld);
        }
      }
      for (int64_t i = 0; i < hg; ++i) {
        const int64_t hd = g * hg + i;
        fn(head_of(qkv.get() + i * dim, gw, ld, obase + (b * seq * width + hd * dim), width, seq,
                   dim, keys[b], scaling));
      }
    }
    linear_rows_release();
  });
  return out;
}

std::vector<std::string> supported_isas() {
  std::vector<std::string> out;
  if (cpu_has_amx_int8()) out.emplace_back("amx");
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

TORCH_LIBRARY_FRAGMENT(squant, m) {
  m.def(
      "int8_linear_attention(Tensor x, Tensor packed_weight, Tensor compensation, "
      "float x_scale, int x_zero_point, Tensor weight_scale, Tensor? bias, int out_features, "
      "Tensor? row_scale, Tensor? side_x, Tensor? side_w, Tensor? key_mask, SymInt batch, "
      "int num_heads, float scaling, str isa=\"auto\") -> Tensor");
}

TORCH_LIBRARY_IMPL(squant, CPU, m) {
  m.impl("int8_attention", &squant_kernels::int8_attention);
  m.impl("int8_linear_attention", &squant_kernels::int8_linear_attention);
}
