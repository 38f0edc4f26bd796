// The weight formats our kernels read as they are stored: GGUF's block formats (raw blocks, as in
// the file: no requantization) and our own row-scaled int8 and plain fp32.
//
// A format is a struct with QK (weights per block), BYTES (bytes per block) and two ways to expand
// one block, both exact for the file's values (fp32 math, as gguf's and ggml's dequantizers):
//   dequant(block, out[QK])        scalar, portable: the embedding lookup and non-x86 builds
//   expand(block, sink)            AVX2: calls sink(g, w) for each group g of 8 weights, w an __m256
//                                  holding weights [8g, 8g + 8) of the block; the caller multiplies
//                                  them into as many activation rows as it has (they stay in registers)
// Layouts follow ggml-common.h (read with the search tools; written here from the format spec):
//   Q4_0  fp16 d, 16 B nibbles               w = (q - 8) d          low nibbles are weights 0-15
//   Q4_1  fp16 d, fp16 m, 16 B nibbles       w = q d + m
//   Q5_0  fp16 d, u32 qh (5th bits), 16 B    w = (q - 16) d
//   Q8_0  fp16 d, 32 x int8                  w = q d
//   Q4_K  256 per block: fp16 d, fp16 dmin, 12 B of 6-bit (scale, min) x 8, 128 B nibbles
//                                            w = q d sc_j - dmin m_j for sub-block j of 32
//   Q6_K  256 per block: 128 B low nibbles, 64 B high 2 bits, 16 x int8 scales, fp16 d
//                                            w = (q - 32) d sc_j for sub-block j of 16
//   I8    our per-channel int8 (rows of K int8; the row's scale is applied to the row's sum)
//   F32   plain fp32 rows
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define VOXLANE_AVX2 1
#include <immintrin.h>
#endif

