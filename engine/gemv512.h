// Batch-1 matrix-vector products with 512-bit vectors (AVX-512F), fp32 activations and accumulation,
// for the formats a decode step of SmolLM2 reads: Q4_0, Q4_1 and Q8_0 blocks (the GGUF's) and our
// per-channel int8 (I8). quant_matmul.h's small-batch path uses them at one activation row; every
// other case (other formats, 2-8 rows, no AVX-512) keeps its AVX2 code.
//
// Why: at batch 1 that AVX2 code spends ~5 instructions per 8 weights (widen the bytes, mask or
// shift the nibbles, convert to fp32, scale by the block's d and add its min, multiply into x),
// plus the block's two fp16 scales converted and broadcast per block and row, and that, not the
// memory, set the pace of a SmolLM2 Q4_1 step (profile in docs/engine.md). Here, per 16 weights:
//   - a nibble becomes its fp32 value by a permute of a 16-entry table (vpermps reads the low 4 bits
//     of each lane: no mask, no conversion); Q8_0's bytes are widened and converted;
//   - the block's scale is applied once per block to the 32-weight partial sum:
//     dot(w, x) = d * sum(v_i x_i) + m * sum(x_i), with v the nibble (Q4_1; llama.cpp's form) or
//     nibble - 8 (Q4_0, in the table) or the byte (Q8_0); sum(x_i) per block is computed once per call
//     and the m term is one FMA per 16 blocks;
//   - the fp16 scales of 16 blocks are converted together (one vcvtph2ps) into a small array the
//     FMAs read as broadcast memory operands (no shuffle port).
// The result is the product with the file's dequantized weights (w = d v (+ m) exactly as
// gguf_blocks.h dequantizes them) up to fp32 rounding: only the order and grouping of the sums
// differs (tests: test_decode_gemv.py against the pure-torch twins).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gguf_blocks.h"

#if defined(VOXLANE_AVX2) && defined(__AVX512F__)
#define VOXLANE_GEMV512 1
#endif

namespace voxlane::gemv512 {

// A block format's 32 weights as d * v_i (+ m): where d (and m) sit, and its values v as two
// vectors of 16 floats (weights 0-15 and 16-31 of the block). kHas false: no 512-bit path.
template <class B> struct Values {
  static constexpr bool kHas = false, kMin = false;
};

#if defined(VOXLANE_GEMV512)
// 16 bytes of nibbles -> the weights' values v at the low nibbles (weights 0-15) and high nibbles
// (16-31): v = table[nibble] for the low ones (vpermps reads bits 0-3 of each index lane, so the high
// nibble needs no mask), and for the high ones either the same (OFFSET: the table is not 0..15) or
// a conversion (nibble = v), which runs on another port than the permute.
template <bool OFFSET>
inline void nibble_values(const uint8_t* qs, __m512 table, __m512& lo, __m512& hi) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  lo = _mm512_permutexvar_ps(v, table);
  if constexpr (OFFSET) hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
  else hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
}

template <> struct Values<gguf::BlockQ4_0> {  // w = (q - 8) d
  static constexpr bool kHas = true, kMin = false;
  static constexpr int kD = 0, kQs = 2;
  static inline void get(const uint8_t* qs, __m512& lo, __m512& hi) {
    nibble_values<true>(qs, _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7), lo, hi);
  }
};

template <> struct Values<gguf::BlockQ4_1> {  // w = q d + m (m: the fp16 after d)
  static constexpr bool kHas = true, kMin = true;
  static constexpr int kD = 0, kQs = 4;
  static inline void get(const uint8_t* qs, __m512& lo, __m512& hi) {
    nibble_values<false>(qs, _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), lo, hi);
  }
};

template <> struct Values<gguf::BlockQ8_0> {  // w = q d, q signed bytes
  static constexpr bool kHas = true, kMin = false;
  static constexpr int kD = 0, kQs = 2;
  static inline void get(const uint8_t* qs, __m512& lo, __m512& hi) {
    lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))));
    hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16))));
  }
};

