// AMX int8 tiles reading R16 directly, with int16 activations (EngineConfig.int16_activations): the
// products of M >= kTileMinRows activation rows (prompt chunks; decoding batches keep the VNNI kernel) on
// the R16-covered formats (Q4_0, Q4_1, Q8_0; r16_matmul.h describes the layout and the activations).
//
// One product per 32-value block and part of x: C[m][n] = sum_k A[m][k] B[k][n] (TDPBSUD: A signed,
// B unsigned) with
//   A = q1 (or q2) of up to 16 activation rows at block b: rows of 32 bytes, read in place from the
//       I16Rows (row stride K; no packing: the tile has as many rows as there are activation rows);
//   B = the block's 16 weight rows as columns, 8 rows of 16 x 4 consecutive K bytes: AMX's VNNI layout,
//       which R16's 64-byte lines are. Q8_0's 8 lines (u = q + 128) are the B tile as they lie in the
//       group (loaded with stride 64). A Q4 line j holds K 4j..4j+3 in its low nibbles and 16+4j.. in
//       its high ones: per group its lines are split once into 8 B rows per block (a per-worker buffer
//       of nb x 512 bytes, reused by every 16 activation rows).
// Two products per block (q1 and q2) into two C tiles; the epilogue per activation row m (lanes:
// the 16 weight rows) is r16_matmul.h's, dot = (C1 << 7) + C2 - Z sum(Q) (Z = 8 for Q4_0, 128 for
// Q8_0, in int32), acc[m] += float(dot) * (d[16] * s[m]) (+ m[16] * sx[m] for Q4_1): the same integer
// sums as the vector kernel and the same fp32 operations per block in the same order, so the results
// are its own (bit-equal where the compiler emits the same FMAs): tile_calls() counts the tiles' calls.
// Block b + 1's tile loads (into a second bank of A and B tiles) and products are issued before block b's
// epilogue (row_block), the epilogue's row count is known at compile time (its accumulators stay in
// registers), and the next group's bytes are prefetched while one is multiplied.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "q8_matmul.h"
#include "r16_matmul.h"

namespace voxlane::r16 {

// Activation rows from which R16 products run in tiles (where AMX runs): prompt chunks only. Why
// (`python -m bench.linear_ab --int16`, SmolLM2's Q4_1 matrices, 1 thread, load 3.4): at 2 rows the
// tiles took 1.5-1.7x the VNNI kernel's time (0.084 vs 0.055 ms for gate/up), at 8 rows 1.0x (gate/up,
// q) and 1.25x (down); from 16 rows they are 1.16-1.46x faster (two products and two tile stores per
// block and 16 activation rows; the VNNI kernel takes 8 rows per pass over the weights).
constexpr int64_t kTileMinRows = 9;

#if defined(VOXLANE_AMX_INT8) && defined(VOXLANE_R16_VNNI)
#define VOXLANE_R16_TILES 1
namespace tiles {

inline std::atomic<int64_t>& calls() {
  static std::atomic<int64_t> n{0};
  return n;
}

// C (tiles 0, 1: the q1 and q2 sums, R x 64 bytes); two banks of A (q1, q2: tiles 2, 3 and 4, 5, R x 32
// bytes) and B (tile 6 and 7, 8 x 64 bytes); R activation rows.
inline const amx::TileConfig& config(int R) {
  static const auto configs = [] {
    std::array<amx::TileConfig, 16> all;
    for (int r = 1; r <= 16; ++r) all[r - 1].tiles(0, 2, r, 64).tiles(2, 4, r, 32).tiles(6, 2, 8, 64);
    return all;
  }();
  return configs[R - 1];
}

// A Q4 group's lines -> B tiles (per block: rows 0-3 the low nibbles of lines 0-3, rows 4-7 the high).
inline void split_nibbles(const uint8_t* lines, int64_t nb, uint8_t* out) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(lines + (4 * b + j) * 64);
      _mm512_store_si512(out + 512 * b + 64 * j, _mm512_and_si512(v, low));
      _mm512_store_si512(out + 512 * b + 64 * (4 + j), _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
    }
}

// Block b of the next group (its lines and its scales) on their way, while this group's is multiplied.
template <class Lay>
inline void prefetch_block(const Weight& w, const uint8_t* next, int64_t b) {
  for (int j = 0; j < Lay::kLines; ++j)
    _mm_prefetch(reinterpret_cast<const char*>(next + (b * Lay::kLines + j) * 64), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(next + w.lines_bytes + b * Lay::kScaleBytes), _MM_HINT_T0);
}

// Block b's scales for the epilogue: d[16] (and m[16] for Q4_1; else d again) of the group's 16 weight rows.
template <class Lay>
__attribute__((always_inline)) inline void block_scales(const uint8_t* scales, int64_t b, __m512& d, __m512& mn) {
  const uint8_t* sc = scales + b * Lay::kScaleBytes;
  d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc)));
  mn = d;
  if constexpr (Lay::kMin) mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + 32)));
}

