// The prompt path's matrix product: y[m, n] = x[m, :] . W[n, :] for many activation rows at once
// (a prefill chunk: tens to hundreds of rows), fp32 activations and accumulation, weights in any
// format of gguf_blocks.h. The result is the exact product with the file's dequantized weights (only
// the summation order differs), like quant_matmul.h's small-batch path; with AMX (our int8 weights
// only, below) the activations are carried to 2^-18 of themselves instead of fp32's 2^-24.
//
// Why a second path: quant_matmul.h is built for 1-8 rows, where reading the weights is the cost:
// each block is expanded to fp32 in registers and multiplied into at most 8 rows, so a chunk of 43
// rows expands every weight 6 times and runs 256-bit FMAs whose other operand is a load (1 weight
// row x 8 activation rows). Here a task's weight rows are expanded once per panel of 16 into an fp32
// buffer (thread local, 36-96 KB: L2), then a register tile of 4 weight rows x 6 activation rows
// (24 accumulators of 16 lanes) runs over K with 512-bit FMAs: per 16 k, 10 loads for 24 FMAs, so
// the FMA units, not the loads, set the pace. The 4 x 6 sums are reduced 4 at a time (one
// vector of the 4 weight rows' sums per activation row). AVX-512F + DQ only; elsewhere matvec keeps
// the small-batch path for every M.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gguf_blocks.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(VOXLANE_AVX2)
#define VOXLANE_GEMM 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#define VOXLANE_AMX 1
#if defined(__AMX_INT8__) && defined(__AVX512VNNI__)
#define VOXLANE_AMX_INT8 1  // int8 tiles for the int8-activation prompt path (q8_matmul.h)
#endif
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace voxlane {

// Activation rows above which matvec uses the GEMM (at <= 8 rows the weights are read once anyway).
constexpr int64_t kGemmMinRows = 9;
// Rows from which bf16 activations (EngineConfig.bf16_activations) take the AMX tiles: below, expanding
// each weight into its two bf16 parts costs more than the fp32 products it saves (one Q4_1 linear,
// 1 thread, load ~3: gate/up 3,072 x 576 at 8 rows 0.51 ms in tiles against 0.36 (FMA GEMM) and 0.46
// (small-batch path); at 16 rows 0.63 vs 0.58, 24 rows 0.79 vs 0.79, 43 rows 1.17 vs 1.34; down
// 576 x 1,536 at 16 rows 0.25 vs 0.35, 43 rows 0.41 vs 0.78).
constexpr int64_t kBf16MinRows = 16;

// Whether the GEMM may use AMX where the machine has it (tests and A/Bs turn it off to run the
// 512-bit FMA path on the same machine; torch.ops.voxlane.set_prefill_amx).
inline std::atomic<bool>& amx_allowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

// bf16 (the top 16 bits of a float) for AMX's tiles.
inline uint16_t bf16_bits(float v) {  // round to nearest even (finite values)
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_value(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// Activation rows as AMX B tiles: per block of 16 rows, [Kp / 2][16 rows][2] bf16 (zeros past M
// and K). parts 2: hi and lo (x to 2^-18 of itself, for our int8 weights); parts 1: hi only, x
// rounded to bf16 (the bf16-activation path of the GGUF formats), with bsum, each row's sum of its
// rounded values over each block of 32 (a Q4_1 min's factor). `tag` names the matrix input it holds
// (the one-call step's phase), so the tasks of a phase that a worker runs pack it once.
struct XPack {
  std::vector<uint16_t> hi, lo;
  std::vector<float> bsum;  // parts 1: [Kp / 32][blocks() * 16]
  int64_t M = 0, K = 0, Kp = 0, tag = -1;
  int parts = 0;
  bool ready = false;
  // Int8 activations (q8_matmul.h's Q8 blocks) as AMX int8 B tiles, packed by q8_matmul.h's pack_q8_tiles:
  // per block of 16 rows and 32 k, [8][16 rows][4] bytes; d and s (the blocks' scales and d * sum(q))
  // as [row blocks][K / 32][16] floats. Zeros past M.
  std::vector<int8_t> q8;
  std::vector<float> q8d, q8s;
  bool q8_ready = false;
  int64_t blocks() const { return (M + 15) / 16; }

  // A new input (the next phase's): nothing packed yet.
  void invalidate() { ready = q8_ready = false; }
  const uint16_t* hi_tile(int64_t mb, int64_t kb) const { return hi.data() + (mb * (Kp / 2) + kb * 16) * 32; }
  const uint16_t* lo_tile(int64_t mb, int64_t kb) const { return lo.data() + (mb * (Kp / 2) + kb * 16) * 32; }
  const float* bsum_row(int64_t kb) const { return bsum.data() + kb * blocks() * 16; }

  // Packed from x (M rows of K) in `n_parts` parts, unless a worker's pack already holds them.
  void ensure(const float* x, int64_t rows, int64_t ldx, int64_t cols, int n_parts) {
    if (!ready || parts != n_parts) pack(x, rows, ldx, cols, n_parts);
  }

  void pack(const float* x, int64_t rows, int64_t ldx, int64_t cols, int n_parts = 2) {
    M = rows;
    K = cols;
    Kp = (cols + 31) / 32 * 32;
    parts = n_parts;
    const size_t n = static_cast<size_t>(blocks() * 16 * Kp);
    hi.assign(n, 0);
    if (parts == 2) lo.assign(n, 0);
    const int64_t Mp = blocks() * 16;
    if (parts == 1) bsum.assign(static_cast<size_t>(Kp / 32 * Mp), 0.f);
#if defined(VOXLANE_AMX)
    // Per row and block of 32: hi = bf16 of the 32 values, lo = bf16 of what hi misses; their 16
    // (k, k + 1) pairs scattered to the pairs' tile rows (stride 16 pairs).
    const __m512i pair_rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                 _mm512_set1_epi32(16));
    const __m512i round = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), top = _mm512_set1_epi32(~0xffff);
    auto hi_of = [&](__m512 v) {  // bf16(v) back as a float (round to nearest even, as vcvtne2ps2bf16)
      const __m512i u = _mm512_castps_si512(v);
      const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, round), _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
      return _mm512_castsi512_ps(_mm512_and_si512(r, top));
    };
    for (int64_t m = 0; m < M; ++m) {
      const float* row = x + m * ldx;
      for (int64_t k = 0; k < K; k += 32) {
        const int64_t left = K - k;
        const __mmask16 m0 = left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
        const __mmask16 m1 = left >= 32 ? 0xffff : left <= 16 ? 0 : static_cast<__mmask16>((1u << (left - 16)) - 1);
        const __m512 v0 = _mm512_maskz_loadu_ps(m0, row + k), v1 = _mm512_maskz_loadu_ps(m1, row + k + 16);
        const __m512 h0 = hi_of(v0), h1 = hi_of(v1);
        const int64_t at = ((m / 16) * (Kp / 2) + (k / 2)) * 16 + (m % 16);  // in pairs
        _mm512_i32scatter_epi32(reinterpret_cast<int*>(hi.data()) + at, pair_rows, (__m512i)_mm512_cvtne2ps_pbh(v1, v0), 4);
        if (parts == 2) {
          const __m512 l0 = _mm512_sub_ps(v0, h0), l1 = _mm512_sub_ps(v1, h1);
          _mm512_i32scatter_epi32(reinterpret_cast<int*>(lo.data()) + at, pair_rows, (__m512i)_mm512_cvtne2ps_pbh(l1, l0), 4);
        } else {
          bsum[(k / 32) * Mp + m] = _mm512_reduce_add_ps(_mm512_add_ps(h0, h1));
        }
      }
    }
#else
    for (int64_t m = 0; m < M; ++m) {
      const float* row = x + m * ldx;
      const int64_t base = (m / 16) * 16 * Kp + (m % 16) * 2;
      for (int64_t k = 0; k < K; ++k) {
        const uint16_t b = bf16_bits(row[k]);
        const int64_t at = base + (k / 2) * 32 + (k & 1);
        hi[at] = b;
        if (parts == 2) lo[at] = bf16_bits(row[k] - bf16_value(b));
        else bsum[(k / 32) * Mp + m] += bf16_value(b);
      }
    }
#endif
    ready = true;
  }
};

