// Int8 activations, llama.cpp's way: each activation row is quantized once per matmul into Q8
// blocks (32 int8 values q, one fp32 scale d = amax / 127, and s = d * sum(q) for the formats with
// a "min"), and the weight x activation products of a block are integer dot products
// (AVX2 `vpmaddubsw` + `vpmaddwd`: 32 byte products summed to 8 int32 lanes in two instructions),
// scaled to fp32 once per 32 weights. Against quant_matmul.h's fp32 path (each weight expanded to
// fp32 and FMA'd) that is ~1/4 of the instructions per weight; the price is the activations'
// rounding to 8 bits per block of 32 (what llama.cpp does for these formats on every CPU).
//
// Each GGUF format is seen as 32-weight sub-blocks j with w_i = a_j * u_i + c_j, u_i bytes:
//   Q8_0  u = q (signed)                    a = d              c = 0
//   Q4_0  u = nibble                        a = d              c = -8 d
//   Q4_1  u = nibble                        a = d              c = m
//   Q5_0  u = nibble | 5th bit << 4         a = d              c = -16 d
//   Q4_K  u = nibble of sub-block j         a = d sc_j         c = -dmin m_j
//   Q6_K  u = 6-bit q, weight q - 32, and a 16-bit multiplier sc per 16 weights, a = d, c = 0
// so dot(w, x) over a sub-block = a * dx * sum(u * q * mult) + c * s: unsigned u go straight into
// vpmaddubsw (u <= 31 keeps 2 * 31 * 127 under int16's limit), signed ones through the sign trick
// (|u| times q with u's sign, as ggml's mul_sum_i8_pairs); Q6_K's pairs are vpmaddubsw(u, q) minus
// vpmaddubsw(32, q) (|u - 32| * 127 * 2 < 2^15), then vpmaddwd with the multipliers.
// The portable fallback dequantizes the weight block (gguf_blocks.h) and multiplies it with the
// dequantized activations q * d: the same sum up to fp32 rounding order.
//
// With VNNI (AVX512-VNNI + VL, or AVX-VNNI) one `vpdpbusd` does what vpmaddubsw + vpmaddwd(1) do
// (4 byte products into each int32 lane, no int16 step, so no int16 saturation either), and Q8_0
// is read as unsigned u = q + 128 (q xor 0x80) with c = -128 d, like Q4_0's offset: one xor per 32
// weights instead of the sign trick's two vpsignb per activation row. Q6_K keeps vpmaddwd (its
// 16-bit scales ride in it). With AVX-512 (BW + VNNI) too, the 8 sub-blocks of a group go two at a
// time through 512-bit vectors, and their lanes are summed with vpermt2d instead of vphaddd.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "gguf_blocks.h"
#include "quant_matmul.h"

namespace voxlane {

constexpr int64_t kQ8 = 32;  // activation values per Q8 block

// Rows of activations as Q8 blocks: q [rows, K] int8, d and s [rows, K / 32] fp32 (row-major).
struct Q8Rows {
  int8_t* q = nullptr;
  float *d = nullptr, *s = nullptr;
  int64_t K = 0;
  int64_t blocks() const { return K / kQ8; }
  Q8Rows at_row(int64_t m) const { return {q + m * K, d + m * blocks(), s + m * blocks(), K}; }
};

template <class B> constexpr bool is_q8_block() { return false; }
template <> constexpr bool is_q8_block<gguf::BlockQ8_0>() { return true; }
template <> constexpr bool is_q8_block<gguf::BlockQ4_0>() { return true; }
template <> constexpr bool is_q8_block<gguf::BlockQ4_1>() { return true; }
template <> constexpr bool is_q8_block<gguf::BlockQ5_0>() { return true; }
template <> constexpr bool is_q8_block<gguf::BlockQ4_K>() { return true; }
template <> constexpr bool is_q8_block<gguf::BlockQ6_K>() { return true; }

// Whether a weight format has an integer path (the GGUF block formats; not our I8 or fp32).
inline bool has_q8_path(int64_t format) {
  bool ok = false;
  gguf::with_format(format, [&](auto block) { ok = is_q8_block<decltype(block)>(); });
  return ok;
}

// x[0, n) (n a multiple of 32) -> Q8 blocks at q, d, s: d = amax / 127, q = round(x * (1 / d)) with
// ties to even (ggml's quantize_row_q8_0, and torch.round in the tests' twin), s = d * sum(q).
inline void quantize_q8(const float* x, int64_t n, int8_t* q, float* d, float* s) {
  for (int64_t b = 0; b < n / kQ8; ++b) {
    const float* xb = x + kQ8 * b;
    int8_t* qb = q + kQ8 * b;
#if defined(VOXLANE_AVX2)
    const __m256 sign_bit = _mm256_set1_ps(-0.f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int g = 0; g < 4; ++g) {
      v[g] = _mm256_loadu_ps(xb + 8 * g);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_bit, v[g]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float db = _mm_cvtss_f32(m4) / 127.f, id = db != 0.f ? 1.f / db : 0.f;
    __m256i i[4];
    for (int g = 0; g < 4; ++g)
      i[g] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[g], _mm256_set1_ps(id)),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4e));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1));
    // int32 x 32 -> int8 x 32: the packs interleave 128-bit lanes; the permute puts them back in order.
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb),
                        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const int sum = _mm_cvtsi128_si32(t4);
#else
    float amax = 0.f;
    for (int k = 0; k < kQ8; ++k) amax = std::fmax(amax, std::fabs(xb[k]));
    const float db = amax / 127.f, id = db != 0.f ? 1.f / db : 0.f;
    int sum = 0;
    for (int k = 0; k < kQ8; ++k) {
      qb[k] = static_cast<int8_t>(std::nearbyint(xb[k] * id));
      sum += qb[k];
    }