// The epilogue of block b for activation row m (lanes: the group's 16 weight rows), from the tile stores
// of the rows' q1 sums (hi: row m at hi + 16 m) and q2 sums (lo, the same): r16_matmul.h's, dot = (hi << 7)
// + lo - Z sum(Q) (in int32), acc += float(dot) * (d[16] * s[m]) (+ m[16] * sx[m] for Q4_1), the same
// integer sums and fp32 operations in the same order as the VNNI kernel. s, sx, sumq: the rows' per-block
// values (row m's at m nb + b). This file's prompt tiles and r16_batch.h's decoding-batch tiles both end
// each block with it (accumulate_rows, accumulate_block).
template <class Lay>
__attribute__((always_inline)) inline __m512 accumulate_row(const int32_t* hi, const int32_t* lo, int m, __m512 d,
                                                            __m512 mn, const float* s, const float* sx,
                                                            const int32_t* sumq, int64_t nb, int64_t b, __m512 acc) {
  __m512i v = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(hi + 16 * m), 7), _mm512_load_si512(lo + 16 * m));
  if constexpr (Lay::kOffset != 0) v = _mm512_add_epi32(v, _mm512_set1_epi32(-Lay::kOffset * sumq[m * nb + b]));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(d, _mm512_set1_ps(s[m * nb + b])), acc);
  if constexpr (Lay::kMin) acc = _mm512_fmadd_ps(mn, _mm512_set1_ps(sx[m * nb + b]), acc);
  return acc;
}

// accumulate_row for activation rows m < R (R <= kMaxRows, known at run time; r16_batch.h).
template <class Lay, int kMaxRows>
inline void accumulate_block(const int32_t* hi, const int32_t* lo, int R, const uint8_t* scales, const float* s,
                             const float* sx, const int32_t* sumq, int64_t nb, int64_t b, __m512* acc) {
  __m512 d, mn;
  block_scales<Lay>(scales, b, d, mn);
#pragma GCC unroll 16
  for (int m = 0; m < kMaxRows; ++m) {
    if (m >= R) break;
    acc[m] = accumulate_row<Lay>(hi, lo, m, d, mn, s, sx, sumq, nb, b, acc[m]);
  }
}

// f(std::integral_constant<int, m>) for m = m0 .. R - 1, unrolled: an array of accumulators indexed only by
// constants stays in registers.
template <int R, int m0 = 0, class F>
__attribute__((always_inline)) inline void each_row(F&& f) {
  if constexpr (m0 < R) {
    f(std::integral_constant<int, m0>{});
    each_row<R, m0 + 1>(f);
  }
}

// accumulate_row for rows m.. R - 1 (R known at compile time: the accumulators stay in registers; with a
// run-time row count gcc kept them on the stack, a load and a store per row and block).
template <class Lay, int R, int m = 0>
__attribute__((always_inline)) inline void accumulate_rows(const int32_t* hi, const int32_t* lo, __m512 d, __m512 mn,
                                                           const float* s, const float* sx, const int32_t* sumq,
                                                           int64_t nb, int64_t b, std::array<__m512, R>& acc) {
  if constexpr (m < R) {
    std::get<m>(acc) = accumulate_row<Lay>(hi, lo, m, d, mn, s, sx, sumq, nb, b, std::get<m>(acc));
    accumulate_rows<Lay, R, m + 1>(hi, lo, d, mn, s, sx, sumq, nb, b, acc);
  }
}

