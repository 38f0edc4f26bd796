// The KV cache's element types: float (fp32) or kv::Half (IEEE fp16, its 16 bits), read as fp32 and
// written rounded to the nearest even half (the bits torch's .to(torch.float16) gives; F16C / AVX-512
// where the machine has them, else a portable routine).
//
// Why fp16: a decoding batch of 8 rows reads every row's keys and values once a layer, and at the
// batch row's ~110-170 positions that is ~40-63 MB a step against SmolLM2's ~80 MB of weights;
// attention was memory-bound there (docs/engine.md's eleventh and twelfth sessions). Half the bytes;
// not bit-equal to the fp32 cache (keys and values carry 11 significant bits), as llama.cpp's default
// f16 cache. EngineConfig.kv_cache_dtype chooses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gguf_blocks.h"  // gguf::half_to_float; VOXLANE_AVX2 (F16C)

namespace voxlane::kv {

struct Half {
  uint16_t bits;
};
static_assert(sizeof(Half) == 2);

inline float to_float(float x) { return x; }
inline float to_float(Half h) { return gguf::half_to_float(reinterpret_cast<const uint8_t*>(&h.bits)); }

// x rounded to the nearest fp16 (ties to even; overflow to infinity, NaN stays NaN).
inline Half to_half(float x) {
#if defined(VOXLANE_AVX2)
  return Half{static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))};
#else
  // Without F16C (F. Giesen's float_to_half_fast3_rtne): subnormal halves by one fp32 addition that
  // aligns the 10 mantissa bits at the bottom (rounded to nearest even by the FPU), normal ones by
  // rebiasing the exponent and adding half an ulp (minus 1 when the kept mantissa is even) before the shift.
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  uint16_t h;
  if (u >= (127u + 16u) << 23) {  // |x| >= 65536 (or inf / NaN): inf, or a quiet NaN
    h = u > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (u < 113u << 23) {  // |x| < 2^-14: a subnormal half or zero
    const uint32_t magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    float magic, f;
    std::memcpy(&magic, &magic_bits, 4);
    std::memcpy(&f, &u, 4);
    f += magic;
    std::memcpy(&u, &f, 4);
    h = static_cast<uint16_t>(u - magic_bits);
  } else {
    const uint32_t odd = (u >> 13) & 1u;
    u += ((15u - 127u) << 23) + 0xfffu + odd;  // unsigned wrap-around is the exponent's rebias
    h = static_cast<uint16_t>(u >> 13);  // 65520 and up carry into 0x7c00: infinity, as F16C rounds
  }
  return Half{static_cast<uint16_t>(h | sign)};
#endif
}

// out[0, n) = x[0, n) in the cache's type (a new key or value, d values).
inline void store(const float* x, int64_t n, float* out) { std::copy(x, x + n, out); }
inline void store(const float* x, int64_t n, Half* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) out[i] = to_half(x[i]);
}

// out[0, n) = x[0, n) as fp32.
inline void widen(const Half* x, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
#endif
  for (; i < n; ++i) out[i] = to_float(x[i]);
}

#if defined(__AVX512F__)
// 16 consecutive elements as fp32 lanes: a plain load, or 32 bytes widened (one vcvtph2ps).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif

}  // namespace voxlane::kv