namespace voxlane::gguf {

// GGML's type ids for the GGUF formats; ours above them.
enum Format : int64_t { F32 = 0, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14, I8 = 1000 };

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(VOXLANE_AVX2)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal half: normalize
    int e = -1;
    uint32_t m = mantissa;
    do { ++e; m <<= 1; } while ((m & 0x400u) == 0);
    bits = sign | ((112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#if defined(VOXLANE_AVX2)
// 8 bytes at p, zero- or sign-extended to 8 int32 lanes.
inline __m256i u8x8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline __m256i i8x8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
#define VOXLANE_F(v) _mm256_cvtepi32_ps(v)

// 16 bytes of nibbles -> 32 weights q * d + offset; the low nibbles are weights 0-15.
template <class Sink> inline void nibbles(const uint8_t* qs, __m256 d, __m256 offset, Sink&& sink) {
  const __m256i low = _mm256_set1_epi32(0xf);
  for (int h = 0; h < 2; ++h) {  // bytes 8h..8h+7 hold weights 8h.. (low) and 16 + 8h.. (high)
    const __m256i q = u8x8(qs + 8 * h);
    sink(h, _mm256_fmadd_ps(VOXLANE_F(_mm256_and_si256(q, low)), d, offset));
    sink(h + 2, _mm256_fmadd_ps(VOXLANE_F(_mm256_srli_epi32(q, 4)), d, offset));
  }
}
#endif

struct BlockF32 {
  static constexpr int QK = 8, BYTES = 32;
  static void dequant(const uint8_t* b, float* out) { std::memcpy(out, b, 32); }
#if defined(VOXLANE_AVX2)
  template <class Sink> static inline void expand(const uint8_t* b, Sink&& sink) {
    sink(0, _mm256_loadu_ps(reinterpret_cast<const float*>(b)));
  }
#endif
};

struct BlockI8 {  // the row scale is applied by the caller
  static constexpr int QK = 16, BYTES = 16;
  static void dequant(const uint8_t* b, float* out) {
    for (int i = 0; i < QK; ++i) out[i] = static_cast<float>(static_cast<int8_t>(b[i]));
  }
#if defined(VOXLANE_AVX2)
  template <class Sink> static inline void expand(const uint8_t* b, Sink&& sink) {
    sink(0, VOXLANE_F(i8x8(b)));
    sink(1, VOXLANE_F(i8x8(b + 8)));
  }
#endif
};

struct BlockQ8_0 {
  static constexpr int QK = 32, BYTES = 34;
  static void dequant(const uint8_t* b, float* out) {
    const float d = half_to_float(b);
    for (int i = 0; i < QK; ++i) out[i] = static_cast<float>(static_cast<int8_t>(b[2 + i])) * d;
  }
#if defined(VOXLANE_AVX2)
  template <class Sink> static inline void expand(const uint8_t* b, Sink&& sink) {
    const __m256 d = _mm256_set1_ps(half_to_float(b));
    for (int g = 0; g < 4; ++g) sink(g, _mm256_mul_ps(VOXLANE_F(i8x8(b + 2 + 8 * g)), d));
  }
#endif
};

struct BlockQ4_0 {
  static constexpr int QK = 32, BYTES = 18;
  static void dequant(const uint8_t* b, float* out) {
    const float d = half_to_float(b);
    for (int i = 0; i < 16; ++i) {
      out[i] = static_cast<float>((b[2 + i] & 0xf) - 8) * d;
      out[i + 16] = static_cast<float>((b[2 + i] >> 4) - 8) * d;
    }
  }
#if defined(VOXLANE_AVX2)
  template <class Sink> static inline void expand(const uint8_t* b, Sink&& sink) {
    const float d = half_to_float(b);
    nibbles(b + 2, _mm256_set1_ps(d), _mm256_set1_ps(-8.f * d), sink);
  }
#endif
};

struct BlockQ4_1 {
  static constexpr int QK = 32, BYTES = 20;
  static void dequant(const uint8_t* b, float* out) {
    const float d = half_to_float(b), m = half_to_float(b + 2);
    for (int i = 0; i < 16; ++i) {
      out[i] = static_cast<float>(b[4 + i] & 0xf) * d + m;
      out[i + 16] = static_cast<float>(b[4 + i] >> 4) * d + m;
    }
  }
#if defined(VOXLANE_AVX2)
  template <class Sink> static inline void expand(const uint8_t* b, Sink&& sink) {
    nibbles(b + 4, _mm256_set1_ps(half_to_float(b)), _mm256_set1_ps(half_to_float(b + 2)), sink);
  }
#endif
};

struct BlockQ5_0 {
  static constexpr int QK = 32, BYTES = 22;
  static void dequant(const uint8_t* b, float* out) {
    const float d = half_to_float(b);
    const uint32_t qh = load_u32(b + 2);
    for (int i = 0; i < 16; ++i) {
      const int lo = (b[6 + i] & 0xf) | (((qh >> i) & 1) << 4);
      const int hi = (b[6 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4);
      out[i] = static_cast<float>(lo - 16) * d;
      out[i + 16] = static_cast<float>(hi - 16) * d;
    }
  }
#if defined(VOXLANE_AVX2)
  template <class Sink> static inline void expand(const uint8_t* b, Sink&& sink) {
    const float df = half_to_float(b);
    const __m256 d = _mm256_set1_ps(df), offset = _mm256_set1_ps(-16.f * df);
    const __m256i qh = _mm256_set1_epi32(static_cast<int>(load_u32(b + 2)));
    const __m256i low = _mm256_set1_epi32(0xf), bit = _mm256_set1_epi32(0x10);
    for (int h = 0; h < 2; ++h) {
      const __m256i q = u8x8(b + 6 + 8 * h);
      // weight i's 5th bit is bit i of qh: shift each lane's own bit down, then up to bit 4
      const __m256i lo_shift = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256i at = _mm256_add_epi32(lo_shift, _mm256_set1_epi32(8 * h));
      const __m256i lo_bits = _mm256_and_si256(_mm256_slli_epi32(_mm256_srlv_epi32(qh, at), 4), bit);
      const __m256i hi_bits =
          _mm256_and_si256(_mm256_slli_epi32(_mm256_srlv_epi32(qh, _mm256_add_epi32(at, _mm256_set1_epi32(16))), 4), bit);
      sink(h, _mm256_fmadd_ps(VOXLANE_F(_mm256_or_si256(_mm256_and_si256(q, low), lo_bits)), d, offset));
      sink(h + 2, _mm256_fmadd_ps(VOXLANE_F(_mm256_or_si256(_mm256_srli_epi32(q, 4), hi_bits)), d, offset));
    }
  }
#endif
};

// Q4_K's 8 six-bit (scale, min) pairs packed in 12 bytes (ggml's get_scale_min_k4).
inline void q4k_scale_min(const uint8_t* s, int j, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

struct BlockQ4_K {
  static constexpr int QK = 256, BYTES = 144;
  static void dequant(const uint8_t* b, float* out) {
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    const uint8_t* q = b + 16;
    for (int j = 0; j < 8; j += 2) {  // 64 weights per 32 bytes: low nibbles, then high nibbles
      int s0, m0, s1, m1;
      q4k_scale_min(b + 4, j, s0, m0);
      q4k_scale_min(b + 4, j + 1, s1, m1);
      for (int l = 0; l < 32; ++l) {
        out[32 * j + l] = d * s0 * (q[l] & 0xf) - dmin * m0;
        out[32 * j + 32 + l] = d * s1 * (q[l] >> 4) - dmin * m1;
      }
      q += 32;
    }
  }
#if defined(VOXLANE_AVX2)
  template <class Sink> static inline void expand(const uint8_t* b, Sink&& sink) {
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    const __m256i low = _mm256_set1_epi32(0xf);
    for (int j = 0; j < 8; j += 2) {
      int s0, m0, s1, m1;
      q4k_scale_min(b + 4, j, s0, m0);
      q4k_scale_min(b + 4, j + 1, s1, m1);
      const __m256 d0 = _mm256_set1_ps(d * s0), o0 = _mm256_set1_ps(-dmin * m0);
      const __m256 d1 = _mm256_set1_ps(d * s1), o1 = _mm256_set1_ps(-dmin * m1);
      const uint8_t* q = b + 16 + 16 * j;
      for (int g = 0; g < 4; ++g) {
        const __m256i v = u8x8(q + 8 * g);
        sink(4 * j + g, _mm256_fmadd_ps(VOXLANE_F(_mm256_and_si256(v, low)), d0, o0));
        sink(4 * j + 4 + g, _mm256_fmadd_ps(VOXLANE_F(_mm256_srli_epi32(v, 4)), d1, o1));
      }
    }
  }
#endif
};

struct BlockQ6_K {
  static constexpr int QK = 256, BYTES = 210;
  static void dequant(const uint8_t* b, float* out) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_to_float(b + 208);
    for (int n = 0; n < 256; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        out[n + l] = d * sc[is] * static_cast<float>(((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32);
        out[n + l + 32] = d * sc[is + 2] * static_cast<float>(((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
        out[n + l + 64] = d * sc[is + 4] * static_cast<float>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        out[n + l + 96] = d * sc[is + 6] * static_cast<float>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
#if defined(VOXLANE_AVX2)
  template <class Sink> static inline void expand(const uint8_t* b, Sink&& sink) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_to_float(b + 208);
    const __m256i low = _mm256_set1_epi32(0xf), two = _mm256_set1_epi32(3), bias = _mm256_set1_epi32(32);
    for (int half = 0; half < 2; ++half) {
      const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
      const int8_t* s = sc + 8 * half;
      for (int l = 0; l < 32; l += 8) {
        const int is = l / 16;
        const __m256i a = u8x8(ql + l), c = u8x8(ql + l + 32), h = u8x8(qh + l);
        const __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, low), _mm256_slli_epi32(_mm256_and_si256(h, two), 4));
        const __m256i q2 = _mm256_or_si256(_mm256_and_si256(c, low),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2), two), 4));
        const __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(a, 4),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 4), two), 4));
        const __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(c, 4), _mm256_slli_epi32(_mm256_srli_epi32(h, 6), 4));
        const int g = 16 * half + l / 8;  // group of weights 128 half + l ..
        sink(g, _mm256_mul_ps(VOXLANE_F(_mm256_sub_epi32(q1, bias)), _mm256_set1_ps(d * s[is])));
        sink(g + 4, _mm256_mul_ps(VOXLANE_F(_mm256_sub_epi32(q2, bias)), _mm256_set1_ps(d * s[is + 2])));
        sink(g + 8, _mm256_mul_ps(VOXLANE_F(_mm256_sub_epi32(q3, bias)), _mm256_set1_ps(d * s[is + 4])));
        sink(g + 12, _mm256_mul_ps(VOXLANE_F(_mm256_sub_epi32(q4, bias)), _mm256_set1_ps(d * s[is + 6])));
      }
    }
  }
#endif
};