#endif
    d[b] = db;
    s[b] = db * static_cast<float>(sum);
  }
}

// M rows of x (row stride ldx) -> rows of xq.
inline void quantize_rows(const float* x, int64_t M, int64_t ldx, const Q8Rows& xq) {
  for (int64_t m = 0; m < M; ++m) {
    const Q8Rows row = xq.at_row(m);
    quantize_q8(x + m * ldx, xq.K, row.q, row.d, row.s);
  }
}

#if defined(VOXLANE_AVX2)
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define VOXLANE_VNNI 1
#endif

// Lane i = u[4i..4i+3] . q[4i..4i+3] (u unsigned bytes, q signed). Without VNNI, u <= 31 or the
// sign trick's |u| <= 128 keep vpmaddubsw's pair sums within int16.
inline __m256i dot_u8_i8(__m256i u, __m256i q) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, q);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, q);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1));
#endif
}

// Each format's 32-weight sub-blocks: sink(j, u [32 bytes], mult [16 x int16], a, c) for j in
// [0, QK / 32). SIGNED: u is signed (sign trick); else unsigned (<= 31 without VNNI). MIN: c != 0.
// SCALED: mult holds 16-bit multipliers (else ones: mult is not used), and the weights are u - BIAS.
template <class B> struct Q8Dot;

// One sub-block's integer products u . x in int32 lanes (each lane 4 consecutive weights).
template <class Dot> inline __m256i sub_block_dot(__m256i u, __m256i mult, __m256i x) {
  if constexpr (Dot::SIGNED) {
    return dot_u8_i8(_mm256_sign_epi8(u, u), _mm256_sign_epi8(x, u));
  } else if constexpr (Dot::SCALED) {
    const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(u, x),
                                           _mm256_maddubs_epi16(_mm256_set1_epi8(Dot::BIAS), x));
    return _mm256_madd_epi16(pairs, mult);
  } else {
    return dot_u8_i8(u, x);
  }
}

inline __m256i nibbles_32(const uint8_t* qs) {  // 16 bytes -> 32 weights: low nibbles first
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0xf));
}
inline __m256i ones16() { return _mm256_set1_epi16(1); }

template <> struct Q8Dot<gguf::BlockQ8_0> {
#if defined(VOXLANE_VNNI)
  static constexpr bool SIGNED = false, MIN = true, SCALED = false;  // u = q + 128, c = -128 d
  template <class Sink> static inline void blocks(const uint8_t* b, Sink&& sink) {
    const float d = gguf::half_to_float(b);
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    sink(0, _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80))), ones16(), d, -128.f * d);
  }
#else
  static constexpr bool SIGNED = true, MIN = false, SCALED = false;
  template <class Sink> static inline void blocks(const uint8_t* b, Sink&& sink) {
    sink(0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), ones16(), gguf::half_to_float(b), 0.f);
  }
#endif
};

template <> struct Q8Dot<gguf::BlockQ4_0> {
  static constexpr bool SIGNED = false, MIN = true, SCALED = false;
  template <class Sink> static inline void blocks(const uint8_t* b, Sink&& sink) {
    const float d = gguf::half_to_float(b);
    sink(0, nibbles_32(b + 2), ones16(), d, -8.f * d);
  }
};

template <> struct Q8Dot<gguf::BlockQ4_1> {
  static constexpr bool SIGNED = false, MIN = true, SCALED = false;
  template <class Sink> static inline void blocks(const uint8_t* b, Sink&& sink) {
    sink(0, nibbles_32(b + 4), ones16(), gguf::half_to_float(b), gguf::half_to_float(b + 2));
  }
};

template <> struct Q8Dot<gguf::BlockQ5_0> {
  static constexpr bool SIGNED = false, MIN = true, SCALED = false;
  template <class Sink> static inline void blocks(const uint8_t* b, Sink&& sink) {
    const float d = gguf::half_to_float(b);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    // bit i of qh is byte i's 5th bit: qh is a byte mask
    const __m256i fifth = _mm256_maskz_mov_epi8(static_cast<__mmask32>(gguf::load_u32(b + 2)), _mm256_set1_epi8(0x10));
#else
    // bit i of qh -> byte i (ggml's bytes_from_bits_32): broadcast qh's byte i/8 to byte i, set
    // every bit but bit i%8, and compare with all-ones.
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(gguf::load_u32(b + 2))),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0x0000000000000000));
    const __m256i is_set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                             _mm256_set1_epi64x(-1));
    const __m256i fifth = _mm256_and_si256(is_set, _mm256_set1_epi8(0x10));
#endif
    sink(0, _mm256_or_si256(nibbles_32(b + 6), fifth), ones16(), d, -16.f * d);
  }
};

template <> struct Q8Dot<gguf::BlockQ4_K> {
  static constexpr bool SIGNED = false, MIN = true, SCALED = false;
  template <class Sink> static inline void blocks(const uint8_t* b, Sink&& sink) {
    const float d = gguf::half_to_float(b), dmin = gguf::half_to_float(b + 2);
    const __m256i low = _mm256_set1_epi8(0xf);
    for (int k = 0; k < 4; ++k) {  // 32 bytes: sub-block 2k in the low nibbles, 2k + 1 in the high
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * k));
      int s0, m0, s1, m1;
      gguf::q4k_scale_min(b + 4, 2 * k, s0, m0);
      gguf::q4k_scale_min(b + 4, 2 * k + 1, s1, m1);
      sink(2 * k, _mm256_and_si256(q, low), ones16(), d * s0, -dmin * m0);
      sink(2 * k + 1, _mm256_and_si256(_mm256_srli_epi16(q, 4), low), ones16(), d * s1, -dmin * m1);
    }
  }
};

