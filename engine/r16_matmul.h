// Int16 activations through VNNI, on weights in a 16-row interleaved layout ("R16"):
// EngineConfig.int16_activations, the one-call step's decoding batches (1-8 rows; decode_step.cpp).
//
// Why: at batch 1 the fp32-activation GEMV (gemv512.h) spends ~7 instructions per 32 weights and a
// SmolLM2 step is instruction-bound (one core streams its 96 MB at ~24 GB/s, the kernel at about half).
// llama.cpp's int8 activations (q8_matmul.h) take ~1-2 but fail our quality report on SmolLM2 (top-1
// 0.933-0.943); bf16-rounded activations pass (1.000). Int16 activations are finer than bf16 and still
// run in vpdpbusd (u8 x s8 -> int32, 64 products per instruction), in two parts:
//
// ACTIVATIONS. Per block of 32 values of a row: s = amax / 16256, Q = round(x * (1 / s)) (fp32, ties
// to even) in [-16256, 16256], split Q = 128 q1 + q2 with q1 = (Q + 64) >> 7 in [-127, 127] and
// q2 = Q - 128 q1 in [-64, 63], both int8. x^ = s Q is within s / 2 = amax / 32512 of x (bf16 rounds to
// 2^-9 of the value). Kept per block: s, sx = s * sum(Q) (the block's sum of x^, for Q4_1's min) and
// sumq = sum(Q) (Q8_0's offset). For weight bytes u: sum_k u_k Q_k = 128 dpbusd(u, q1) + dpbusd(u, q2),
// two int32 accumulators combined per block by a shift and an add (|sum| <= 32 * 255 * 16256 < 2^31).
//
// WEIGHTS (R16): the file's blocks rewritten in place at load (engine/native_weights.py's pack_r16;
// a group of 16 rows takes the same bytes in both layouts), so one copy is streamed; where the file's
// blocks are needed (prompt chunks, the embedding lookup) a task unpacks its rows (unpack_rows). Rows
// in groups of 16; a group's bytes are its lines (64 bytes each, block by block) then its scales:
//   Q4_1  block b: 4 lines, line j = for row r = 0..15 the 4 bytes qs[4j..4j+3] of row r's block
//         (low nibbles: weights 4j..4j+3, high nibbles: weights 16+4j..16+4j+3); scales: d[16] then
//         m[16] fp16 (64 bytes). w = d u + m.
//   Q4_0  as Q4_1 with d[16] only (32 bytes); w = d (u - 8).
//   Q8_0  block b: 8 lines, line j = for each row r the bytes of weights 4j..4j+3 stored as
//         u = q + 128 (q xor 0x80); scales: d[16] fp16 (32 bytes). w = d (u - 128).
// Lanes are rows: vpdpbusd(acc, line, broadcast of 4 bytes of q1) is 16 rows x 4 weights, and a block's
// 16 scales are one vcvtph2ps: no horizontal sums, no per-row scale shuffles. Per block of 16 rows:
// dot = d s (128 A1 + A2) (+ m sx for Q4_1), with the offsets (-8 sumq, -128 sumq) as the A2
// accumulator's starting value. ~2.2 instructions per 32 weights per row at one activation row; with
// 2-8 rows a block's 8 weight vectors are unpacked once and kept in registers, and each row takes its
// q1 products, a shift by 7 and its q2 products into one accumulator (kOneChainRows). Q8_0's lines are, over a whole row
// group, AMX's VNNI B-tile rows (16 columns x 4 consecutive K bytes, unsigned: TDPBSUD); Q4's lines hold
// the nibble pairs (k, k + 16) of 4 consecutive k instead.
//
// PROMPT ROWS in AMX tiles (r16_tiles.h; the one-call step's inputs of 9+ rows where AMX runs) are
// quantized to 12-bit blocks instead (I16Rows::bits = 12): s = amax / 2047, Q in [-2047, 2047], Q = 16 q1
// + q2 with q1 = Q >> 4 and q2 = Q & 15, the block's 32 q1 bytes and 32 q2 bytes side by side (one K = 64
// tile product per block for Q4). x^ is then within s / 2 = amax / 4094 of x.
//
// The result is dequantize(W) . x^ up to fp32 rounding (the tests' twin). Needs AVX-512 F/BW/VNNI and
// F16C at compile time (-march=native, so this CPU's); elsewhere a scalar version of the same integer
// sums runs (correct, slow).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf_blocks.h"

#if defined(VOXLANE_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define VOXLANE_R16_VNNI 1
#endif