#if defined(VOXLANE_GEMM)
namespace gemm {

// The next panel's weight bytes into L2 while this one is multiplied: at a short chunk (~40 rows) a
// panel's products take less time than reading its bytes from memory, and nothing else asks for them
// before the next panel's expansion does.
inline void prefetch_panel(const uint8_t* data, int64_t row_bytes, int64_t p0, int64_t p1) {
  const char* begin = reinterpret_cast<const char*>(data + p0 * row_bytes);
  for (int64_t offset = 0; offset < (p1 - p0) * row_bytes; offset += 64) _mm_prefetch(begin + offset, _MM_HINT_T1);
}

constexpr int kR = 4, kM = 6;  // the register tile: weight rows x activation rows
constexpr int64_t kPanel = 16;   // weight rows expanded at a time (16 x K fp32: 36-96 KB, in L2)

// The 16 lanes of each of a, b, c, d summed: {sum a, sum b, sum c, sum d}.
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // per 128-bit lane: {a0 + a2, b0 + b2, a1 + a3, b1 + b3}
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  // per 128-bit lane: {a, b, c, d} (that lane's sums)
  const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(abcd), _mm512_extractf32x8_ps(abcd, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// r[i] row i of a 16 x 16 block of floats -> r[j] its column j.
inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: rows i, i + 1 interleaved by 32 bits
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  auto lo64 = [](__m512 a, __m512 b) { return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))); };
  auto hi64 = [](__m512 a, __m512 b) { return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))); };
  for (int g = 0; g < 4; ++g) {  // u[4 g + c]: 128-bit lane L holds column 4 L + c of rows 4 g .. 4 g + 3
    const __m512* a = t + 4 * g;
    u[4 * g + 0] = lo64(a[0], a[2]);
    u[4 * g + 1] = hi64(a[0], a[2]);
    u[4 * g + 2] = lo64(a[1], a[3]);
    u[4 * g + 3] = hi64(a[1], a[3]);
  }
  for (int c = 0; c < 4; ++c) {  // column 4 L + c = lane L of u[c], u[4 + c], u[8 + c], u[12 + c]
    const __m512 p01l = _mm512_shuffle_f32x4(u[c], u[4 + c], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 p01h = _mm512_shuffle_f32x4(u[c], u[4 + c], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 p23l = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 p23h = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(3, 2, 3, 2));
    r[c] = _mm512_shuffle_f32x4(p01l, p23l, _MM_SHUFFLE(2, 0, 2, 0));
    r[4 + c] = _mm512_shuffle_f32x4(p01l, p23l, _MM_SHUFFLE(3, 1, 3, 1));
    r[8 + c] = _mm512_shuffle_f32x4(p01h, p23h, _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + c] = _mm512_shuffle_f32x4(p01h, p23h, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// sums[m * R + r] = dot(x row m, w row r) over K, for R weight rows (stride ldw) and MB rows of x.
template <int R, int MB>
inline void tile(const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t K, float* sums) {
  __m512 acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_ps(w + r * ldw + k);
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * ldx + k);
      for (int r = 0; r < R; ++r) acc[r][m] = _mm512_fmadd_ps(wv[r], xv, acc[r][m]);
    }
  }
  if (k < K) {  // K not a multiple of 16 (fp32 or int8 weights of odd widths): masked, zeros past K
    const __mmask16 tail = static_cast<__mmask16>((1u << (K - k)) - 1);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_ps(tail, w + r * ldw + k);
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(tail, x + m * ldx + k);
      for (int r = 0; r < R; ++r) acc[r][m] = _mm512_fmadd_ps(wv[r], xv, acc[r][m]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    if constexpr (R == 4) {
      _mm_storeu_ps(sums + m * R, hsum4(acc[0][m], acc[1][m], acc[2][m], acc[3][m]));
    } else {
      for (int r = 0; r < R; ++r) sums[m * R + r] = _mm512_reduce_add_ps(acc[r][m]);
    }
  }
}

template <int R>
inline void tile_rows(int mb, const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t K, float* sums) {
  with_rows<1, kM>(mb, [&](auto rows) { tile<R, decltype(rows)::value>(w, ldw, x, ldx, K, sums); });
}

// ---- 2-8 activation rows (a batch of decoding sequences): weights expanded in registers, 512-bit ----
// quant_matmul.h's small-batch path expands each block into 256-bit vectors and runs one weight row x
// 5-8 activation rows of 256-bit FMAs (with a load each); here a block becomes 512-bit vectors of 16
// weights (Wide<B>) and R weight rows x MB activation rows of 512-bit accumulators take them, so each
// expansion and each load of x feeds twice the multiply-adds.

// 16 bytes -> their low (h 0) or high (h 1) nibbles as 16 int32 lanes (weights 16 h .. 16 h + 15).
inline __m512i nibble_lanes(const uint8_t* qs, int h) {
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return h == 0 ? _mm512_and_si512(q, _mm512_set1_epi32(0xf)) : _mm512_srli_epi32(q, 4);
}

// Wide<B>::expand(block, sink): sink(h, v), v the weights [16 h, 16 h + 16) of the block as gguf_blocks.h
// computes them (the same fp32 values). ok: the formats that have it (blocks of 16 or 32 weights; the
// K-quants' blocks of 256 and fp32 rows keep quant_matmul.h's path).
template <class B> struct Wide { static constexpr bool ok = false; };
template <> struct Wide<gguf::BlockQ4_0> {
  static constexpr bool ok = true;
  template <class Sink> static void expand(const uint8_t* b, Sink&& sink) {
    const float d = gguf::half_to_float(b);
    const __m512 dv = _mm512_set1_ps(d), off = _mm512_set1_ps(-8.f * d);
    for (int h = 0; h < 2; ++h) sink(h, _mm512_fmadd_ps(_mm512_cvtepi32_ps(nibble_lanes(b + 2, h)), dv, off));
  }
};
template <> struct Wide<gguf::BlockQ5_0> {
  static constexpr bool ok = true;
  template <class Sink> static void expand(const uint8_t* b, Sink&& sink) {
    const float d = gguf::half_to_float(b);
    const __m512 dv = _mm512_set1_ps(d), off = _mm512_set1_ps(-16.f * d);
    const __m512i qh = _mm512_set1_epi32(static_cast<int>(gguf::load_u32(b + 2)));
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int h = 0; h < 2; ++h) {  // weight i's 5th bit is bit i of qh
      const __m512i fifth = _mm512_and_si512(
          _mm512_slli_epi32(_mm512_srlv_epi32(qh, _mm512_add_epi32(lane, _mm512_set1_epi32(16 * h))), 4),
          _mm512_set1_epi32(0x10));
      sink(h, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_or_si512(nibble_lanes(b + 6, h), fifth)), dv, off));
    }
  }
};
template <> struct Wide<gguf::BlockQ4_1> {
  static constexpr bool ok = true;
  template <class Sink> static void expand(const uint8_t* b, Sink&& sink) {
    const __m512 dv = _mm512_set1_ps(gguf::half_to_float(b)), mv = _mm512_set1_ps(gguf::half_to_float(b + 2));
    for (int h = 0; h < 2; ++h) sink(h, _mm512_fmadd_ps(_mm512_cvtepi32_ps(nibble_lanes(b + 4, h)), dv, mv));
  }
};
template <> struct Wide<gguf::BlockQ8_0> {
  static constexpr bool ok = true;
  template <class Sink> static void expand(const uint8_t* b, Sink&& sink) {
    const __m512 dv = _mm512_set1_ps(gguf::half_to_float(b));
    for (int h = 0; h < 2; ++h)
      sink(h, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * h)))), dv));
  }
};
template <> struct Wide<gguf::BlockI8> {
  static constexpr bool ok = true;
  template <class Sink> static void expand(const uint8_t* b, Sink&& sink) {
    sink(0, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)))));
  }
};