template <> struct Q8Dot<gguf::BlockQ6_K> {  // u = the 6-bit q (unsigned); BIAS: the weight is q - 32
  static constexpr bool SIGNED = false, MIN = false, SCALED = true;
  static constexpr int BIAS = 32;
  template <class Sink> static inline void blocks(const uint8_t* b, Sink&& sink) {
    const float d = gguf::half_to_float(b + 208);
    // the 16 int8 scales as int16, two per 32-bit lane: lane i holds sc[2i] | sc[2i + 1] << 16
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    // sub-block j's multipliers: sc[2j] in the low 128 bits (its weights 0-15), sc[2j + 1] in the high
    const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                            2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    const __m256i low = _mm256_set1_epi8(0xf), high = _mm256_set1_epi8(0x30);
    for (int half = 0; half < 2; ++half) {  // 128 weights: ql[64 half ..], qh[32 half ..], sc[8 half ..]
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * half));
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * half));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * half + 32));
      for (int k = 0; k < 4; ++k) {  // sub-block 4 half + k: ql + 32 (k & 1), nibble k >> 1, qh bits 2k
        const int j = 4 * half + k;
        const __m256i ql = k & 1 ? ql1 : ql0;
        const __m256i nib = _mm256_and_si256(k >> 1 ? _mm256_srli_epi16(ql, 4) : ql, low);
        const __m256i hi = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * k), 4), high);
        const __m256i mult = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(j)), spread);
        sink(j, _mm256_or_si256(nib, hi), mult, d, 0.f);
      }
    }
  }
};

// Eight consecutive 32-weight sub-blocks at once (a K-quant's 256-weight block, or eight blocks of a
// 32-weight format): their sub-block scales as vectors, lane j for sub-block j, a (the factor of
// sum(u * q * mult)) and c (the factor of the activations' s), so the eight integer sums are scaled
// and added with one conversion and two FMAs instead of eight of each and eight scalar ones.
// scales(b, a, c): b is the group's first byte (BYTES * 8 / J bytes).
template <class B> struct Q8GroupScales;

// The fp16 at byte `at` of each of 8 blocks of `bytes` bytes, as 8 floats.
template <int BYTES> inline __m256 halves_8(const uint8_t* b, int at) {
  uint16_t h[8];
  for (int j = 0; j < 8; ++j) std::memcpy(&h[j], b + BYTES * j + at, 2);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}

// Formats whose weights are stored with an offset (q - ZERO): the activations' sum s scaled by -ZERO * d.
template <class B, int ZERO> struct Q8OffsetScales {
  static inline void scales(const uint8_t* b, __m256& a, __m256& c) {
    a = halves_8<B::BYTES>(b, 0);
    c = _mm256_mul_ps(a, _mm256_set1_ps(-float(ZERO)));
  }
};
#if defined(VOXLANE_VNNI)
template <> struct Q8GroupScales<gguf::BlockQ8_0> : Q8OffsetScales<gguf::BlockQ8_0, 128> {};  // u = q + 128
#else
template <> struct Q8GroupScales<gguf::BlockQ8_0> {
  static inline void scales(const uint8_t* b, __m256& a, __m256& c) {
    a = halves_8<gguf::BlockQ8_0::BYTES>(b, 0);
    c = _mm256_setzero_ps();
  }
};
#endif
template <> struct Q8GroupScales<gguf::BlockQ4_0> : Q8OffsetScales<gguf::BlockQ4_0, 8> {};
template <> struct Q8GroupScales<gguf::BlockQ4_1> {
  static inline void scales(const uint8_t* b, __m256& a, __m256& c) {
    a = halves_8<gguf::BlockQ4_1::BYTES>(b, 0);
    c = halves_8<gguf::BlockQ4_1::BYTES>(b, 2);
  }
};
template <> struct Q8GroupScales<gguf::BlockQ5_0> : Q8OffsetScales<gguf::BlockQ5_0, 16> {};
template <> struct Q8GroupScales<gguf::BlockQ4_K> {
  // The 12 bytes of 6-bit (scale, min) pairs -> 8 scale bytes then 8 min bytes (ggml's kmask steps).
  static inline void scales(const uint8_t* b, __m256& a, __m256& c) {
    uint32_t u[4];
    std::memcpy(u, b + 4, 12);
    constexpr uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
    u[3] = ((u[2] >> 4) & four) | (((u[1] >> 6) & two) << 4);
    const uint32_t mins_low = u[1] & six;
    u[1] = (u[2] & four) | (((u[0] >> 6) & two) << 4);
    u[2] = mins_low;
    u[0] &= six;
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    a = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), _mm256_set1_ps(gguf::half_to_float(b)));
    c = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))),
                      _mm256_set1_ps(-gguf::half_to_float(b + 2)));
  }
};
template <> struct Q8GroupScales<gguf::BlockQ6_K> {
  static inline void scales(const uint8_t* b, __m256& a, __m256& c) {  // the 16-bit scales are in mult
    a = _mm256_set1_ps(gguf::half_to_float(b + 208));
    c = _mm256_setzero_ps();
  }
};

// Lane j = the sum of p[j]'s 8 lanes.
inline __m256i sum_lanes_8(const __m256i* p) {
  const __m256i lo = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
  const __m256i hi = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
  // lo = [p0 p1 p2 p3 (lanes 0-3) | p0 p1 p2 p3 (lanes 4-7)], hi likewise for p4..p7
  return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31));
}