namespace voxlane::r16 {

constexpr int64_t kRows = 16;   // weight rows per group (the vector's int32 lanes)
constexpr int64_t kBlock = 32;  // activation values per int16 block
constexpr int kQMax = 16256;    // 128 * 127: |Q| <= kQMax (int16 blocks)
constexpr int kQMax12 = 2047;   // 12-bit blocks (prompt rows in AMX tiles, r16_tiles.h): |Q| <= kQMax12

// Rows of activations as int16 blocks: q1, q2 [rows, K] int8; s, sx [rows, K / 32] fp32; sumq
// [rows, K / 32] int32 (row-major). Or, with bits == 12 (the AMX tiles' prompt rows, r16_tiles.h), as
// 12-bit blocks: s = amax / 2047, Q = round(x / s) in [-2047, 2047], split Q = 16 q1 + q2 with q1 = Q >> 4
// in [-128, 127] and q2 = Q & 15 in [0, 15]; q1 then holds rows of 2K bytes, block b of a row at 64 b: its
// 32 q1 bytes, then its 32 q2 bytes (q2 = q1 + 32, so each is read with a row stride of pitch12(K) >= 2K),
// which is a tile row of one K = 64 product (A = [q1 | q2], B = [16 u | u]: sum Q u at once).
struct I16Rows {
  int8_t *q1 = nullptr, *q2 = nullptr;
  float *s = nullptr, *sx = nullptr;
  int32_t* sumq = nullptr;
  int64_t K = 0;
  int bits = 16;
  int64_t pitch = 0;  // bits 12: bytes from a row's blocks to the next row's (rows_over: pitch12(K))
  int64_t blocks() const { return K / kBlock; }
  int64_t stride() const { return bits == 12 ? pitch : K; }  // bytes from a row's q1 (q2) to the next row's
  // Byte offset in a row of q1 (and q2) of the block that starts at value c (a multiple of 32).
  int64_t at(int64_t c) const { return bits == 12 ? 2 * c : c; }
  I16Rows at_row(int64_t m) const {
    return {q1 + m * stride(), q2 + m * stride(), s + m * blocks(), sx + m * blocks(), sumq + m * blocks(), K, bits,
            pitch};
  }
};

// The row pitch of 12-bit rows of width K: their 2K bytes, plus one 64-byte line where 2K / 64 lines share
// a factor of 8 or more with the L1's 64 sets, so that the 16 rows of an AMX tile load (one block of each,
// one line a row) fall in 16 different sets. Why: at 2K = 3072 bytes (SmolLM2's down, K = 1536: 48 lines)
// the 16 rows of a block sat in 4 sets, 4 lines each, next to the split weights' lines: a same-process
// harness (down by 43 rows, 1 thread, in cache, alternating) took 0.94-0.95x the time at a pitch of 3136
// (49 lines) as at 3072, with spans of 24 or 12 blocks (docs/engine.md, fifteenth session). 2K = 1152
// (K = 576: 18 lines, 16 sets) and Qwen's 1792 (28 lines, 16 sets) stay unpadded.
inline int64_t pitch12(int64_t K) {
  const int64_t lines = 2 * K / 64;
  return lines % 8 == 0 ? 2 * K + 64 : 2 * K;
}

// Bytes of `rows` rows of width K (I16Rows with `bits`) in rows_over's layout.
inline int64_t rows_bytes(int64_t rows, int64_t K, int bits) { return bits == 12 ? rows * pitch12(K) : 2 * rows * K; }

// `rows` rows of width K over one byte buffer q (rows_bytes: 2 rows x K bytes each, the rows' q1, then
// their q2 for bits 16; for bits 12 each row's blocks as [q1 | q2], 64 bytes a block, a row every
// pitch12(K) bytes) and one fp32 buffer sc (3 x rows x K / 32: s, sx, then sumq as int32): the layout of the
// one-call step's and the ops' quantized inputs.
inline I16Rows rows_over(int8_t* q, float* sc, int64_t rows, int64_t K, int bits) {
  const int64_t values = rows * K, nb = values / kBlock;
  return {q, bits == 12 ? q + kBlock : q + values, sc, sc + nb, reinterpret_cast<int32_t*>(sc + 2 * nb), K, bits,
          bits == 12 ? pitch12(K) : 0};
}

// The split of Q: q1 = (Q + kRound) >> kShift (an arithmetic shift: floor), q2 = Q - (q1 << kShift), so
// Q = (1 << kShift) q1 + q2 (bits 16: 128, q2 in [-64, 63]; bits 12: 16, q2 in [0, 15]).
template <int Bits> struct Split;
template <> struct Split<16> { static constexpr int kShift = 7, kRound = 64, kQMax = r16::kQMax; };
template <> struct Split<12> { static constexpr int kShift = 4, kRound = 0, kQMax = kQMax12; };

#if defined(VOXLANE_R16_VNNI)
// 16 values v -> Q = round(v * inv) (the MXCSR's rounding: to nearest, ties to even) in [-kQMax, kQMax],
// stored as q1 = (Q + 64) >> 7 at q1 and q2 = Q - 128 q1 at q2 -> Q; Bits 12: in [-kQMax12, kQMax12],
// q1 = Q >> 4 and q2 = Q & 15.
template <int Bits = 16>
inline __m512i quantize16(__m512 v, __m512 inv, int8_t* q1, int8_t* q2) {
  constexpr int kMax = Split<Bits>::kQMax;
  __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
  q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(kMax)), _mm512_set1_epi32(-kMax));
  using S = Split<Bits>;
  const __m512i hi = _mm512_srai_epi32(_mm512_add_epi32(q, _mm512_set1_epi32(S::kRound)), S::kShift);
  const __m512i lo = _mm512_sub_epi32(q, _mm512_slli_epi32(hi, S::kShift));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q1), _mm512_cvtepi32_epi8(hi));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q2), _mm512_cvtepi32_epi8(lo));
  return q;
}