// Where the block scales of a group of `rows` rows sit: byte offsets (from the group's first byte)
// of each (row, block)'s fp16 d, row-major over (row, block), padded to a multiple of 16 by
// repeating the last one (gathered, never used). Rebuilt only when the matrix shape changes.
struct ScaleOffsets {
  std::vector<int32_t> at;
  int64_t rows = 0, row_bytes = 0, nblocks = 0, block_bytes = 0, d_at = -1, padded = 0;
  void build(int64_t rows_, int64_t row_bytes_, int64_t nblocks_, int64_t block_bytes_, int64_t d_at_) {
    if (rows == rows_ && row_bytes == row_bytes_ && nblocks == nblocks_ && block_bytes == block_bytes_ && d_at == d_at_)
      return;
    rows = rows_, row_bytes = row_bytes_, nblocks = nblocks_, block_bytes = block_bytes_, d_at = d_at_;
    padded = (rows * nblocks + 15) / 16 * 16;
    at.clear();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < nblocks; ++b) at.push_back(static_cast<int32_t>(r * row_bytes + b * block_bytes + d_at));
    at.resize(padded, at.back());
  }
};

// A thread's scratch for the 512-bit kernels, taken once per matvec call.
struct Scratch {
  ScaleOffsets group, single;  // R rows, 1 row
  std::vector<float> xsum, scales;  // sum of x per block; d then m of a group's (row, block)s
};

inline Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// sums[r] = dot(x, weight row r) for R consecutive rows of 32-weight blocks at w (row stride
// row_bytes, nblocks blocks); xsum[b] = sum of x's block b (read only by formats with a min).
// The group's scales first: one gather per 16 (row, block) pairs takes the 4 bytes at each d (Q4_1:
// d and m), converted 16 at a time into d[] (and m[]); per block and row then 7 instructions: widen
// the bytes, two conversions (a nibble table or int -> float), the two halves' products and the
// scale's FMA with d as a broadcast memory operand.
// `offsets` for these R rows; `scales` room for 2 x offsets.padded floats.
template <class B, int R>
inline void dot_rows(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const float* x, const float* xsum,
                     const ScaleOffsets& offsets, float* scales, float* sums) {
  using V = Values<B>;
  static_assert(B::QK == 32, "32-weight blocks");
  const int64_t padded = offsets.padded;
  float *d = scales, *m = scales + padded;
  for (int64_t e = 0; e < padded; e += 16) {
    const __m512i dm = _mm512_i32gather_epi32(_mm512_loadu_si512(offsets.at.data() + e), w, 1);
    _mm512_storeu_ps(d + e, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
    if constexpr (V::kMin) _mm512_storeu_ps(m + e, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16))));
  }
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  if constexpr (V::kMin) {  // m * sum(x) per block, 16 blocks at a time
    for (int r = 0; r < R; ++r)
      for (int64_t b = 0; b < nblocks; b += 16) {
        const __mmask16 k = nblocks - b >= 16 ? 0xffff : static_cast<__mmask16>((1u << (nblocks - b)) - 1);
        acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, m + r * nblocks + b), _mm512_maskz_loadu_ps(k, xsum + b), acc[r]);
      }
  }
  const int64_t ahead = prefetch_distance(R * row_bytes);
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* xb = x + b * 32;
    const __m512 xl = _mm512_loadu_ps(xb), xh = _mm512_loadu_ps(xb + 16);
    const uint8_t* block = w + b * B::BYTES;
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = block + r * row_bytes;
      if (((b * B::BYTES) & 63) < B::BYTES || b == 0) _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
      __m512 lo, hi;
      V::get(p + V::kQs, lo, hi);
      const __m512 t = _mm512_fmadd_ps(hi, xh, _mm512_mul_ps(lo, xl));
      acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(d[r * nblocks + b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) sums[r] = _mm512_reduce_add_ps(acc[r]);
}

// Our per-channel int8 (16-byte blocks, no block scale: the row scale is applied by the caller).
template <int R>
inline void dot_rows_i8(const uint8_t* w, int64_t row_bytes, int64_t K, const float* x, float* sums) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t ahead = prefetch_distance(R * row_bytes);
  for (int64_t k = 0; k < K; k += 16) {  // K is a multiple of 16 (BlockI8::QK)
    const __m512 xv = _mm512_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + r * row_bytes + k;
      if ((k & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
      const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
      acc[r] = _mm512_fmadd_ps(wv, xv, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) sums[r] = _mm512_reduce_add_ps(acc[r]);
}
#endif

// Whether format B has a 512-bit batch-1 path in this build.
template <class B> constexpr bool has() {
#if defined(VOXLANE_GEMV512)
  return Values<B>::kHas || std::is_same_v<B, gguf::BlockI8>;
#else
  return false;
#endif
}

}  // namespace voxlane::gemv512