// The 8 integer dot products of a group's sub-blocks u[j] (mult[j]) with 8 consecutive Q8 blocks
// of activations at qx: lane j = sub-block j's.
template <class Dot> inline __m256i group_dots(const __m256i* u, const __m256i* mult, const int8_t* qx) {
  __m256i p[8];
  for (int j = 0; j < 8; ++j)
    p[j] = sub_block_dot<Dot>(u[j], mult[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + kQ8 * j)));
  return sum_lanes_8(p);
}

#if defined(VOXLANE_VNNI) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define VOXLANE_ZMM 1
// Formats whose sub-blocks go two at a time through 512-bit vectors: unsigned u (AVX-512 has no
// vpsignb; only Q8_0 without VNNI is signed).
template <class Dot> constexpr bool kZmmDots = !Dot::SIGNED;

// group_dots with u2[k] (mult2[k]) = sub-blocks 2k (low half) and 2k + 1 (high half): 4 vpdpbusd
// (or Q6_K's vpmaddubsw pairs) instead of 8, and the lanes summed by three levels of vpermt2d +
// vpaddd (13 uops against sum_lanes_8's ~21: vphaddd is 3 uops on Intel).
template <class Dot> inline __m256i group_dots_zmm(const __m512i* u2, const __m512i* mult2, const int8_t* qx) {
  __m512i p[4];
  for (int k = 0; k < 4; ++k) {
    const __m512i x = _mm512_loadu_si512(qx + 2 * kQ8 * k);
    if constexpr (Dot::SCALED) {
      const __m512i pairs = _mm512_sub_epi16(_mm512_maddubs_epi16(u2[k], x),
                                             _mm512_maddubs_epi16(_mm512_set1_epi8(Dot::BIAS), x));
      p[k] = _mm512_madd_epi16(pairs, mult2[k]);
    } else {
      p[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u2[k], x);
    }
  }
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  auto fold = [&](__m512i a, __m512i b) {  // lane i = a's (i < 8) or b's lanes 2i, 2i + 1 summed
    return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
  };
  // p[k]: lanes 0-7 sub-block 2k, 8-15 sub-block 2k + 1 -> 4 lanes per sub-block -> 2 per sub-block
  const __m512i r = fold(fold(p[0], p[1]), fold(p[2], p[3]));
  // lanes 2j, 2j + 1 of r: sub-block j; add them in the low half of each 64-bit lane, then narrow
  return _mm512_cvtepi64_epi32(_mm512_add_epi32(r, _mm512_srli_epi64(r, 32)));
}
#endif
#endif

// sums[m * R + r] = dot(x row m, weight row r) for R consecutive weight rows starting at w, x as
// Q8 blocks (rows of xq).
template <class B, int R, int MB>
inline void dot_rows_q8(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const Q8Rows& xq, float* sums) {
  constexpr int J = B::QK / kQ8;  // Q8 blocks per weight block
  const int64_t xb_per_row = xq.blocks();
#if defined(VOXLANE_AVX2)
  using Dot = Q8Dot<B>;
  __m256 acc[R][MB];
  float mins[R][MB];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = _mm256_setzero_ps(), mins[r][m] = 0.f;
  const int64_t group = R * row_bytes, ahead = prefetch_distance(group);
  // Groups of 8 sub-blocks (G weight blocks) with integer sums per sub-block, then the rest block by block.
  constexpr int G = 8 / J;
  const int64_t grouped = nblocks / G * G;
  for (int64_t blk = 0; blk < grouped; blk += G) {
    const int64_t xb0 = blk * J;  // the group's first Q8 block
    for (int r = 0; r < R; ++r) {
      const uint8_t* wb = w + r * row_bytes + blk * B::BYTES;
      for (int line = 0; line < G * B::BYTES; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(wb + ahead + line), _MM_HINT_T0);
      __m256i u[8], mult[8];
      for (int g = 0; g < G; ++g)
        Dot::blocks(wb + g * B::BYTES, [&](int j, __m256i uj, __m256i mj, float, float) {
          u[g * J + j] = uj;
          mult[g * J + j] = mj;
        });
#if defined(VOXLANE_ZMM)
      __m512i u2[4], mult2[4];
      if constexpr (kZmmDots<Dot>)
        for (int k = 0; k < 4; ++k) {
          u2[k] = _mm512_inserti64x4(_mm512_castsi256_si512(u[2 * k]), u[2 * k + 1], 1);
          if constexpr (Dot::SCALED)
            mult2[k] = _mm512_inserti64x4(_mm512_castsi256_si512(mult[2 * k]), mult[2 * k + 1], 1);
        }
#endif
      __m256 a, c;
      Q8GroupScales<B>::scales(wb, a, c);
      for (int m = 0; m < MB; ++m) {
        const int8_t* qx = xq.q + m * xq.K + kQ8 * xb0;
        __m256i dots;
#if defined(VOXLANE_ZMM)
        if constexpr (kZmmDots<Dot>) dots = group_dots_zmm<Dot>(u2, mult2, qx);
        else
#endif
          dots = group_dots<Dot>(u, mult, qx);
        const __m256 dx = _mm256_loadu_ps(xq.d + m * xb_per_row + xb0);
        acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(a, dx), acc[r][m]);
        if constexpr (Dot::MIN) acc[r][m] = _mm256_fmadd_ps(c, _mm256_loadu_ps(xq.s + m * xb_per_row + xb0), acc[r][m]);
      }
    }
  }
  for (int64_t blk = grouped; blk < nblocks; ++blk) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* wb = w + r * row_bytes + blk * B::BYTES;
      for (int line = 0; line < B::BYTES; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(wb + ahead + line), _MM_HINT_T0);
      Dot::blocks(wb, [&](int j, __m256i u, __m256i mult, float a, float c) {
        const int64_t xb = blk * J + j;
        for (int m = 0; m < MB; ++m) {
          const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q + m * xq.K + kQ8 * xb));
          const __m256i dot = sub_block_dot<Dot>(u, mult, qx);
          acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(a * xq.d[m * xb_per_row + xb]), acc[r][m]);
          if constexpr (Dot::MIN) mins[r][m] += c * xq.s[m * xb_per_row + xb];
        }
      });
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) sums[m * R + r] = hsum(acc[r][m]) + mins[r][m];
#else
  float block[B::QK];
  for (int i = 0; i < R * MB; ++i) sums[i] = 0.f;
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    for (int r = 0; r < R; ++r) {
      B::dequant(w + r * row_bytes + blk * B::BYTES, block);
      for (int m = 0; m < MB; ++m) {
        float s = 0.f;
        for (int j = 0; j < J; ++j) {
          const int64_t xb = blk * J + j;
          const int8_t* q = xq.q + m * xq.K + kQ8 * xb;
          float part = 0.f;
          for (int k = 0; k < kQ8; ++k) part += block[kQ8 * j + k] * static_cast<float>(q[k]);
          s += part * xq.d[m * xb_per_row + xb];
        }
        sums[m * R + r] += s;
      }
    }
  }