// sums[m * R + r] = dot(x row m, weight row r) for R consecutive weight rows at w and MB rows of x.
template <class B, int R, int MB>
inline void wide_rows(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const float* x, int64_t ldx, float* sums) {
  constexpr int H = B::QK / 16;
  __m512 acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_setzero_ps();
  const int64_t ahead = prefetch_distance(R * row_bytes);  // gguf_blocks.h
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    __m512 wv[R][H];
    for (int r = 0; r < R; ++r) {
      const uint8_t* wb = w + r * row_bytes + blk * B::BYTES;
      for (int line = 0; line < B::BYTES; line += 64) _mm_prefetch(reinterpret_cast<const char*>(wb + ahead + line), _MM_HINT_T0);
      Wide<B>::expand(wb, [&](int h, __m512 v) { wv[r][h] = v; });
    }
    for (int h = 0; h < H; ++h)
      for (int m = 0; m < MB; ++m) {
        const __m512 xv = _mm512_loadu_ps(x + m * ldx + blk * B::QK + 16 * h);
        for (int r = 0; r < R; ++r) acc[r][m] = _mm512_fmadd_ps(wv[r][h], xv, acc[r][m]);
      }
  }
  if constexpr (MB >= 4) {  // 4 activation rows of one weight row reduced at a time
    constexpr int kFours = MB / 4 * 4;
    for (int r = 0; r < R; ++r) {
      for (int m = 0; m < kFours; m += 4) {
        alignas(16) float four[4];
        _mm_store_ps(four, hsum4(acc[r][m], acc[r][m + 1], acc[r][m + 2], acc[r][m + 3]));
        for (int i = 0; i < 4; ++i) sums[(m + i) * R + r] = four[i];
      }
      for (int m = kFours; m < MB; ++m) sums[m * R + r] = _mm512_reduce_add_ps(acc[r][m]);
    }
  } else {
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < MB; ++m) sums[m * R + r] = _mm512_reduce_add_ps(acc[r][m]);
  }
}