// y[m, n] for R (1-16, at compile time) activation rows m of the I16Rows at q1, q2, s, sx, sumq (row 0 of
// them: y's row 0) and the 16 weight rows of one group: bt its B tiles (a block's 512 bytes), scales its
// scale bytes, next the group whose bytes are prefetched meanwhile. The tile configuration for R rows is
// loaded. Per block: A (q1, q2) and B into one of two banks of tiles, a product into each C tile, both
// stored, the epilogue. The tiles run one block after another (a C tile is zeroed again only once it is
// stored), so what is off that chain is what counts: block b + 1's tile loads go to the other bank before
// block b's C is stored (no tile loaded is still read by a product), and its products are issued before
// block b's epilogue. Why (one linear, SmolLM2's Q4_1 matrices, 43 rows, 1 thread, load ~4, alternating in
// one process): 0.79-0.88x the time of two banks of C with one of A and B, whose next tile loads waited
// for the products before them.
template <class Lay, int R>
__attribute__((noinline)) void row_block(const Weight& w, const uint8_t* bt, const uint8_t* scales,
                                         const uint8_t* next, const int8_t* q1, const int8_t* q2, const float* s,
                                         const float* sx, const int32_t* sumq, int64_t K, float* y, int64_t ldy) {
  const int64_t nb = w.nblocks;
  alignas(64) int32_t c[4][256];
  std::array<__m512, R> acc;
  each_row<R>([&](auto m) __attribute__((always_inline)) { std::get<m.value>(acc) = _mm512_setzero_ps(); });
  auto epilogue = [&](const int32_t* c1, const int32_t* c2, int64_t b) __attribute__((always_inline)) {
    prefetch_block<Lay>(w, next, b);
    __m512 d, mn;
    block_scales<Lay>(scales, b, d, mn);
    accumulate_rows<Lay, R>(c1, c2, d, mn, s, sx, sumq, nb, b, acc);
  };
  // Tile numbers are immediates (gcc pastes them into the instruction): macros.
#define VOXLANE_R16_LOAD(A1, A2, BT, b)            \
  do {                                             \
    _tile_loadd(BT, bt + 512 * (b), 64);           \
    _tile_loadd(A1, q1 + kBlock * (b), K);         \
    _tile_loadd(A2, q2 + kBlock * (b), K);         \
  } while (0)
#define VOXLANE_R16_PRODUCTS(A1, A2, BT)           \
  do {                                             \
    _tile_zero(0);                                 \
    _tile_zero(1);                                 \
    _tile_dpbsud(0, A1, BT);                       \
    _tile_dpbsud(1, A2, BT);                       \
  } while (0)
  VOXLANE_R16_LOAD(2, 3, 6, 0);
  VOXLANE_R16_PRODUCTS(2, 3, 6);
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {  // C holds block b's products (bank 0's tiles)
    VOXLANE_R16_LOAD(4, 5, 7, b + 1);
    VOXLANE_TILE_STORE(0, c[0]);
    VOXLANE_TILE_STORE(1, c[1]);
    VOXLANE_R16_PRODUCTS(4, 5, 7);
    epilogue(c[0], c[1], b);
    const bool more = b + 2 < nb;
    if (more) VOXLANE_R16_LOAD(2, 3, 6, b + 2);
    VOXLANE_TILE_STORE(0, c[2]);
    VOXLANE_TILE_STORE(1, c[3]);
    if (more) VOXLANE_R16_PRODUCTS(2, 3, 6);
    epilogue(c[2], c[3], b + 1);
  }
  if (b < nb) {  // an odd block count: the last block
    VOXLANE_TILE_STORE(0, c[0]);
    VOXLANE_TILE_STORE(1, c[1]);
    epilogue(c[0], c[1], b);
  }
#undef VOXLANE_R16_LOAD
#undef VOXLANE_R16_PRODUCTS
  each_row<R>([&](auto m) __attribute__((always_inline)) { _mm512_storeu_ps(y + m.value * ldy, std::get<m.value>(acc)); });
}