#endif
}

template <class B, int R, int MB>
inline void rows_times_q8(const QWeight& w, const Q8Rows& xq, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t nblocks = w.cols / B::QK;
  row_groups<R, MB>(w, y, ldy, n0, n1, [&](auto rows, const uint8_t* p, float* sums) {
    dot_rows_q8<B, decltype(rows)::value, MB>(p, w.row_bytes, nblocks, xq, sums);
  });
}

template <class B>
inline void matvec_q8_format(const QWeight& w, const Q8Rows& xq, int64_t M, float* y, int64_t ldy, int64_t n0,
                             int64_t n1) {
  switch (M) {
    case 1: rows_times_q8<B, 4, 1>(w, xq, y, ldy, n0, n1); break;
    case 2: rows_times_q8<B, 4, 2>(w, xq, y, ldy, n0, n1); break;
    case 3: rows_times_q8<B, 2, 3>(w, xq, y, ldy, n0, n1); break;
    case 4: rows_times_q8<B, 2, 4>(w, xq, y, ldy, n0, n1); break;
    case 5: rows_times_q8<B, 1, 5>(w, xq, y, ldy, n0, n1); break;
    case 6: rows_times_q8<B, 1, 6>(w, xq, y, ldy, n0, n1); break;
    case 7: rows_times_q8<B, 1, 7>(w, xq, y, ldy, n0, n1); break;
    default: rows_times_q8<B, 1, 8>(w, xq, y, ldy, n0, n1); break;
  }
}

// Activation rows from which the int8 tiles take a prompt chunk's products (below: the vector path).
constexpr int64_t kQ8TileMinRows = 16;