// Weight rows [n0, n1) of the blocks at `data` expanded to fp32 rows of K into out [(n1 - n0), K].
template <class B>
inline void expand_rows(const uint8_t* data, int64_t row_bytes, int64_t K, int64_t n0, int64_t n1, float* out) {
  const int64_t nblocks = K / B::QK;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = data + n * row_bytes;
    float* o = out + (n - n0) * K;
    for (int64_t blk = 0; blk < nblocks; ++blk)
      B::expand(row + blk * B::BYTES, [&](int g, __m256 v) { _mm256_storeu_ps(o + blk * B::QK + 8 * g, v); });
  }
}

}  // namespace gemm

#if defined(VOXLANE_AMX)
// ---- AMX (Intel's tile unit), for our int8 weights: bf16 tiles, fp32 accumulation -----------------
// TDPBF16PS multiplies a 16 x 32 bf16 tile A by a 32 x 16 bf16 tile B (in pairs of k: B[k/2][n][k%2])
// into a 16 x 16 fp32 tile C: 8,192 multiply-adds per instruction. bf16 keeps 8 bits of a float's 24:
// int8 weights are exact in it, and each activation x goes in as two, hi = bf16(x) and lo = bf16(x - hi)
// (x - hi is exact in fp32), so x is carried to 2^-18 of itself (fp32: 2^-24) and dot(w, x) =
// w . hi + w . lo: two products per tile. Measured: ~3e-6 of the largest output against 2e-7 for
// the FMA path; the quality report's int8 row unchanged to 5 decimals. The GGUF formats and fp32
// weights are not exact in bf16 (their split would need w's lo too, and was ~1.8e-5 off fp32 in the
// cache after 30 layers): they keep the FMA path, so native stays exact to the file.
// Here A = 16 weight rows (row-major), B = 16 activation rows in k pairs (XPack, built once per matrix
// input), C[weight row][activation row].
namespace amx {

// Linux gives a process the tile registers' state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM).
inline bool enabled() {
  // (once per process; a kernel or hypervisor that refuses it leaves the 512-bit FMA path)
  static const bool ok = [] {
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return ok;
}

// A tile configuration (palette 1; _tile_loadconfig's 64 bytes), built by naming runs of tiles:
// TileConfig().tiles(first, count, rows, bytes_per_row).... Every AMX kernel's (this file's bf16 tiles,
// q8_matmul.h's int8 tiles, r16_tiles.h's and r16_batch.h's) is one of these, held in a static const: gcc's
// _tile_loadconfig tells the compiler it reads 8 bytes, so a config built on the stack just before it
// had its other bytes never stored (ldtilecfg faulted).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig& tiles(int first, int count, int r, int bytes) {
    for (int t = first; t < first + count; ++t) {
      rows[t] = static_cast<uint8_t>(r);
      colsb[t] = static_cast<uint16_t>(bytes);
    }
    return *this;
  }
};