// Lane i of the result = op over the 16 lanes of v[i]: the 16 reductions at once, transposing (4 levels
// of two shuffles and an op; a horizontal reduction of one vector is 4 dependent levels of its own).
template <class Op>
inline __m512 reduce_lanes16(const __m512 (&v)[16], Op op) {
  __m512 t[8], u[4], w[2];
  for (int j = 0; j < 8; ++j)  // quarters 0-1: v[2j]'s 8 partial lanes, 2-3: v[2j + 1]'s
    t[j] = op(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44), _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
  for (int j = 0; j < 4; ++j)  // quarter q: v[4j + q]'s 4
    u[j] = op(_mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0x88), _mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0xDD));
  for (int j = 0; j < 2; ++j)  // quarter q: lanes 0-1 v[8j + q]'s 2, lanes 2-3 v[8j + 4 + q]'s
    w[j] = op(_mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0x44), _mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0xEE));
  const __m512 r = op(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));  // lane 4q + k: v[4k + q]
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

// Blocks from which quantize_blocks takes 16 at a time (fewer: one block at a time). Why 6 (same-process
// micro-benchmark, 1 thread, load ~3.9): 4 blocks of a row 0.98x the block-by-block time, 5 0.93x, 6
// 0.85x; a column of 4 rows 1.02x, 5 1.07x, 6 0.95x, 8 0.85x, 43 0.73x.
constexpr int kQuantizeTogether = 6;

// n <= 16 blocks of 32 values, block i at x + i * ldx, into row i * row_step of xi at value c0 + i * c_step:
// quantize's outputs for each (the same fp32 divisions, products and roundings per block; max and integer
// sums in another order, exact), the blocks' maxima and sums reduced together (reduce_lanes16). Bits: xi.bits.
template <int Bits>
inline void quantize_blocks_as(const float* x, int64_t ldx, int n, const I16Rows& xi, int64_t row_step, int64_t c0,
                               int64_t c_step) {
  const int64_t nb = xi.blocks();
  __m512 a[16];
  for (int i = 0; i < 16; ++i)
    a[i] = i < n ? _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i * ldx)), _mm512_abs_ps(_mm512_loadu_ps(x + i * ldx + 16)))
                 : _mm512_setzero_ps();
  const __m512 scale = _mm512_div_ps(reduce_lanes16(a, [](__m512 p, __m512 q) { return _mm512_max_ps(p, q); }),
                                     _mm512_set1_ps(static_cast<float>(Split<Bits>::kQMax)));
  const __mmask16 nonzero = _mm512_cmp_ps_mask(scale, _mm512_setzero_ps(), _CMP_NEQ_OQ);
  alignas(64) float inverse[16];
  _mm512_store_ps(inverse, _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.f), scale));
  __m512 sums[16];
  for (int i = 0; i < 16; ++i) {
    if (i >= n) {
      sums[i] = _mm512_setzero_ps();
      continue;
    }
    const __m512 inv = _mm512_set1_ps(inverse[i]);
    const int64_t at = i * row_step * xi.stride() + xi.at(c0 + i * c_step);
    const __m512i q0 = quantize16<Bits>(_mm512_loadu_ps(x + i * ldx), inv, xi.q1 + at, xi.q2 + at);
    const __m512i q1 = quantize16<Bits>(_mm512_loadu_ps(x + i * ldx + 16), inv, xi.q1 + at + 16, xi.q2 + at + 16);
    sums[i] = _mm512_castsi512_ps(_mm512_add_epi32(q0, q1));
  }
  const __m512i sum = _mm512_castps_si512(reduce_lanes16(sums, [](__m512 p, __m512 q) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), _mm512_castps_si512(q)));
  }));
  alignas(64) float s[16], sx[16];
  alignas(64) int32_t sq[16];
  _mm512_store_ps(s, scale);
  _mm512_store_ps(sx, _mm512_mul_ps(scale, _mm512_cvtepi32_ps(sum)));
  _mm512_store_si512(sq, sum);
  for (int i = 0; i < n; ++i) {
    const int64_t blk = i * row_step * nb + (c0 + i * c_step) / kBlock;
    xi.s[blk] = s[i];
    xi.sx[blk] = sx[i];
    xi.sumq[blk] = sq[i];
  }
}