#if defined(VOXLANE_AMX_INT8)
// ---- AMX int8 tiles for int8-activation prompt chunks (16+ rows) -----------------------------------------
// TDPBSSD / TDPBUSD multiply a tile of signed / unsigned bytes A (16 rows x 4K) by a tile of signed
// bytes B (K rows of 16 x 4 bytes) into 16 x 16 int32 sums. Here A = 16 weight rows of one 32-weight
// sub-block (K = 32: rows of 32 bytes), B = the Q8 blocks of 16 activation rows at that sub-block
// (8 rows of [16 activation rows][4 bytes], packed once per phase and worker: XPack::q8), so one
// product is the 256 integer sums u . q of a sub-block (16 x 16 x 32 multiply-adds), stored, and the
// epilogue applies the scales in fp32 as the vector path does, a * dx (+ c * s): per weight row n one
// vector over the 16 activation rows, acc[n] += float(C[n]) * (a[n] * dx) (+ c[n] * s). The
// weights of a panel of 16 rows are unpacked from the file's blocks (Q8Dot's u) into a per-worker
// buffer once per task: the offset formats (Q8_0 as u = q + 128, Q4_0 / Q5_0's nibbles with c = -Z a)
// as the signed u - Z (TDPBSSD, no min term), Q4_1 and Q4_K's nibbles as unsigned u with their c
// (TDPBUSD). Q6_K's scales are per 16 weights (an int8 sc each, w = d sc (q - 32)): two products of
// K = 16 per sub-block (A tiles of 16-byte rows; the B tile's first and last 4 rows), and the epilogue
// adds both halves with a = d sc of each. The same integer sums as dot_rows_q8; the scales are applied
// in another fp32 order (Q6_K: d sc in fp32, exact, instead of sc in the integer sum).
namespace amx {

template <class B> struct TileQ8 { static constexpr bool ok = false; };
template <class B, bool S, int Z, bool H = false> struct TileQ8Of {
  static constexpr bool ok = true, SIGNED = S;
  static constexpr int ZERO = Z;  // SIGNED: the weight byte is u - ZERO (and c = -ZERO a is not applied)
  static constexpr bool HALVES = H;  // a scale per 16 weights (Q6_K): sa for the first 16, sc the last
};
template <> struct TileQ8<gguf::BlockQ8_0> : TileQ8Of<gguf::BlockQ8_0, true, 128> {};  // Q8Dot's u = q ^ 0x80
template <> struct TileQ8<gguf::BlockQ4_0> : TileQ8Of<gguf::BlockQ4_0, true, 8> {};
template <> struct TileQ8<gguf::BlockQ5_0> : TileQ8Of<gguf::BlockQ5_0, true, 16> {};
template <> struct TileQ8<gguf::BlockQ4_1> : TileQ8Of<gguf::BlockQ4_1, false, 0> {};
template <> struct TileQ8<gguf::BlockQ4_K> : TileQ8Of<gguf::BlockQ4_K, false, 0> {};
template <> struct TileQ8<gguf::BlockQ6_K> : TileQ8Of<gguf::BlockQ6_K, true, 32, true> {};  // u = the 6-bit q

// Tiles: C0-C3 (16 x 16 int32), A0, A1 (16 weight rows x K bytes), B0, B1 (K / 4 rows x 64 bytes);
// K = 32 (a sub-block), or 16 (half of one: Q6_K).
template <int K> inline const TileConfig& q8_tile_config() {
  static const TileConfig config = TileConfig().tiles(0, 4, 16, 64).tiles(4, 2, 16, K).tiles(6, 2, K / 4, 64);
  return config;
}

// _tile_stored without gcc's "memory" clobber: the 1 KB it writes is the asm's output operand, so what
// the compiler holds for other memory (the loop's pointers and scales, the accumulators it keeps on
// the stack) is not written back and read again around every store (a clobber says any memory may have
// changed). Tile loads read memory the compiler does not see: q8_weights puts a barrier after writing
// their sources.
// T: the tile's number (gcc pastes it into the instruction text: a literal, here a template argument).
template <int T>
__attribute__((always_inline)) inline void tile_store(int32_t* buf) {
  __asm__ volatile("{tilestored\t%%tmm%c2, (%1,%3,1)|tilestored\t[%1+%3*1], %%tmm%c2}"
                   : "=m"(*reinterpret_cast<int32_t(*)[256]>(buf))
                   : "r"(buf), "i"(T), "r"(64L));
}

// xq's first M rows -> p.q8 / q8d / q8s (XPack), zeros past M.
inline void pack_q8_tiles(const Q8Rows& xq, int64_t M, XPack& p) {
  const int64_t J = xq.blocks(), mblocks = (M + 15) / 16;
  p.q8.resize(static_cast<size_t>(mblocks * J * 512));
  p.q8d.resize(static_cast<size_t>(mblocks * J * 16));
  p.q8s.resize(static_cast<size_t>(mblocks * J * 16));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i q_rows = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(xq.K)));
  const __m512i s_rows = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(J)));
  for (int64_t mb = 0; mb < mblocks; ++mb) {
    const int64_t m0 = mb * 16, rows = std::min<int64_t>(16, M - m0);
    const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1);
    const int8_t* q = xq.q + m0 * xq.K;
    for (int64_t j = 0; j < J; ++j) {
      int8_t* tile = p.q8.data() + (mb * J + j) * 512;
      for (int r = 0; r < 8; ++r)  // B row r: bytes 4r .. 4r + 3 of the block, of each of the 16 rows
        _mm512_storeu_si512(tile + 64 * r, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, q_rows,
                                                                     q + 32 * j + 4 * r, 1));
      const int64_t at = (mb * J + j) * 16;
      _mm512_storeu_ps(p.q8d.data() + at, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, s_rows, xq.d + m0 * J + j, 4));
      _mm512_storeu_ps(p.q8s.data() + at, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, s_rows, xq.s + m0 * J + j, 4));
    }
  }
  p.q8_ready = true;
}

// Weight rows [p0, p0 + rows) (rows <= 16) -> a [16][K] bytes (TileQ8's u or u - ZERO) and the
// sub-blocks' scales sa, sc [K / 32][16] (rows past `rows`: zeros).
template <class B>
inline void unpack_q8_panel(const uint8_t* data, int64_t row_bytes, int64_t K, int64_t p0, int64_t rows, uint8_t* a,
                            float* sa, float* sc) {
  using T = TileQ8<B>;
  constexpr int J = B::QK / kQ8;
  const int64_t nblocks = K / B::QK;
  if (rows < 16) {
    std::memset(a + rows * K, 0, (16 - rows) * K);
    for (int64_t j = 0; j < K / kQ8; ++j)
      for (int64_t r = rows; r < 16; ++r) sa[j * 16 + r] = sc[j * 16 + r] = 0.f;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = data + (p0 + r) * row_bytes;
    uint8_t* out = a + r * K;
    for (int64_t blk = 0; blk < nblocks; ++blk)
      Q8Dot<B>::blocks(row + blk * B::BYTES, [&](int j, __m256i u, __m256i, float scale, float min) {
        const int64_t sub = blk * J + j;
        if constexpr (T::SIGNED) u = _mm256_sub_epi8(u, _mm256_set1_epi8(static_cast<char>(T::ZERO)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kQ8 * sub), u);
        if constexpr (T::HALVES) {  // Q6_K: d times the int8 scales of the sub-block's two halves
          const int8_t* s16 = reinterpret_cast<const int8_t*>(row + blk * B::BYTES + 192) + 2 * j;
          sa[sub * 16 + r] = scale * s16[0];
          sc[sub * 16 + r] = scale * s16[1];
        } else {
          sa[sub * 16 + r] = scale;
          sc[sub * 16 + r] = min;
        }
      });
  }
}