// row_block<Lay, R> for a row count r (1-16) known at run time.
template <class Lay, int R = 16, class... Args>
inline void row_block_of(int r, Args&&... args) {
  if constexpr (R >= 1) {
    if (r == R) return row_block<Lay, R>(args...);
    row_block_of<Lay, R - 1>(r, args...);
  }
}

// y[m, n] = x^[m] . W[n] for weight rows [n0, n1) (multiples of 16) and all M rows of x.
template <class B>
inline void matmul(const Weight& w, const I16Rows& x, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  using Lay = Layout<B>;
  const int64_t K = x.K, nb = w.nblocks, groups = w.rows / kRows;
  thread_local std::vector<uint8_t> split;  // Q4: one group's B tiles
  uint8_t* sp = nullptr;
  if constexpr (Lay::kNibbles) {
    split.resize(static_cast<size_t>(nb * 512 + 64));
    sp = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(split.data()) + 63) & ~uintptr_t(63));
  }
  __asm__("" : "+r"(sp));  // a plain pointer (no thread_local look-up in the loops)
  int loaded = -1;
  calls().fetch_add(1, std::memory_order_relaxed);
  for (int64_t g = n0 / kRows; g < n1 / kRows; ++g) {
    const uint8_t* group = w.group(g);
    const uint8_t* next = w.group(std::min(g + 1, groups - 1));
    const uint8_t* bt = group;
    if constexpr (Lay::kNibbles) {
      split_nibbles(group, nb, sp);
      bt = sp;
    }
    __asm__ volatile("" ::: "memory");  // the split tiles written before the tile loads read them
    for (int64_t m0 = 0; m0 < M; m0 += 16) {
      const int R = static_cast<int>(std::min<int64_t>(16, M - m0));
      if (R != loaded) {
        _tile_loadconfig(&config(R));
        loaded = R;
      }
      row_block_of<Lay>(R, w, bt, group + w.lines_bytes, next, x.q1 + m0 * K, x.q2 + m0 * K, x.s + m0 * nb,
                        x.sx + m0 * nb, x.sumq + m0 * nb, K, y + m0 * ldy + g * kRows, ldy);
    }
  }
  if (loaded >= 0) _tile_release();
}

}  // namespace tiles
#endif

// Whether R16 products of M activation rows run in AMX int8 tiles here (built with them, AMX allowed
// and usable, M >= kTileMinRows).
inline bool tiles_run(int64_t M) {
#if defined(VOXLANE_R16_TILES)
  return M >= kTileMinRows && amx_runs();
#else
  (void)M;
  return false;
#endif
}

// Calls of the tile kernel so far (tests: the tiles ran; -1 without them in this build).
inline int64_t tile_calls() {
#if defined(VOXLANE_R16_TILES)
  return tiles::calls().load();
#else
  return -1;
#endif
}

// y[m, n] = x^[m] . W[n] for weight rows [n0, n1) (multiples of 16) and M rows of x: in tiles where
// tiles_run(M) (or tiles = 1 asks for them, 0 for the vector kernel; the ops' tests and benchmarks),
// else r16::matvec (VNNI, 8 activation rows at a time; descending: its row groups from the last down, as
// a step pool task taken from a phase's back end).
inline void product(const Weight& w, const I16Rows& x, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1,
                    int tiles = -1, bool descending = false) {
  const bool use = tiles < 0 ? tiles_run(M) : tiles == 1;
#if defined(VOXLANE_R16_TILES)
  if (use) {
    gguf::with_format(w.format, [&](auto block) {
      using B = decltype(block);
      if constexpr (has_layout<B>()) tiles::matmul<B>(w, x, M, y, ldy, n0, n1);
    });
    return;
  }
#endif
  (void)use;
  matvec(w, x, M, y, ldy, n0, n1, descending);
}

}  // namespace voxlane::r16