inline void quantize_blocks(const float* x, int64_t ldx, int n, const I16Rows& xi, int64_t row_step, int64_t c0,
                            int64_t c_step) {
  if (xi.bits == 12) quantize_blocks_as<12>(x, ldx, n, xi, row_step, c0, c_step);
  else quantize_blocks_as<16>(x, ldx, n, xi, row_step, c0, c_step);
}
#endif

// One block of 32 values xb -> the block of `row` that starts at value c (a multiple of 32), as Bits-bit
// blocks (row.bits).
template <int Bits>
inline void quantize_block(const float* xb, const I16Rows& row, int64_t c) {
  using S = Split<Bits>;
  const int64_t blk = c / kBlock, at = row.at(c);
  int sum = 0;
  float scale;
#if defined(VOXLANE_R16_VNNI)
  const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  scale = amax / static_cast<float>(S::kQMax);
  const float inverse = scale != 0.f ? 1.f / scale : 0.f;
  const __m512 inv = _mm512_set1_ps(inverse);
  const __m512i q0 = quantize16<Bits>(v0, inv, row.q1 + at, row.q2 + at);
  const __m512i q1 = quantize16<Bits>(v1, inv, row.q1 + at + 16, row.q2 + at + 16);
  sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#else
  float amax = 0.f;
  for (int k = 0; k < kBlock; ++k) amax = std::fmax(amax, std::fabs(xb[k]));
  scale = amax / static_cast<float>(S::kQMax);
  const float inverse = scale != 0.f ? 1.f / scale : 0.f;
  for (int k = 0; k < kBlock; ++k) {
    int Q = static_cast<int>(std::nearbyint(xb[k] * inverse));
    Q = Q > S::kQMax ? S::kQMax : (Q < -S::kQMax ? -S::kQMax : Q);
    const int hi = (Q + S::kRound) >> S::kShift;  // arithmetic shift: floor
    row.q1[at + k] = static_cast<int8_t>(hi);
    row.q2[at + k] = static_cast<int8_t>(Q - (1 << S::kShift) * hi);
    sum += Q;
  }
#endif
  row.s[blk] = scale;
  row.sx[blk] = scale * static_cast<float>(sum);
  row.sumq[blk] = sum;
}

// x[0, n) (n a multiple of 32) -> blocks 0.. of `row` starting at value c0 (a multiple of 32); where the
// VNNI kernel is built, 16 blocks at a time (quantize_blocks) while at least kQuantizeTogether are left.
inline void quantize(const float* x, int64_t n, const I16Rows& row, int64_t c0) {
  int64_t first = 0;
#if defined(VOXLANE_R16_VNNI)
  for (; first + kQuantizeTogether <= n / kBlock; first += 16)
    quantize_blocks(x + kBlock * first, kBlock, static_cast<int>(std::min<int64_t>(16, n / kBlock - first)), row, 0,
                    c0 + kBlock * first, kBlock);
#endif
  for (int64_t b = first; b < n / kBlock; ++b) {
    if (row.bits == 12) quantize_block<12>(x + kBlock * b, row, c0 + kBlock * b);
    else quantize_block<16>(x + kBlock * b, row, c0 + kBlock * b);
  }
}


// The blocks of 32 values at column c0 (a multiple of 32) of rows [0, M) of x (row stride ldx) -> column c0
// of rows 0.. of xi: 16 rows at a time where the VNNI kernel is built.
inline void quantize_column(const float* x, int64_t M, int64_t ldx, const I16Rows& xi, int64_t c0) {
  int64_t m = 0;
#if defined(VOXLANE_R16_VNNI)
  for (; m + kQuantizeTogether <= M; m += 16)
    quantize_blocks(x + m * ldx, ldx, static_cast<int>(std::min<int64_t>(16, M - m)), xi.at_row(m), 1, c0, 0);
#endif
  for (; m < M; ++m) quantize(x + m * ldx, kBlock, xi.at_row(m), c0);
}