// y[m, n] = xq[m] . W[n] (+ w.bias[n]) for weight rows [n0, n1) and M >= 16 rows of xq, in int8 tiles.
// pack: the worker's (xq's tiles kept across the tasks of a phase), or null (packed for this call).
template <class B>
inline void q8_weights(const QWeight& w, const Q8Rows& xq, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1,
                       XPack* pack) {
  using T = TileQ8<B>;
  thread_local XPack own;
  XPack& xp = pack ? *pack : own;
  if (!pack || !xp.q8_ready) pack_q8_tiles(xq, M, xp);
  const int64_t K = w.cols, J = K / kQ8, mblocks = (M + 15) / 16;
  thread_local std::vector<uint8_t> a;
  thread_local std::vector<float> sa, sc;
  thread_local std::vector<int32_t> c;  // four 16 x 16 tiles of sums (two banks of two)
  a.resize(16 * K);
  sa.resize(16 * J);
  sc.resize(16 * J);
  c.resize(4 * 256 + 16);
  int32_t* c0 = reinterpret_cast<int32_t*>((reinterpret_cast<uintptr_t>(c.data()) + 63) & ~uintptr_t(63));
  __asm__("" : "+r"(c0));
  // Plain pointers for the loops, made opaque (the empty asm): gcc otherwise re-reads them from the
  // thread_locals inside the loops, a call to __tls_get_addr each time (and the accumulators spilled
  // around the call).
  uint8_t* ap = a.data();
  float *sap = sa.data(), *scp = sc.data();
  __asm__("" : "+r"(ap), "+r"(sap), "+r"(scp));
  _tile_loadconfig(&q8_tile_config<T::HALVES ? 16 : 32>());
  // The first panel's bytes all asked for before its unpack reads them block by block (a task's first
  // panel comes from memory: one miss at a time would leave the unpack waiting on each line in turn).
  gemm::prefetch_panel(w.data, w.row_bytes, n0, std::min<int64_t>(n1, n0 + 16));
  for (int64_t p0 = n0; p0 < n1; p0 += 16) {
    const int64_t rows = std::min<int64_t>(16, n1 - p0);
    unpack_q8_panel<B>(w.data, w.row_bytes, K, p0, rows, ap, sap, scp);
    __asm__ volatile("" ::: "memory");  // the panel (and x's tiles) written before the tile loads read them
    // The next panel's bytes into L2 a few lines per unit of products (in one burst the prefetches
    // wait for free miss buffers, and nothing else runs meanwhile)
    const char* ahead = reinterpret_cast<const char*>(w.data + (p0 + 16) * w.row_bytes);
    const char* ahead_end = reinterpret_cast<const char*>(w.data + std::min<int64_t>(n1, p0 + 32) * w.row_bytes);
    const int64_t units = mblocks * (T::HALVES ? J : (J + 1) / 2);
    const int64_t per_unit = ahead < ahead_end ? ((ahead_end - ahead) / 64 + units) / units : 0;
    auto prefetch_ahead = [&] {
      for (int64_t i = 0; i < per_unit && ahead < ahead_end; ++i, ahead += 64) _mm_prefetch(ahead, _MM_HINT_T1);
    };
    const __mmask16 out_rows = static_cast<__mmask16>((1u << rows) - 1);
    const __m512 bias = w.bias ? _mm512_maskz_loadu_ps(out_rows, w.bias + p0) : _mm512_setzero_ps();
    for (int64_t mb = 0; mb < mblocks; ++mb) {
      const int8_t* bt = xp.q8.data() + mb * J * 512;
      const float *dx = xp.q8d.data() + mb * J * 16, *sx = xp.q8s.data() + mb * J * 16;
      __m512 acc[16];
      for (int n = 0; n < 16; ++n) acc[n] = _mm512_setzero_ps();
      // acc[n] += float(C[n]) * (a[n] dx) + c[n] s for sub-block j (sums) and, when given, j + 1 (next):
      // each accumulator read and written once for both
      auto scale_add = [&](const int32_t* sums, const int32_t* next, int64_t j) {
        const __m512 d0 = _mm512_loadu_ps(dx + j * 16), d1 = next ? _mm512_loadu_ps(dx + j * 16 + 16) : d0;
        __m512 s0 = d0, s1 = d1;
        if constexpr (!T::SIGNED) {
          s0 = _mm512_loadu_ps(sx + j * 16);
          s1 = next ? _mm512_loadu_ps(sx + j * 16 + 16) : s0;
        }
        const float *aj = sap + j * 16, *cj = scp + j * 16;
        for (int n = 0; n < 16; ++n) {
          __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums + 16 * n)),
                                     _mm512_mul_ps(_mm512_set1_ps(aj[n]), d0), acc[n]);
          if constexpr (!T::SIGNED) v = _mm512_fmadd_ps(_mm512_set1_ps(cj[n]), s0, v);
          if (next) {
            v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(next + 16 * n)),
                                _mm512_mul_ps(_mm512_set1_ps(aj[16 + n]), d1), v);
            if constexpr (!T::SIGNED) v = _mm512_fmadd_ps(_mm512_set1_ps(cj[16 + n]), s1, v);
          }
          acc[n] = v;
        }
      };
      // Q6_K: sums of the sub-block's first half (lo) and last half (hi), each with its own d sc
      auto scale_add_halves = [&](const int32_t* lo, const int32_t* hi, int64_t j) {
        const __m512 d = _mm512_loadu_ps(dx + j * 16);
        const float *alo = sap + j * 16, *ahi = scp + j * 16;
        for (int n = 0; n < 16; ++n) {
          const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(lo + 16 * n)),
                                           _mm512_mul_ps(_mm512_set1_ps(alo[n]), d), acc[n]);
          acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(hi + 16 * n)),
                                   _mm512_mul_ps(_mm512_set1_ps(ahi[n]), d), v);
        }
      };
      // Units of two products: two sub-blocks (or a Q6_K sub-block's two halves) into one bank of two
      // C tiles (bank 0: tiles 0, 1; bank 1: 2, 3), stored to that bank's two buffers. The products of
      // unit u + 1 are issued before unit u's epilogue, so the tile unit works while the vector units
      // apply the scales, and no epilogue waits on the product it reads. Tile numbers are immediates
      // (gcc's intrinsics paste them into the instruction): macros. A tiles 4, 5; B tiles 6, 7.