// Every tile 16 rows x 64 bytes: C0, C1 (fp32), A (weights), B hi, B lo of two activation blocks.
inline const TileConfig& bf16_tile_config() {
  static const TileConfig config = TileConfig().tiles(0, 8, 16, 64);
  return config;
}

// Int8 weight rows [p0, p0 + rows) (rows <= 16; the others zero) -> A tiles' rows [16][Kp] bf16 (exact).
inline void int8_rows(const uint8_t* data, int64_t row_bytes, int64_t K, int64_t Kp, int64_t p0, int64_t rows,
                      uint16_t* a) {
  std::memset(a, 0, 16 * Kp * sizeof(uint16_t));
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* src = reinterpret_cast<const int8_t*>(data + (p0 + r) * row_bytes);
    for (int64_t k = 0; k < K; k += 16) {  // K is a multiple of 16 (gguf::BlockI8)
      const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k))));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + r * Kp + k), (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
}

// C[n][m] (16 x 16 per activation block) for one panel of 16 weight rows and every activation row:
// y[m, n] = C * row_scale + bias.
inline void panel(const uint16_t* a, const XPack& x, int64_t p0, int64_t rows, const float* row_scale,
                  const float* bias, float* y, int64_t ldy) {
  alignas(64) float c[2][16 * 16];
  const int64_t stride = x.Kp * 2, kblocks = x.Kp / 32, mblocks = x.blocks();
  for (int64_t mb = 0; mb < mblocks; mb += 2) {
    const bool two = mb + 1 < mblocks;
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      _tile_loadd(2, a + kb * 32, stride);
      _tile_loadd(4, x.hi_tile(mb, kb), 64);
      _tile_loadd(5, x.lo_tile(mb, kb), 64);
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(0, 2, 5);
      if (two) {
        _tile_loadd(6, x.hi_tile(mb + 1, kb), 64);
        _tile_loadd(7, x.lo_tile(mb + 1, kb), 64);
        _tile_dpbf16ps(1, 2, 6);
        _tile_dpbf16ps(1, 2, 7);
      }
    }
    _tile_stored(0, c[0], 64);
    if (two) _tile_stored(1, c[1], 64);
    for (int b = 0; b < (two ? 2 : 1); ++b) {
      const int64_t m0 = (mb + b) * 16, m1 = std::min(x.M, m0 + 16);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = p0 + r;
        const float scale = row_scale ? row_scale[n] : 1.f, add = bias ? bias[n] : 0.f;
        for (int64_t m = m0; m < m1; ++m) y[m * ldy + n] = c[b][r * 16 + (m - m0)] * scale + add;
      }
    }
  }
}

// x's tiles for this call, in `parts` parts: the worker's pack (kept across the tasks of a phase) or
// this thread's own, packed now.
inline const XPack& packed_x(XPack* pack, const float* x, int64_t M, int64_t ldx, int64_t K, int parts) {
  thread_local XPack own;
  XPack& xp = pack ? *pack : own;
  if (!pack) xp.ready = false;
  xp.ensure(x, M, ldx, K, parts);
  return xp;
}

// Int8 weight rows [n0, n1) times every row of x, a panel of 16 weight rows at a time.
inline void int8_weights(const uint8_t* data, int64_t row_bytes, int64_t K, const float* row_scale, const float* bias,
                         const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1,
                         XPack* pack) {
  const XPack& xp = packed_x(pack, x, M, ldx, K, 2);
  thread_local std::vector<uint16_t> a;
  a.resize(16 * xp.Kp);
  _tile_loadconfig(&bf16_tile_config());
  for (int64_t p0 = n0; p0 < n1; p0 += 16) {
    const int64_t rows = std::min<int64_t>(16, n1 - p0);
    int8_rows(data, row_bytes, K, xp.Kp, p0, rows, a.data());
    gemm::prefetch_panel(data, row_bytes, p0 + 16, std::min<int64_t>(n1, p0 + 32));
    panel(a.data(), xp, p0, rows, row_scale, bias, y, ldy);
  }
  _tile_release();
}