// M rows of x (row stride ldx) -> rows of xi (whole rows).
inline void quantize_rows(const float* x, int64_t M, int64_t ldx, const I16Rows& xi) {
  for (int64_t m = 0; m < M; ++m) quantize(x + m * ldx, xi.K, xi.at_row(m), 0);
}

// A format's R16 geometry: lines of 64 bytes per block, scale bytes per block, the offset (w = d (u -
// kOffset)) and whether it has a min m (w = d u + m).
template <class B> struct Layout { static constexpr bool kHas = false; };
template <> struct Layout<gguf::BlockQ4_1> {
  static constexpr bool kHas = true, kMin = true, kNibbles = true;
  static constexpr int kLines = 4, kScaleBytes = 64, kOffset = 0, kQs = 4;
};
template <> struct Layout<gguf::BlockQ4_0> {
  static constexpr bool kHas = true, kMin = false, kNibbles = true;
  static constexpr int kLines = 4, kScaleBytes = 32, kOffset = 8, kQs = 2;
};
template <> struct Layout<gguf::BlockQ8_0> {
  static constexpr bool kHas = true, kMin = false, kNibbles = false;
  static constexpr int kLines = 8, kScaleBytes = 32, kOffset = 128, kQs = 2;
};

template <class B> constexpr bool has_layout() { return Layout<B>::kHas; }

inline bool has_layout(int64_t format) {
  bool ok = false;
  gguf::with_format(format, [&](auto block) { ok = has_layout<decltype(block)>(); });
  return ok;
}

// A matrix in the R16 layout (rows % 16 == 0): its geometry and bytes (not owned: the model's weight
// tensor, packed in place at load, engine/native_weights.py's pack_r16).
struct Weight {
  int64_t format = -1, rows = 0, cols = 0, row_bytes = 0, nblocks = 0, group_bytes = 0, lines_bytes = 0;
  const uint8_t* data = nullptr;
  const uint8_t* group(int64_t g) const { return data + g * group_bytes; }
};

// The view of `data` (rows x row_bytes bytes, R16) as a Weight; format has_layout, rows % 16 == 0.
inline Weight view(int64_t format, const uint8_t* data, int64_t rows, int64_t cols, int64_t row_bytes) {
  Weight w;
  gguf::with_format(format, [&](auto block) {
    using B = decltype(block);
    if constexpr (has_layout<B>()) {
      using Lay = Layout<B>;
      w.nblocks = cols / B::QK;
      w.lines_bytes = w.nblocks * Lay::kLines * 64;
      w.group_bytes = w.lines_bytes + w.nblocks * Lay::kScaleBytes;  // == 16 * row_bytes
    }
  });
  w.format = format, w.rows = rows, w.cols = cols, w.row_bytes = row_bytes, w.data = data;
  return w;
}

// Moves the bytes of weight row r, block b between the file's block at `file` and the R16 group at
// `group` (PACK: file -> R16, else back).
template <class B, bool PACK>
inline void move_block(uint8_t* file, uint8_t* group, const Weight& w, int64_t r, int64_t b) {
  using Lay = Layout<B>;
  uint8_t* sc = group + w.lines_bytes + b * Lay::kScaleBytes;
  auto move = [](uint8_t* to, uint8_t* from, int n) { std::memcpy(PACK ? to : from, PACK ? from : to, n); };
  for (int j = 0; j < Lay::kLines; ++j) {
    uint8_t* line = group + (b * Lay::kLines + j) * 64 + 4 * r;
    move(line, file + Lay::kQs + 4 * j, 4);
    if constexpr (!Lay::kNibbles)  // u = q + 128 in R16
      for (int t = 0; t < 4; ++t) (PACK ? line : file + Lay::kQs + 4 * j)[t] ^= 0x80;
  }
  move(sc + 2 * r, file, 2);                                // d
  if constexpr (Lay::kMin) move(sc + 32 + 2 * r, file + 2, 2);  // m
}

// The file's rows at src (rows x row_bytes, rows % 16 == 0) -> R16 at dst (the same size; not src).
inline void pack(int64_t format, const uint8_t* src, int64_t rows, int64_t cols, int64_t row_bytes, uint8_t* dst) {
  const Weight w = view(format, dst, rows, cols, row_bytes);
  gguf::with_format(format, [&](auto block) {
    using B = decltype(block);
    if constexpr (has_layout<B>())
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < w.nblocks; ++b)
          move_block<B, true>(const_cast<uint8_t*>(src) + r * row_bytes + b * B::BYTES,
                              dst + r / kRows * w.group_bytes, w, r % kRows, b);
  });
}