// Calls f(BlockType{}) for a format id; false for an unknown id.
template <class F> inline bool with_format(int64_t format, F&& f) {
  switch (format) {
    case F32: f(BlockF32{}); return true;
    case I8: f(BlockI8{}); return true;
    case Q4_0: f(BlockQ4_0{}); return true;
    case Q4_1: f(BlockQ4_1{}); return true;
    case Q5_0: f(BlockQ5_0{}); return true;
    case Q8_0: f(BlockQ8_0{}); return true;
    case Q4_K: f(BlockQ4_K{}); return true;
    case Q6_K: f(BlockQ6_K{}); return true;
    default: return false;
  }
}

}  // namespace voxlane::gguf

namespace voxlane {

// How far ahead (bytes) the kernels prefetch the weights: the same block of the row group at least
// 4 KB further on, every cache line of it. The R rows of a group are contiguous, and each row is a
// few hundred bytes to a few KB read in R interleaved streams, too short for the hardware
// prefetcher to get ahead within one. Measured on Qwen2.5-0.5B's matrices (1 thread, batch 1, int8
// activations): the next group's first line per block (the old way) streamed 374 MB in ~126 ms,
// every line >= 4 KB ahead in ~86-96 ms (load ~7; K-quant blocks span 3-4 lines, of which only
// the first was fetched).
inline int64_t prefetch_distance(int64_t group_bytes) {
  constexpr int64_t kAhead = 4096;
  return (kAhead + group_bytes - 1) / group_bytes * group_bytes;
}

// Calls f(std::integral_constant<int, m>{}) with m = M clamped to [Lo, Hi]: a runtime row count as the
// template constant a kernel's register tile is unrolled for (one instantiation per count).
template <int Lo, int Hi, class F> inline void with_rows(int64_t M, F&& f) {
  if constexpr (Lo < Hi) {
    if (M > Lo) return with_rows<Lo + 1, Hi>(M, f);
  }
  f(std::integral_constant<int, Lo>{});
}

}  // namespace voxlane
