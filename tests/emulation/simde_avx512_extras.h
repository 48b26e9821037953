// AVX512 intrinsics the int8 attention kernel uses that SIMDe 0.7 lacks or gets wrong
// (_mm512_roundscale_ps ignored its rounding mode), written lane by lane. Test builds only:
// tests/test_int8_attention_emulated.py compiles the kernel against SIMDe with this header
// so its AVX512-VNNI path runs on CPUs without AVX512.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace squant_emulated {

template <class T>
struct Lanes {
  T v[16];
};

inline Lanes<float> lanes(simde__m512 a) {
  Lanes<float> r;
  std::memcpy(r.v, &a, sizeof(r.v));
  return r;
}
inline Lanes<int32_t> lanes(simde__m512i a) {
  Lanes<int32_t> r;
  std::memcpy(r.v, &a, sizeof(r.v));
  return r;
}
inline simde__m512 vec(const Lanes<float>& x) {
  simde__m512 r;
  std::memcpy(&r, x.v, sizeof(x.v));
  return r;
}
inline simde__m512i vec(const Lanes<int32_t>& x) {
  simde__m512i r;
  std::memcpy(&r, x.v, sizeof(x.v));
  return r;
}

inline simde__m512i cvttps_epi32(simde__m512 a) {
  const auto x = lanes(a);
  Lanes<int32_t> o;
  for (int k = 0; k < 16; ++k) o.v[k] = int32_t(x.v[k]);
  return vec(o);
}
inline simde__m512i cvtps_epi32(simde__m512 a) {  // nearest-even, as the default MXCSR
  const auto x = lanes(a);
  Lanes<int32_t> o;
  for (int k = 0; k < 16; ++k) o.v[k] = int32_t(std::nearbyint(x.v[k]));
  return vec(o);
}
inline simde__m512 cvtepi32_ps(simde__m512i a) {
  const auto x = lanes(a);
  Lanes<float> o;
  for (int k = 0; k < 16; ++k) o.v[k] = float(x.v[k]);
  return vec(o);
}
inline simde__m512 roundscale_ps(simde__m512 a, int imm) {
  const auto x = lanes(a);
  Lanes<float> o;
  for (int k = 0; k < 16; ++k) {
    switch (imm & 3) {
      case 0: o.v[k] = std::nearbyint(x.v[k]); break;
      case 1: o.v[k] = std::floor(x.v[k]); break;
      case 2: o.v[k] = std::ceil(x.v[k]); break;
      default: o.v[k] = std::trunc(x.v[k]);
    }
  }
  return vec(o);
}
inline int32_t reduce_add_epi32(simde__m512i a) {
  const auto x = lanes(a);
  int32_t s = 0;
  for (int k = 0; k < 16; ++k) s += x.v[k];
  return s;
}
inline float reduce_add_ps(simde__m512 a) {
  const auto x = lanes(a);
  float s = 0.f;
  for (int k = 0; k < 16; ++k) s += x.v[k];
  return s;
}
inline float reduce_max_ps(simde__m512 a) {
  const auto x = lanes(a);
  float s = -INFINITY;
  for (int k = 0; k < 16; ++k) s = std::max(s, x.v[k]);
  return s;
}
inline simde__m128i cvtepi32_epi8(simde__m512i a) {  // truncating, as vpmovdb
  const auto x = lanes(a);
  int8_t o[16];
  for (int k = 0; k < 16; ++k) o[k] = int8_t(x.v[k]);
  simde__m128i r;
  std::memcpy(&r, o, sizeof(o));
  return r;
}
inline void mask_storeu_ps(void* p, simde__mmask16 m, simde__m512 a) {
  const auto x = lanes(a);
  for (int k = 0; k < 16; ++k)
    if (m & (1u << k)) static_cast<float*>(p)[k] = x.v[k];
}
inline simde__m512 maskz_loadu_ps(simde__mmask16 m, const void* p) {  // masked lanes not read
  Lanes<float> r{};
  for (int k = 0; k < 16; ++k)
    if (m & (1u << k)) r.v[k] = static_cast<const float*>(p)[k];
  return vec(r);
}
inline void mask_storeu_epi8(void* p, simde__mmask16 m, simde__m128i a) {
  int8_t x[16];
  std::memcpy(x, &a, sizeof(x));
  for (int k = 0; k < 16; ++k)
    if (m & (1u << k)) static_cast<int8_t*>(p)[k] = x[k];
}

}  // namespace squant_emulated

#undef _mm512_cvttps_epi32
#undef _mm512_cvtps_epi32
#undef _mm512_cvtepi32_ps
#undef _mm512_roundscale_ps
#undef _mm512_reduce_add_epi32
#undef _mm512_reduce_add_ps
#undef _mm512_reduce_max_ps
#undef _mm512_cvtepi32_epi8
#undef _mm512_mask_storeu_ps
#undef _mm512_maskz_loadu_ps
#undef _mm_mask_storeu_epi8
#define _mm512_cvttps_epi32 squant_emulated::cvttps_epi32
#define _mm512_cvtps_epi32 squant_emulated::cvtps_epi32
#define _mm512_cvtepi32_ps squant_emulated::cvtepi32_ps
#define _mm512_roundscale_ps squant_emulated::roundscale_ps
#define _mm512_reduce_add_epi32 squant_emulated::reduce_add_epi32
#define _mm512_reduce_add_ps squant_emulated::reduce_add_ps
#define _mm512_reduce_max_ps squant_emulated::reduce_max_ps
#define _mm512_cvtepi32_epi8 squant_emulated::cvtepi32_epi8
#define _mm512_mask_storeu_ps squant_emulated::mask_storeu_ps
#define _mm512_maskz_loadu_ps squant_emulated::maskz_loadu_ps
#define _mm_mask_storeu_epi8 squant_emulated::mask_storeu_epi8