// The same in place (data: rows x row_bytes of the file's blocks, then of R16): a group of 16 rows takes
// the same bytes in both layouts, so one group's rows are copied aside at a time.
inline void pack_in_place(int64_t format, uint8_t* data, int64_t rows, int64_t cols, int64_t row_bytes) {
  std::vector<uint8_t> group(kRows * row_bytes);
  for (int64_t g = 0; g < rows / kRows; ++g) {
    uint8_t* at = data + g * kRows * row_bytes;
    std::memcpy(group.data(), at, group.size());
    pack(format, group.data(), kRows, cols, row_bytes, at);
  }
}

#if defined(VOXLANE_R16_VNNI)
// One whole group's block b back to the file's blocks of its 16 rows (out: row 0's block; rows
// row_bytes apart): the lines are a 16 x (4 or 8) matrix of 4-byte words (row r in lane r), transposed
// 4 lines at a time by two levels of unpacks, so each 128-bit lane holds one row's 16 quant bytes.
template <class B>
inline void unpack_block_16(const uint8_t* group, const Weight& w, int64_t b, uint8_t* out) {
  using Lay = Layout<B>;
  const uint8_t* lines = group + b * Lay::kLines * 64;
  for (int half = 0; half < Lay::kLines / 4; ++half) {
    __m512i l[4];
    for (int j = 0; j < 4; ++j) {
      l[j] = _mm512_loadu_si512(lines + (4 * half + j) * 64);
      if constexpr (!Lay::kNibbles) l[j] = _mm512_xor_si512(l[j], _mm512_set1_epi8(static_cast<char>(0x80)));
    }
    const __m512i t0 = _mm512_unpacklo_epi32(l[0], l[1]), t1 = _mm512_unpackhi_epi32(l[0], l[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(l[2], l[3]), t3 = _mm512_unpackhi_epi32(l[2], l[3]);
    // u[i]'s 128-bit lane k: row 4k + i's words of lines 4 half .. 4 half + 3
    const __m512i u[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                          _mm512_unpackhi_epi64(t1, t3)};
    uint8_t* qs = out + Lay::kQs + 16 * half;
    for (int i = 0; i < 4; ++i) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + (i) * w.row_bytes), _mm512_extracti32x4_epi32(u[i], 0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + (4 + i) * w.row_bytes), _mm512_extracti32x4_epi32(u[i], 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + (8 + i) * w.row_bytes), _mm512_extracti32x4_epi32(u[i], 2));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + (12 + i) * w.row_bytes), _mm512_extracti32x4_epi32(u[i], 3));
    }
  }
  const uint8_t* sc = group + w.lines_bytes + b * Lay::kScaleBytes;
  for (int r = 0; r < kRows; ++r) {
    std::memcpy(out + r * w.row_bytes, sc + 2 * r, 2);
    if constexpr (Lay::kMin) std::memcpy(out + r * w.row_bytes + 2, sc + 32 + 2 * r, 2);
  }
}
#endif

// Rows [r0, r1) of an R16 matrix back to the file's blocks at out ((r1 - r0) x row_bytes): the one
// place where R16 is read as the file's blocks (the prompt path, other activations, the embedding).
inline void unpack_rows(const Weight& w, int64_t r0, int64_t r1, uint8_t* out) {
  gguf::with_format(w.format, [&](auto block) {
    using B = decltype(block);
    if constexpr (has_layout<B>())
      for (int64_t r = r0; r < r1;) {
#if defined(VOXLANE_R16_VNNI)
        if (r % kRows == 0 && r + kRows <= r1) {  // a whole group
          for (int64_t b = 0; b < w.nblocks; ++b)
            unpack_block_16<B>(w.group(r / kRows), w, b, out + (r - r0) * w.row_bytes + b * B::BYTES);
          r += kRows;
          continue;
        }
#endif
        for (int64_t b = 0; b < w.nblocks; ++b)
          move_block<B, false>(out + (r - r0) * w.row_bytes + b * B::BYTES,
                               const_cast<uint8_t*>(w.group(r / kRows)), w, r % kRows, b);
        ++r;
      }
  });
}

#if defined(VOXLANE_R16_VNNI)
constexpr int kOneChainRows = 2;  // activation rows from which group_dot keeps one accumulator per row

inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// out[m * ldy + r] = dot(x row m, group row r) for the 16 rows of one group and MB activation rows.
template <class B, int MB>
inline void group_dot(const uint8_t* group, const Weight& w, const I16Rows& x, float* y, int64_t ldy,
                      const uint8_t* ahead) {
  using Lay = Layout<B>;
  const int64_t K = x.K, nb = w.nblocks;
  const uint8_t* scales = group + w.lines_bytes;
  __m512 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* lines = group + b * Lay::kLines * 64;
    __m512i dot[MB];
    if constexpr (MB >= kOneChainRows) {
      // The block's 8 weight vectors (Q4: low and high nibbles of 4 lines; Q8_0: 8 lines) stay in
      // registers for two passes into one accumulator per row: the q1 products, a shift by 7, then the
      // q2 products (Q8_0's -128 sum(Q) as -sum(Q) before the shift). One instruction per row and block
      // less than two accumulators and an add; a chain twice as long, so only with MB rows' chains.
      constexpr int U = 8;
      static_assert((Lay::kNibbles ? 2 * Lay::kLines : Lay::kLines) == U, "8 weight vectors per block");
      __m512i u[U];
      for (int j = 0; j < Lay::kLines; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + (b * Lay::kLines + j) * 64), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(lines + 64 * j);
        if constexpr (Lay::kNibbles) {
          u[2 * j] = _mm512_and_si512(v, low);
          u[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        } else {
          u[j] = v;
        }
      }
      // u[k]'s activation bytes: Q4 low nibbles of line j at 4j, high at 16 + 4j; Q8_0 line k at 4k
      constexpr auto at = [](int k) { return Lay::kNibbles ? (k & 1) * 16 + 4 * (k >> 1) : 4 * k; };
      for (int m = 0; m < MB; ++m) dot[m] = _mm512_set1_epi32(Lay::kOffset == 128 ? -x.sumq[m * nb + b] : 0);
      for (int k = 0; k < U; ++k)
        for (int m = 0; m < MB; ++m) dot[m] = _mm512_dpbusd_epi32(dot[m], u[k], bcast4(x.q1 + m * K + kBlock * b + at(k)));
      for (int m = 0; m < MB; ++m) {
        dot[m] = _mm512_slli_epi32(dot[m], 7);
        if constexpr (Lay::kOffset != 0 && Lay::kOffset != 128)
          dot[m] = _mm512_add_epi32(dot[m], _mm512_set1_epi32(-Lay::kOffset * x.sumq[m * nb + b]));
      }
      for (int k = 0; k < U; ++k)
        for (int m = 0; m < MB; ++m) dot[m] = _mm512_dpbusd_epi32(dot[m], u[k], bcast4(x.q2 + m * K + kBlock * b + at(k)));
    } else {
      __m512i a1[MB], a2[MB];
      for (int m = 0; m < MB; ++m) {
        a1[m] = _mm512_setzero_si512();
        const int32_t start = Lay::kOffset ? -Lay::kOffset * x.sumq[m * nb + b] : 0;
        a2[m] = _mm512_set1_epi32(start);
      }
      for (int j = 0; j < Lay::kLines; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + (b * Lay::kLines + j) * 64), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(lines + 64 * j);
        if constexpr (Lay::kNibbles) {
          const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
          for (int m = 0; m < MB; ++m) {
            const int8_t *q1 = x.q1 + m * K + kBlock * b + 4 * j, *q2 = x.q2 + m * K + kBlock * b + 4 * j;
            a1[m] = _mm512_dpbusd_epi32(a1[m], lo, bcast4(q1));
            a2[m] = _mm512_dpbusd_epi32(a2[m], lo, bcast4(q2));
            a1[m] = _mm512_dpbusd_epi32(a1[m], hi, bcast4(q1 + 16));
            a2[m] = _mm512_dpbusd_epi32(a2[m], hi, bcast4(q2 + 16));
          }
        } else {
          for (int m = 0; m < MB; ++m) {
            const int8_t *q1 = x.q1 + m * K + kBlock * b + 4 * j, *q2 = x.q2 + m * K + kBlock * b + 4 * j;
            a1[m] = _mm512_dpbusd_epi32(a1[m], v, bcast4(q1));
            a2[m] = _mm512_dpbusd_epi32(a2[m], v, bcast4(q2));
          }
        }
      }
      for (int m = 0; m < MB; ++m) dot[m] = _mm512_add_epi32(_mm512_slli_epi32(a1[m], 7), a2[m]);
    }
    const uint8_t* sc = scales + b * Lay::kScaleBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc)));
    __m512 mn;
    if constexpr (Lay::kMin) mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + 32)));
    for (int m = 0; m < MB; ++m) {
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[m]), _mm512_mul_ps(d, _mm512_set1_ps(x.s[m * nb + b])), acc[m]);
      if constexpr (Lay::kMin) acc[m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(x.sx[m * nb + b]), acc[m]);
    }
  }
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + m * ldy, acc[m]);
}
#endif