// ---- bf16 activations for the GGUF formats whose d q is exact as a bf16 pair (opt-in) -------------------
// Q4_0 (d (q - 8)), Q5_0 (d (q - 16)) and Q4_1's d q: an fp16 d (11 significant bits) times a 4- or
// 5-bit integer has at most 16 significant bits, so hi = d q truncated to bf16 and lo = d q - hi (at
// most 8 bits below hi's) are both exact in bf16 and hi + lo is the file's value. With x rounded to
// bf16 (XPack parts 1), two tile products, x . hi + x . lo, give dot(bf16(x), w) with fp32
// accumulation: the file's weights exact, the activations to 2^-9 of themselves. Q4_1's min m (per
// block of 32) is an fp32 product with the blocks' sums of the rounded activations (XPack::bsum).
// (Exact fp32 activations took five products, x in three parts: no faster than the FMA GEMM here;
// docs/engine.md.) Q8_0 (8-bit q: 19 bits), Q4_K and Q6_K are not exact as a pair: they keep fp32.
// Pair<B>::dq(block, sink): sink(h, v) with v the 16 values d q of weights [16 h, 16 h + 16) (h = 0, 1),
// exact in fp32 (Q4_0, Q5_0: their weights, gemm::Wide); min(block): Q4_1's m.
template <class B> struct Pair { static constexpr bool ok = false, has_min = false; static constexpr int nibbles_at = 0; };
template <> struct Pair<gguf::BlockQ4_0> {
  static constexpr bool ok = true, has_min = false;
  static constexpr int nibbles_at = 2;  // a 4-bit format: d q of the 16 q values as a table (pair_rows)
  static float offset(float d) { return -8.f * d; }
  template <class Sink> static void dq(const uint8_t* b, Sink&& sink) { gemm::Wide<gguf::BlockQ4_0>::expand(b, sink); }
  static float min(const uint8_t*) { return 0.f; }
};
template <> struct Pair<gguf::BlockQ5_0> {
  static constexpr bool ok = true, has_min = false;
  static constexpr int nibbles_at = 0;  // 5-bit: expanded weight by weight
  template <class Sink> static void dq(const uint8_t* b, Sink&& sink) { gemm::Wide<gguf::BlockQ5_0>::expand(b, sink); }
  static float min(const uint8_t*) { return 0.f; }
};
template <> struct Pair<gguf::BlockQ4_1> {
  static constexpr bool ok = true, has_min = true;
  static constexpr int nibbles_at = 4;
  static float offset(float) { return 0.f; }
  template <class Sink> static void dq(const uint8_t* b, Sink&& sink) {
    const __m512 dv = _mm512_set1_ps(gguf::half_to_float(b));
    for (int h = 0; h < 2; ++h) sink(h, _mm512_mul_ps(_mm512_cvtepi32_ps(gemm::nibble_lanes(b + 4, h)), dv));
  }
  static float min(const uint8_t* b) { return gguf::half_to_float(b + 2); }
};

// Weight rows [p0, p0 + rows) (rows <= 16; the others zero) -> A tiles' rows [16][K] of hi and lo, and
// (formats with a min) mins[K / 32][16] (a block's 16 rows side by side).
template <class B>
inline void pair_rows(const uint8_t* data, int64_t row_bytes, int64_t K, int64_t p0, int64_t rows, uint16_t* hi,
                      uint16_t* lo, float* mins) {
  const int64_t nblocks = K / B::QK;
  if (rows < 16) {
    std::memset(hi + rows * K, 0, (16 - rows) * K * sizeof(uint16_t));
    std::memset(lo + rows * K, 0, (16 - rows) * K * sizeof(uint16_t));
    if (Pair<B>::has_min) std::memset(mins, 0, 16 * nblocks * sizeof(float));
  }
  const __m512i top = _mm512_set1_epi32(~0xffff);
  const __m512 q16 = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = data + (p0 + r) * row_bytes;
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const uint8_t* b = row + blk * B::BYTES;
      uint16_t *h = hi + r * K + blk * B::QK, *l = lo + r * K + blk * B::QK;
      if constexpr (Pair<B>::nibbles_at > 0) {
        // 4-bit q: the block's 16 possible values d q (+ offset), split once, as a table [hi 0-15, lo 0-15]
        // that the 32 nibbles index (vpermw): a third fewer instructions than splitting each weight
        const float d = gguf::half_to_float(b);
        const __m512 v = _mm512_fmadd_ps(q16, _mm512_set1_ps(d), _mm512_set1_ps(Pair<B>::offset(d)));
        const __m512i hv = _mm512_and_si512(_mm512_castps_si512(v), top);
        const __m512i table = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hv, 16))),
            (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, _mm512_castsi512_ps(hv))), 1);
        const __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + Pair<B>::nibbles_at)));
        const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(q, _mm256_set1_epi16(0xf))),
                                               _mm256_srli_epi16(q, 4), 1);  // weights 0-15: low nibbles
        _mm512_storeu_si512(h, _mm512_permutexvar_epi16(idx, table));
        _mm512_storeu_si512(l, _mm512_permutexvar_epi16(_mm512_or_si512(idx, _mm512_set1_epi16(16)), table));
        if (Pair<B>::has_min) mins[blk * 16 + r] = Pair<B>::min(b);
        continue;
      }
      Pair<B>::dq(b, [&](int g, __m512 v) {
        // truncation, not rounding, for hi: v - hi then has the sign of v and fits 8 bits as well
        const __m512i hv = _mm512_and_si512(_mm512_castps_si512(v), top);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + 16 * g), _mm512_cvtepi32_epi16(_mm512_srli_epi32(hv, 16)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(l + 16 * g),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, _mm512_castsi512_ps(hv))));
      });
      if (Pair<B>::has_min) mins[blk * 16 + r] = Pair<B>::min(b);
    }
  }
}