#define VOXLANE_Q8_PRODUCT(C, A, BT, j, a_at, b_at)                      \
  do {                                                                   \
    _tile_zero(C);                                                       \
    _tile_loadd(A, ap + kQ8 * (j) + (a_at), K);                          \
    _tile_loadd(BT, bt + (j) * 512 + (b_at), 64);                        \
    if constexpr (T::SIGNED) _tile_dpbssd(C, A, BT);                     \
    else _tile_dpbusd(C, A, BT);                                         \
  } while (0)
#define VOXLANE_Q8_ISSUE(C0, C1, u)                                      \
  do {                                                                   \
    if constexpr (T::HALVES) {                                           \
      VOXLANE_Q8_PRODUCT(C0, 4, 6, (u), 0, 0);                           \
      VOXLANE_Q8_PRODUCT(C1, 5, 7, (u), 16, 256);                        \
    } else {                                                             \
      VOXLANE_Q8_PRODUCT(C0, 4, 6, 2 * (u), 0, 0);                       \
      VOXLANE_Q8_PRODUCT(C1, 5, 7, 2 * (u) + 1, 0, 0);                   \
    }                                                                    \
  } while (0)
      auto epilogue = [&](int bank, int64_t u) {
        int32_t* s0 = c0 + 512 * bank;
        if constexpr (T::HALVES) {
          scale_add_halves(s0, s0 + 256, u);
        } else {
          scale_add(s0, s0 + 256, 2 * u);
        }
      };
      const int64_t U = T::HALVES ? J : J / 2;
      int64_t u = 0;
      if (U > 0) {
        VOXLANE_Q8_ISSUE(0, 1, 0);
        tile_store<0>(c0);
        tile_store<1>(c0 + 256);
      }
      for (; u + 2 <= U; u += 2) {  // bank 0 holds unit u (stored)
        VOXLANE_Q8_ISSUE(2, 3, u + 1);
        prefetch_ahead();
        epilogue(0, u);
        tile_store<2>(c0 + 512);
        tile_store<3>(c0 + 768);
        const bool more = u + 2 < U;
        if (more) VOXLANE_Q8_ISSUE(0, 1, u + 2);
        prefetch_ahead();
        epilogue(1, u + 1);
        if (more) {
          tile_store<0>(c0);
          tile_store<1>(c0 + 256);
        }
      }
      if (u < U) {
        prefetch_ahead();
        epilogue(0, u);
      }
      if (!T::HALVES && J % 2) {  // a lone last sub-block
        VOXLANE_Q8_PRODUCT(0, 4, 6, J - 1, 0, 0);
        tile_store<0>(c0);
        scale_add(c0, nullptr, J - 1);
      }
#undef VOXLANE_Q8_ISSUE
#undef VOXLANE_Q8_PRODUCT
      // acc[n] lanes = activation rows: transposed, each activation row's 16 outputs in one masked store
      gemm::transpose16(acc);
      const int64_t m0 = mb * 16, m1 = std::min(M, m0 + 16);
      for (int64_t m = m0; m < m1; ++m)
        _mm512_mask_storeu_ps(y + m * ldy + p0, out_rows, _mm512_add_ps(acc[m - m0], bias));
    }
  }
  _tile_release();
}

}  // namespace amx
#endif

// Whether format's int8-activation products of kQ8TileMinRows+ rows run in AMX int8 tiles here (AMX
// allowed and usable, and the format has them); elsewhere the vector path (dot_rows_q8).
inline bool q8_tiles(int64_t format) {
  bool ok = false;
#if defined(VOXLANE_AMX_INT8)
  gguf::with_format(format, [&](auto block) {
    if constexpr (amx::TileQ8<decltype(block)>::ok) ok = amx_runs();
  });
#else
  (void)format;
#endif
  return ok;
}

// y[m, n] = xq[m] . W[n] for rows n in [n0, n1) and M rows of xq (groups of 8); xq.K == w.cols.
// A format without an integer path (has_q8_path false) is not computed: callers check. From
// kQ8TileMinRows rows on, AMX int8 tiles where q8_tiles(format); pack: the worker's XPack for xq.
inline void matvec_q8(const QWeight& w, const Q8Rows& xq, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1,
                      XPack* pack = nullptr) {
  gguf::with_format(w.format, [&](auto block) {
    using B = decltype(block);
#if defined(VOXLANE_AMX_INT8)
    if constexpr (amx::TileQ8<B>::ok)
      if (M >= kQ8TileMinRows && amx_runs()) return amx::q8_weights<B>(w, xq, M, y, ldy, n0, n1, pack);
#endif
    (void)pack;
    if constexpr (is_q8_block<B>()) {
      for (int64_t m = 0; m < M; m += 8)
        matvec_q8_format<B>(w, xq.at_row(m), M - m < 8 ? M - m : 8, y + m * ldy, ldy, n0, n1);
    }
  });
}

}  // namespace voxlane