// The same sums in scalar code (no AVX-512 VNNI): integer products per block, as the vector path.
template <class B>
inline void group_dot_scalar(const uint8_t* group, const Weight& w, const I16Rows& x, int64_t M, float* y,
                             int64_t ldy) {
  using Lay = Layout<B>;
  const int64_t K = x.K, nb = w.nblocks;
  const uint8_t* scales = group + w.lines_bytes;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t r = 0; r < kRows; ++r) {
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* lines = group + b * Lay::kLines * 64;
        const int8_t *q1 = x.q1 + m * K + kBlock * b, *q2 = x.q2 + m * K + kBlock * b;
        int32_t a1 = 0, a2 = Lay::kOffset ? -Lay::kOffset * x.sumq[m * nb + b] : 0;
        for (int j = 0; j < Lay::kLines; ++j)
          for (int t = 0; t < 4; ++t) {
            const uint8_t byte = lines[64 * j + 4 * r + t];
            if constexpr (Lay::kNibbles) {
              const int lo = byte & 0xf, hi = byte >> 4, k = 4 * j + t;
              a1 += lo * q1[k] + hi * q1[k + 16];
              a2 += lo * q2[k] + hi * q2[k + 16];
            } else {
              const int k = 4 * j + t;
              a1 += byte * q1[k];
              a2 += byte * q2[k];
            }
          }
        const uint8_t* sc = scales + b * Lay::kScaleBytes;
        const float d = gguf::half_to_float(sc + 2 * r);
        acc += static_cast<float>(a1 * 128 + a2) * (d * x.s[m * nb + b]);
        if constexpr (Lay::kMin) acc += gguf::half_to_float(sc + 32 + 2 * r) * x.sx[m * nb + b];
      }
      y[m * ldy + r] = acc;
    }
}

// y[m, n] = x^[m] . W[n] for rows n in [n0, n1) (multiples of 16) and M <= 8 rows of x; descending:
// the groups from the last one down (a step pool task from a phase's back end: the prefetch then runs
// into the rows that thread takes next).
template <class B, int MB>
inline void matvec_groups(const Weight& w, const I16Rows& x, float* y, int64_t ldy, int64_t n0, int64_t n1,
                          bool descending) {
  const int64_t g0 = n0 / kRows, g1 = n1 / kRows;
  for (int64_t i = g0; i < g1; ++i) {
    const int64_t g = descending ? g0 + g1 - 1 - i : i;
#if defined(VOXLANE_R16_VNNI)
    // the group 4 KB (at least one group) ahead, one line per line read (gguf_blocks.h)
    const int64_t ahead_groups = prefetch_distance(w.group_bytes) / w.group_bytes;
    const uint8_t* ahead = w.group(descending ? std::max<int64_t>(g - ahead_groups, 0)
                                              : std::min(g + ahead_groups, w.rows / kRows - 1));
    group_dot<B, MB>(w.group(g), w, x, y + g * kRows, ldy, ahead);
#else
    group_dot_scalar<B>(w.group(g), w, x, MB, y + g * kRows, ldy);
#endif
  }
}

template <class B>
inline void matvec_format(const Weight& w, const I16Rows& x, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1,
                          bool descending) {
  with_rows<1, 8>(M, [&](auto rows) { matvec_groups<B, decltype(rows)::value>(w, x, y, ldy, n0, n1, descending); });
}

// y[m, n] = x^[m] . W[n] (no bias) for rows n in [n0, n1) (multiples of 16) and M rows of x (groups of 8);
// x int16 blocks (bits 16: 12-bit rows are the prompt tiles', r16_tiles.h).
inline void matvec(const Weight& w, const I16Rows& x, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1,
                   bool descending = false) {
  gguf::with_format(w.format, [&](auto block) {
    using B = decltype(block);
    if constexpr (has_layout<B>())
      for (int64_t m = 0; m < M; m += 8)
        matvec_format<B>(w, x.at_row(m), M - m < 8 ? M - m : 8, y + m * ldy, ldy, n0, n1, descending);
  });
}

// The first prefetch_distance() bytes of rows [n0, n1) (multiples of 16) in the order matvec reads
// them (descending: of the last group's), one line per 64 bytes: a task's start, fetched while its
// thread waits for the phase before.
inline void prefetch_rows(const Weight& w, int64_t n0, int64_t n1, bool descending) {
  const int64_t bytes = std::min((n1 - n0) / kRows * w.group_bytes, prefetch_distance(w.group_bytes));
  const uint8_t* at = descending ? w.group(n1 / kRows) - bytes : w.group(n0 / kRows);  // whole groups
#if defined(VOXLANE_R16_VNNI)
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(at + i), _MM_HINT_T0);
#else
  (void)at;
#endif
}

}  // namespace voxlane::r16