// One panel of 16 weight rows (A hi, lo: [16][K]) times every activation row (x in bf16, XPack parts
// 1): two products a tile, into four accumulators so that no TDPBF16PS waits for the one before into
// its tile (two activation blocks: C0, C1 their hi products, C2, C3 their lo products; a lone block:
// hi and lo of even and odd k steps). Tiles: C0-C3, A hi (4), A lo (5), B (6, 7).
inline void bf16x_panel(const uint16_t* ahi, const uint16_t* alo, const float* mins, int64_t nblocks, const XPack& x,
                        int64_t p0, int64_t rows, const float* row_scale, const float* bias, float* y, int64_t ldy) {
  alignas(64) float c[4][16 * 16];
  const int64_t stride = x.Kp * 2, kblocks = x.Kp / 32, mblocks = x.blocks(), Mp = mblocks * 16;
  for (int64_t mb = 0; mb < mblocks; mb += 2) {
    const bool two = mb + 1 < mblocks;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    if (two) {
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        _tile_loadd(4, ahi + kb * 32, stride);
        _tile_loadd(5, alo + kb * 32, stride);
        _tile_loadd(6, x.hi_tile(mb, kb), 64);
        _tile_loadd(7, x.hi_tile(mb + 1, kb), 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    } else {
      int64_t kb = 0;
      for (; kb + 2 <= kblocks; kb += 2) {
        _tile_loadd(4, ahi + kb * 32, stride);
        _tile_loadd(5, alo + kb * 32, stride);
        _tile_loadd(6, x.hi_tile(mb, kb), 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        _tile_loadd(4, ahi + (kb + 1) * 32, stride);
        _tile_loadd(5, alo + (kb + 1) * 32, stride);
        _tile_loadd(7, x.hi_tile(mb, kb + 1), 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
      if (kb < kblocks) {
        _tile_loadd(4, ahi + kb * 32, stride);
        _tile_loadd(5, alo + kb * 32, stride);
        _tile_loadd(6, x.hi_tile(mb, kb), 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
      }
    }
    _tile_stored(0, c[0], 64);  // (tile numbers are immediates)
    _tile_stored(1, c[1], 64);
    _tile_stored(2, c[2], 64);
    _tile_stored(3, c[3], 64);
    // C[weight row][activation row] -> y's rows: each block's 16 x 16 sums transposed in registers, then
    // per activation row one masked store of its 16 outputs (+ Q4_1's mins . the row's block sums)
    const __mmask16 out_rows = static_cast<__mmask16>((1u << rows) - 1);
    const __m512 scale = row_scale ? _mm512_maskz_loadu_ps(out_rows, row_scale + p0) : _mm512_set1_ps(1.f);
    const __m512 add = bias ? _mm512_maskz_loadu_ps(out_rows, bias + p0) : _mm512_setzero_ps();
    for (int b = 0; b < (two ? 2 : 1); ++b) {
      const int64_t m0 = (mb + b) * 16, m1 = std::min(x.M, m0 + 16);
      __m512 t[16];
      for (int r = 0; r < 16; ++r) {
        t[r] = _mm512_add_ps(_mm512_load_ps(c[b] + r * 16), _mm512_load_ps(c[2 + b] + r * 16));
        if (!two) t[r] = _mm512_add_ps(t[r], _mm512_add_ps(_mm512_load_ps(c[1] + r * 16), _mm512_load_ps(c[3] + r * 16)));
      }
      gemm::transpose16(t);
      for (int64_t m = m0; m < m1; ++m) {
        __m512 v = t[m - m0];
        if (mins)
          for (int64_t blk = 0; blk < nblocks; ++blk)
            v = _mm512_fmadd_ps(_mm512_set1_ps(x.bsum[blk * Mp + m]), _mm512_loadu_ps(mins + blk * 16), v);
        _mm512_mask_storeu_ps(y + m * ldy + p0, out_rows, _mm512_fmadd_ps(v, scale, add));
      }
    }
  }
}

// Weight rows [n0, n1) of a pair-exact GGUF format times every row of x rounded to bf16, a panel of
// 16 weight rows at a time.
template <class B>
inline void bf16x_weights(const uint8_t* data, int64_t row_bytes, int64_t K, const float* row_scale, const float* bias,
                          const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1,
                          XPack* pack) {
  const XPack& xp = packed_x(pack, x, M, ldx, K, 1);
  const int64_t nblocks = K / B::QK;  // K is a multiple of 32 (Kp == K)
  thread_local std::vector<uint16_t> ahi, alo;
  thread_local std::vector<float> mins;
  ahi.resize(16 * K);
  alo.resize(16 * K);
  mins.resize(16 * nblocks);
  _tile_loadconfig(&bf16_tile_config());
  for (int64_t p0 = n0; p0 < n1; p0 += 16) {
    const int64_t rows = std::min<int64_t>(16, n1 - p0);
    pair_rows<B>(data, row_bytes, K, p0, rows, ahi.data(), alo.data(), mins.data());
    gemm::prefetch_panel(data, row_bytes, p0 + 16, std::min<int64_t>(n1, p0 + 32));
    bf16x_panel(ahi.data(), alo.data(), Pair<B>::has_min ? mins.data() : nullptr, nblocks, xp, p0, rows, row_scale,
                bias, y, ldy);
  }
  _tile_release();
}

}  // namespace amx
#endif

#if defined(VOXLANE_AMX)
// Whether the prompt GEMM may use the tiles: AMX allowed (set_prefill_amx) and usable on this machine.
inline bool amx_runs() { return amx_allowed().load(std::memory_order_relaxed) && amx::enabled(); }
#endif

// y[m, n] = (x[m, :] . W[n, :]) * row_scale[n] + bias[n] for rows n in [n0, n1) and all M rows of
// x (row stride ldx; y's ldy). Single-threaded: callers split [0, N) among threads.
//
// Int8 weights on a machine with AMX go through its tiles: `pack` (a worker's, for the input it was
// last packed from; null: packed for this call) holds the activation rows as bf16 hi/lo tiles. With
// `bf16x` (bf16 activations asked for), the pair-exact GGUF formats too (bf16x_tiles) from
// kBf16MinRows rows on, x rounded to bf16.
template <class B>
inline void gemm_format(const uint8_t* data, int64_t row_bytes, int64_t K, const float* row_scale, const float* bias,
                        const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1,
                        XPack* pack = nullptr, bool bf16x = false) {
  thread_local std::vector<float> expanded;
#if defined(VOXLANE_AMX)
  if constexpr (std::is_same_v<B, gguf::BlockI8>) {
    if (amx_runs())
      return amx::int8_weights(data, row_bytes, K, row_scale, bias, x, M, ldx, y, ldy, n0, n1, pack);
  } else if constexpr (amx::Pair<B>::ok) {
    if (bf16x && M >= kBf16MinRows && amx_runs())
      return amx::bf16x_weights<B>(data, row_bytes, K, row_scale, bias, x, M, ldx, y, ldy, n0, n1, pack);
  }
#endif
  (void)bf16x;
  (void)pack;
  if (!std::is_same_v<B, gguf::BlockF32> && static_cast<int64_t>(expanded.size()) < gemm::kPanel * K)
    expanded.resize(gemm::kPanel * K);
  float sums[gemm::kR * gemm::kM];
  for (int64_t p0 = n0; p0 < n1; p0 += gemm::kPanel) {  // a panel of weight rows, expanded once
    const int64_t p1 = std::min(n1, p0 + gemm::kPanel);
    gemm::prefetch_panel(data, row_bytes, p1, std::min(n1, p1 + gemm::kPanel));
    const float* w;
    if constexpr (std::is_same_v<B, gguf::BlockF32>) {
      w = reinterpret_cast<const float*>(data + p0 * row_bytes);  // already fp32 rows of K
    } else {
      gemm::expand_rows<B>(data, row_bytes, K, p0, p1, expanded.data());
      w = expanded.data();
    }
    for (int64_t m0 = 0; m0 < M; m0 += gemm::kM) {  // 6 rows of x stay in L1 while the panel's rows pass
      const int mb = static_cast<int>(std::min<int64_t>(gemm::kM, M - m0));
      const float* xm = x + m0 * ldx;
      auto store = [&](int64_t n, int r, int R) {
        const float scale = row_scale ? row_scale[n] : 1.f, b = bias ? bias[n] : 0.f;
        for (int m = 0; m < mb; ++m) y[(m0 + m) * ldy + n] = sums[m * R + r] * scale + b;
      };
      int64_t n = p0;
      for (; n + gemm::kR <= p1; n += gemm::kR) {
        gemm::tile_rows<gemm::kR>(mb, w + (n - p0) * K, K, xm, ldx, K, sums);
        for (int r = 0; r < gemm::kR; ++r) store(n + r, r, gemm::kR);
      }
      for (; n < p1; ++n) {
        gemm::tile_rows<1>(mb, w + (n - p0) * K, K, xm, ldx, K, sums);
        store(n, 0, 1);
      }
    }
  }
}
#endif

// Whether format B's rows multiply activations rounded to bf16 in AMX tiles when bf16 activations are
// asked for (EngineConfig.bf16_activations) and there are kBf16MinRows rows or more: a pair-exact format
// on a machine whose tiles run (and AMX allowed). Elsewhere the activations stay fp32.
template <class B>
inline bool bf16x_tiles() {
#if defined(VOXLANE_AMX)
  if constexpr (amx::Pair<B>::ok) return amx_runs();
#endif
  return false;
}

}  // namespace voxlane
