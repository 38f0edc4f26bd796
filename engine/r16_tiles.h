// AMX int8 tiles reading R16 directly: the products of M >= kTileMinRows activation rows (prompt chunks;
// decoding batches keep the VNNI kernel or r16_batch.h's tiles) on the R16-covered formats (Q4_0, Q4_1,
// Q8_0; r16_matmul.h describes the layout and the activations), with int16 activations
// (EngineConfig.int16_activations). The one-call step quantizes these rows to 12-bit blocks (I16Rows with
// bits 12: Q = 16 q1 + q2, q2 in [0, 15], q1 and q2 of a block side by side); int16 rows (bits 16, the
// ops' tests and benchmarks) take the two-product path below.
//
// 12-bit rows, Q4 (SmolLM2's body): ONE product per 32-value block, C[m][n] = sum_k A[m][k] B[k][n]
// (TDPBSUD: A signed, B unsigned) with K = 64:
//   A = [q1 | q2] of the block for up to 16 activation rows: 64 bytes where the I16Rows hold them (row
//       stride pitch12(K) >= 2K; no packing: the tile has as many rows as there are activation rows);
//   B = [16 u | u]: 16 rows of 16 weight rows x 4 consecutive K bytes (AMX's VNNI layout). A Q4 line j
//       holds K 4j..4j+3 in its low nibbles and 16+4j.. in its high ones, so B rows 0-3 are the lines'
//       low nibbles shifted up (16 u <= 240 fits the unsigned byte), 4-7 their high nibbles masked in
//       place (0xf0: already 16 u), 8-15 the same nibbles unscaled for the q2 half; a group's lines are
//       split once into these 16 rows per block (split_nibbles12: a per-worker buffer of nb KB, reused by
//       every 16 activation rows).
// So C = sum_k (16 q1 + q2) u = sum Q u, one C tile and one 1 KB store per block, and the epilogue per
// activation row m (lanes: the 16 weight rows) is dot = C (- 8 sum(Q) for Q4_0, in int32), acc[m] +=
// float(dot) * (d[16] * s[m]) (+ m[16] * sx[m] for Q4_1). Why (tenth session's micro-benchmark, again
// here): TDPBSUD costs the same at K = 32 and 64 (~5 ns a 16-row tile), and the product -> tile store ->
// epilogue chain set the pace of the two-product kernel (two products, two stores, a shift and an add
// per row and block). The price: 12-bit instead of 15-bit activations in prompt rows (x^ within
// amax / 4094 of x instead of amax / 32512): the quality report's int16 row on SmolLM2 stays at top-1
// 1.000, its mean KL from fp32 5.7e-6 against 3.0e-7 with int16 prompt rows (bf16 prompt rows: 3.1e-5;
// docs/engine.md, eleventh session).
//
// Two products per block (int16 rows, and Q8_0 whatever the rows: 16 (q + 128) does not fit a byte):
//   A = q1 (or q2) of up to 16 activation rows at block b: rows of 32 bytes, read in place (row stride K
//       for int16 rows, x.pitch for 12-bit ones);
//   B = the block's 16 weight rows as columns, 8 rows of 16 x 4 consecutive K bytes: Q8_0's 8 lines (u =
//       q + 128) are the B tile as they lie in the group (loaded with stride 64); a Q4 group's lines are
//       split once into 8 B rows per block (split_nibbles: nb x 512 bytes).
// Two C tiles; the epilogue is r16_matmul.h's, dot = (C1 << S) + C2 - Z sum(Q) (S = 7 for int16, 4 for
// 12-bit rows; Z = 8 for Q4_0, 128 for Q8_0, in int32), acc[m] += float(dot) * (d[16] * s[m]) (+ m[16] *
// sx[m] for Q4_1): on int16 rows the same integer sums and fp32 operations per block in the same order as
// the vector kernel, so the results are its own (bit-equal where the compiler emits the same FMAs).
//
// Both: block b + 1's tile loads (into a second bank of A and B tiles) and products are issued before
// block b's epilogue (row_block), the epilogue's row count is known at compile time (its accumulators stay
// in registers), and the next group's bytes are prefetched while one is multiplied. tile_calls() counts
// the tiles' calls. The one-product path has one tile configuration per call (config12: the full blocks of
// 16 rows and the last M % 16 in two slots of tiles), kept after the call, and its epilogue is compiled for
// SmolLM2's row lengths (by_blocks). What sets its pace (the twelfth session's harness, docs/engine.md):
// the tile instructions and the epilogue's vector instructions do not overlap (each adds its own time, in
// cache too), so every instruction per block counts, not the tile chain's latency.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "count_dispatch.h"
#include "q8_matmul.h"
#include "r16_matmul.h"

namespace voxlane::r16 {

// Activation rows from which R16 products run in tiles (where AMX runs): prompt chunks only. Why
// (`python -m bench.linear_ab --int16`, SmolLM2's Q4_1 matrices, 1 thread, load 3.4; the two-product
// kernel on int16 rows, eighth session; the one-product kernel on 12-bit rows took 0.85-1.08x its time at
// 9-16 rows in the eleventh, down the slowest): at 2 rows the
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
inline std::atomic<int64_t>& calls12() {  // of them, on 12-bit rows
  static std::atomic<int64_t> n{0};
  return n;
}

// The two-product tile configuration for R activation rows: C (tiles 0, 1: the q1 and q2 sums, R x 64
// bytes); two banks of A (q1, q2: tiles 2, 3 and 4, 5, R x 32 bytes) and B (tile 6 and 7, 8 x 64 bytes).
inline const amx::TileConfig& config(int R) {
  static const auto configs = [] {
    std::array<amx::TileConfig, 16> all;
    for (int r = 1; r <= 16; ++r) all[r - 1].tiles(0, 2, r, 64).tiles(2, 4, r, 32).tiles(6, 2, 8, 64);
    return all;
  }();
  return configs[R - 1];
}

// The one-product configuration of a call (12-bit rows, Q4): two slots of C and two banks of A, slot 0 for
// R0 rows (C tile 0, A tiles 2 and 3; R0 = 16, or M < 16) and slot 1 for the call's last R1 = M % 16 rows
// (C tile 1, A tiles 6 and 7; R1 = 0: none), the two banks of B ([16 u | u]: tiles 4 and 5, 16 x 64 bytes)
// shared. So one configuration serves every 16 rows of a call (row_block12's Slot), loaded once per call
// (load_config: only when the thread's is another) instead of at every switch between 16 and the last rows.
inline const amx::TileConfig& config12(int R0, int R1) {
  static const auto configs = [] {
    std::array<amx::TileConfig, 16 * 16> all;
    for (int r0 = 1; r0 <= 16; ++r0)
      for (int r1 = 0; r1 < 16; ++r1) {
        amx::TileConfig& c = all[(r0 - 1) * 16 + r1];
        c.tiles(0, 1, r0, 64).tiles(2, 2, r0, 64).tiles(4, 2, 16, 64);
        if (r1) c.tiles(1, 1, r1, 64).tiles(6, 2, r1, 64);
      }
    return all;
  }();
  return configs[(R0 - 1) * 16 + R1];
}

// Loads `config` unless it is this thread's tile configuration already (STTILECFG stores the current one:
// all zeros when the tiles are released). Why: LDTILECFG cost ~60 ns a call (r16_batch.h: a one-thread
// SmolLM2 batch-8 step makes ~5,900 calls), and it waits for the tile instructions before it (the ninth
// session's profile of a prompt: ~3-4 % of its samples at the switches between 16 and the last rows).
// Nothing here needs the zeroed tiles LDTILECFG leaves (each product zeroes its C tile first), so the
// kernels that load through this keep their configuration after a call (no _tile_release).
inline void load_config(const amx::TileConfig& config) {
  alignas(64) amx::TileConfig current;
  _tile_storeconfig(&current);
  __asm__ volatile("" : "+m"(current));  // its 64 bytes as written: gcc's builtin may not say it writes them all
  if (std::memcmp(&current, &config, sizeof current) != 0) _tile_loadconfig(&config);
}

// Tile instructions whose tile numbers are template arguments (gcc's intrinsics paste them into the
// instruction text, so they take only literals): row_block12's slots. Stores are amx::tile_store's
// (q8_matmul.h: the 1 KB written is its output operand, no "memory" clobber).
template <int T>
__attribute__((always_inline)) inline void tile_load(const void* base, int64_t stride) {
  __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm%c2|tileloadd\t%%tmm%c2, [%0+%1*1]}" ::"r"(base), "r"(stride), "i"(T));
}
template <int T>
__attribute__((always_inline)) inline void tile_zero() {
  __asm__ volatile("tilezero\t%%tmm%c0" ::"i"(T));
}
template <int C, int A, int B>
__attribute__((always_inline)) inline void tile_dpbsud() {
  __asm__ volatile("{tdpbsud\t%%tmm%c2, %%tmm%c1, %%tmm%c0|tdpbsud\t%%tmm%c0, %%tmm%c1, %%tmm%c2}" ::"i"(C), "i"(A), "i"(B));
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

// A Q4 group's lines -> the one-product B tiles [16 u | u] (per block, 1 KB: rows 0-3 16 x the low nibbles
// of lines 0-3, rows 4-7 16 x the high ones (the line masked with 0xf0), rows 8-15 the same unscaled).
// Each line is asked for kSplitAhead blocks before it is split. Why: the group's lines were prefetched
// while the group before was multiplied, but its A rows (43 x 1,152 B for K = 576) and split pass through
// L1 (48 KB) meanwhile, so the lines come back from L2 or further: perf of a one-thread 43-token prompt
// (SmolLM2, 15th session) had matmul12's own samples (this split, inlined) at 19 % of the process's, ~58 %
// of them on the instruction after a line's load. prompt_profile --threads 1 (load 4.5-5, 4 rounds):
// gate/up + SiLU 14.86 ms (8 blocks ahead) / 15.20 (2) / 16.98 (none); at load ~1.5: 11.82 (2) vs 12.11.
constexpr int64_t kSplitAhead = 8;
inline void split_nibbles12(const uint8_t* lines, int64_t nb, uint8_t* out) {
  const __m512i low = _mm512_set1_epi8(0x0f), high = _mm512_set1_epi8(static_cast<char>(0xf0));
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < 4; ++j) {
      if (b + kSplitAhead < nb)
        _mm_prefetch(reinterpret_cast<const char*>(lines + (4 * (b + kSplitAhead) + j) * 64), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(lines + (4 * b + j) * 64);
      uint8_t* o = out + 1024 * b + 64 * j;
      _mm512_store_si512(o, _mm512_and_si512(_mm512_slli_epi16(v, 4), high));
      _mm512_store_si512(o + 256, _mm512_and_si512(v, high));
      _mm512_store_si512(o + 512, _mm512_and_si512(v, low));
      _mm512_store_si512(o + 768, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
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
// of the rows' q1 sums (hi: row m at hi + 16 m) and q2 sums (lo, the same); Shift: 7 for int16 rows, 4 for
// 12-bit ones, and a null lo: hi holds the whole sums (the one-product path). r16_matmul.h's, dot = (hi <<
// Shift) + lo - Z sum(Q) (in int32), acc += float(dot) * (d[16] * s[m]) (+ m[16] * sx[m] for Q4_1): on
// int16 rows the same integer sums and fp32 operations in the same order as the VNNI kernel. s, sx, sumq:
// the rows' per-block values (row m's at m nb + b). This file's prompt tiles and r16_batch.h's
// decoding-batch tiles both end each block with it (accumulate_rows, accumulate_block).
template <class Lay, int Shift = 7>
__attribute__((always_inline)) inline __m512 accumulate_row(const int32_t* hi, const int32_t* lo, int m, __m512 d,
                                                            __m512 mn, const float* s, const float* sx,
                                                            const int32_t* sumq, int64_t nb, int64_t b, __m512 acc) {
  __m512i v;
  if constexpr (Shift == 0) v = _mm512_load_si512(hi + 16 * m);
  else v = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(hi + 16 * m), Shift), _mm512_load_si512(lo + 16 * m));
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

// accumulate_row<Lay, Shift> for rows m.. R - 1 (R known at compile time: the accumulators stay in
// registers; with a run-time row count gcc kept them on the stack, a load and a store per row and block).
template <class Lay, int R, int Shift = 7, int m = 0>
__attribute__((always_inline)) inline void accumulate_rows(const int32_t* hi, const int32_t* lo, __m512 d, __m512 mn,
                                                           const float* s, const float* sx, const int32_t* sumq,
                                                           int64_t nb, int64_t b, std::array<__m512, R>& acc) {
  if constexpr (m < R) {
    std::get<m>(acc) = accumulate_row<Lay, Shift>(hi, lo, m, d, mn, s, sx, sumq, nb, b, std::get<m>(acc));
    accumulate_rows<Lay, R, Shift, m + 1>(hi, lo, d, mn, s, sx, sumq, nb, b, acc);
  }
}

// y[m, n] for R (1-16, at compile time) activation rows m of x (its rows 0..R-1: y's row 0..) and the 16
// weight rows of one group: bt its B tiles (a block's 512 bytes), scales its scale bytes, next the group
// whose bytes are prefetched meanwhile; Shift: 7 for int16 rows, 4 for 12-bit ones (row stride and block
// offsets from x). The tile configuration for R rows is loaded. Per block: A (q1, q2) and B into one of
// two banks of tiles, a product into each C tile, both stored, the epilogue. The tiles run one block after
// another (a C tile is zeroed again only once it is stored), so what is off that chain is what counts:
// block b + 1's tile loads go to the other bank before block b's C is stored (no tile loaded is still
// read by a product), and its products are issued before block b's epilogue. Why (one linear, SmolLM2's
// Q4_1 matrices, 43 rows, 1 thread, load ~4, alternating in one process): 0.79-0.88x the time of two
// banks of C with one of A and B, whose next tile loads waited for the products before them.
template <class Lay, int R, int Shift>
__attribute__((noinline)) void row_block(const Weight& w, const uint8_t* bt, const uint8_t* scales,
                                         const uint8_t* next, const I16Rows& x, float* y, int64_t ldy) {
  const int64_t nb = w.nblocks, lda = x.stride(), step = x.at(kBlock);
  const int8_t *q1 = x.q1, *q2 = x.q2;
  const float *s = x.s, *sx = x.sx;
  const int32_t* sumq = x.sumq;
  alignas(64) int32_t c[4][256];
  std::array<__m512, R> acc;
  each_row<R>([&](auto m) __attribute__((always_inline)) { std::get<m.value>(acc) = _mm512_setzero_ps(); });
  auto epilogue = [&](const int32_t* c1, const int32_t* c2, int64_t b) __attribute__((always_inline)) {
    prefetch_block<Lay>(w, next, b);
    __m512 d, mn;
    block_scales<Lay>(scales, b, d, mn);
    accumulate_rows<Lay, R, Shift>(c1, c2, d, mn, s, sx, sumq, nb, b, acc);
  };
  // Tile numbers are immediates (gcc pastes them into the instruction): macros.
#define VOXLANE_R16_LOAD(A1, A2, BT, b)            \
  do {                                             \
    _tile_loadd(BT, bt + 512 * (b), 64);           \
    _tile_loadd(A1, q1 + step * (b), lda);         \
    _tile_loadd(A2, q2 + step * (b), lda);         \
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
    amx::tile_store<0>(c[0]);
    amx::tile_store<1>(c[1]);
    VOXLANE_R16_PRODUCTS(4, 5, 7);
    epilogue(c[0], c[1], b);
    const bool more = b + 2 < nb;
    if (more) VOXLANE_R16_LOAD(2, 3, 6, b + 2);
    amx::tile_store<0>(c[2]);
    amx::tile_store<1>(c[3]);
    if (more) VOXLANE_R16_PRODUCTS(2, 3, 6);
    epilogue(c[2], c[3], b + 1);
  }
  if (b < nb) {  // an odd block count: the last block
    amx::tile_store<0>(c[0]);
    amx::tile_store<1>(c[1]);
    epilogue(c[0], c[1], b);
  }
#undef VOXLANE_R16_LOAD
#undef VOXLANE_R16_PRODUCTS
  each_row<R>([&](auto m) __attribute__((always_inline)) { _mm512_storeu_ps(y + m.value * ldy, std::get<m.value>(acc)); });
}

// row_block's one-product twin (12-bit rows, Q4) over blocks [b0, b1) (y's values are added to when b0 >
// 0): per block A = [q1 | q2] (64 bytes a row, row stride x.pitch) and B = [16 u | u] (16 rows, bt: block
// b0's 1 KB) into one of two banks, one K = 64 product into the slot's C tile, one store, the epilogue
// (accumulate_row with Shift 0: one load per row, no shift or add). The same schedule: block b + 1's loads
// and product are issued before block b's epilogue. Slot (config12): 0 = C tile 0 and A tiles 2, 3; 1 = C
// tile 1 and A tiles 6, 7 (a call's last M % 16 rows). NB: the row's blocks (x's per-block s, sx, sumq
// are NB apart from one row to the next) when known at compile time (by_blocks), else 0 (w's).
template <class Lay, int R, int Slot, int NB>
__attribute__((noinline)) void row_block12(const Weight& w, const uint8_t* bt, const uint8_t* scales,
                                           const uint8_t* next, const I16Rows& x, float* y, int64_t ldy, int64_t b0,
                                           int64_t b1) {
  constexpr int kC = Slot, kA0 = Slot ? 6 : 2, kA1 = Slot ? 7 : 3;
  const int64_t nb = NB ? NB : w.nblocks, lda = x.stride();
  const int8_t* q = x.q1 + 2 * kBlock * b0;
  const float *s = x.s, *sx = x.sx;
  const int32_t* sumq = x.sumq;
  alignas(64) int32_t c[2][256];
  std::array<__m512, R> acc;
  each_row<R>([&](auto m) __attribute__((always_inline)) {
    std::get<m.value>(acc) = b0 ? _mm512_loadu_ps(y + m.value * ldy) : _mm512_setzero_ps();
  });
  auto epilogue = [&](const int32_t* cb, int64_t i) __attribute__((always_inline)) {
    const int64_t b = b0 + i;
    prefetch_block<Lay>(w, next, b);
    __m512 d, mn;
    block_scales<Lay>(scales, b, d, mn);
    accumulate_rows<Lay, R, 0>(cb, nullptr, d, mn, s, sx, sumq, nb, b, acc);
  };
  auto load = [&](auto bank, int64_t i) __attribute__((always_inline)) {
    constexpr bool kFirst = decltype(bank)::value == 0;
    tile_load<kFirst ? 4 : 5>(bt + 1024 * i, 64);
    tile_load<kFirst ? kA0 : kA1>(q + 2 * kBlock * i, lda);
  };
  auto product = [&](auto bank) __attribute__((always_inline)) {
    constexpr bool kFirst = decltype(bank)::value == 0;
    tile_zero<kC>();
    tile_dpbsud<kC, kFirst ? kA0 : kA1, kFirst ? 4 : 5>();
  };
  const std::integral_constant<int, 0> bank0;
  const std::integral_constant<int, 1> bank1;
  const int64_t n = b1 - b0;
  load(bank0, 0);
  product(bank0);
  int64_t b = 0;
  for (; b + 2 <= n; b += 2) {  // C holds block b0 + b's product (bank 0's tiles)
    load(bank1, b + 1);
    amx::tile_store<kC>(c[0]);
    product(bank1);
    epilogue(c[0], b);
    const bool more = b + 2 < n;
    if (more) load(bank0, b + 2);
    amx::tile_store<kC>(c[1]);
    if (more) product(bank0);
    epilogue(c[1], b + 1);
  }
  if (b < n) {  // an odd block count: the last block
    amx::tile_store<kC>(c[0]);
    epilogue(c[0], b);
  }
  each_row<R>([&](auto m) __attribute__((always_inline)) { _mm512_storeu_ps(y + m.value * ldy, std::get<m.value>(acc)); });
}

// The most blocks of a Q4 group split for the one-product tiles at a time (1 KB each): a row of up to
// kSplitBlocks blocks (SmolLM2's K = 576: 18) is split whole; a longer one (down's 48) runs in near-equal
// spans of at most kSplitSpan blocks, each split once and multiplied by every 16 activation rows, so the
// split stays in L1 (48 KB here) next to the A rows. A span's results are its row_block12 call's, which
// goes on from the span before's y: the same fp32 steps in the same order whatever the spans. Why
// (`python -m bench.linear_ab --int16`, SmolLM2's down, 576 x 1536, 1 thread): the whole group's 48 KB
// split took 0.80x / 0.94x / 0.97x the two-product kernel's speed at 9 / 16 / 43 rows; and (15th session,
// prompt_profile --threads 1, 43 tokens, alternating) down's four spans of 12 took 5.15-5.37 ms against
// 5.55 in two of 24, while K = 576 in two spans of 9 made gate/up + SiLU 13.11 ms against 11.82 whole.
constexpr int64_t kSplitBlocks = 24, kSplitSpan = 12;
inline int64_t split_spans(int64_t nb) { return nb <= kSplitBlocks ? 1 : (nb + kSplitSpan - 1) / kSplitSpan; }

// f(std::integral_constant<int, NB>) with NB = nb where row_block12 is compiled for it (SmolLM2-135M's rows
// of K = 576 and 1536 values: 18 and 48 blocks), else NB = 0 (any nb, at run time). Why: the epilogue
// reads each row's s and sx at m nb + b; with nb a constant those are one base register and a constant
// displacement per row, with nb at run time gcc kept the 32 rows' pointers on the stack (a reload before
// most broadcasts). A same-process harness (SmolLM2's shapes, random Q4_1, 43 rows, 1 thread, in cache,
// alternating, 41 rounds; docs/engine.md, twelfth session): 0.82-0.89x the time with the stride at run
// time, both with one configuration per call.
template <class F>
__attribute__((always_inline)) inline void by_blocks(int64_t nb, F&& f) {
  if (nb == 18) return f(std::integral_constant<int, 18>{});
  if (nb == 48) return f(std::integral_constant<int, 48>{});
  f(std::integral_constant<int, 0>{});
}

// The one-product path of matmul (12-bit rows, Q4): every 16 rows of x against each group in
// split_spans(nb) spans (each split once for all of them), the first M - M % 16 rows in config12's slot 0 and
// the last M % 16 in slot 1 (M < 16: slot 0), one configuration for the call.
template <class Lay>
inline void matmul12(const Weight& w, const I16Rows& x, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1,
                     uint8_t* sp) {
  const int64_t nb = w.nblocks, groups = w.rows / kRows, full = M / 16;
  const int last = static_cast<int>(M % 16);
  load_config(full ? config12(16, last) : config12(last, 0));
  by_blocks(nb, [&](auto blocks) __attribute__((always_inline)) {
    constexpr int NB = decltype(blocks)::value;
    for (int64_t g = n0 / kRows; g < n1 / kRows; ++g) {
      const uint8_t* group = w.group(g);
      const uint8_t* next = w.group(std::min(g + 1, groups - 1));
      const uint8_t* scales = group + w.lines_bytes;
      const int64_t spans = split_spans(nb);
      for (int64_t i = 0; i < spans; ++i) {
        const int64_t b0 = nb * i / spans, b1 = nb * (i + 1) / spans;
        split_nibbles12(group + b0 * Lay::kLines * 64, b1 - b0, sp);
        __asm__ volatile("" ::: "memory");  // the split tiles written before the tile loads read them
        for (int64_t m0 = 0; m0 < M; m0 += 16) {
          const I16Rows rows = x.at_row(m0);
          float* out = y + m0 * ldy + g * kRows;
          if (m0 + 16 <= M) {
            row_block12<Lay, 16, 0, NB>(w, sp, scales, next, rows, out, ldy, b0, b1);
          } else {
            by_count<15>(last, [&](auto r) __attribute__((always_inline)) {
              if (full) row_block12<Lay, decltype(r)::value, 1, NB>(w, sp, scales, next, rows, out, ldy, b0, b1);
              else row_block12<Lay, decltype(r)::value, 0, NB>(w, sp, scales, next, rows, out, ldy, b0, b1);
            });
          }
        }
      }
    }
  });
}

// y[m, n] = x^[m] . W[n] for weight rows [n0, n1) (multiples of 16) and all M rows of x: one product per
// block where x is 12-bit and W Q4 (matmul12; the tiles' configuration is kept after the call), else two.
template <class B>
inline void matmul(const Weight& w, const I16Rows& x, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  using Lay = Layout<B>;
  constexpr bool kQ4 = Lay::kNibbles;
  const int64_t nb = w.nblocks;
  thread_local std::vector<uint8_t> split;  // Q4: one group's B tiles
  uint8_t* sp = nullptr;
  if constexpr (kQ4) {
    split.resize(static_cast<size_t>(std::max(nb * 512, std::min(nb, kSplitBlocks) * 1024) + 64));
    sp = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(split.data()) + 63) & ~uintptr_t(63));
  }
  __asm__("" : "+r"(sp));  // a plain pointer (no thread_local look-up in the loops)
  calls().fetch_add(1, std::memory_order_relaxed);
  if (x.bits == 12) calls12().fetch_add(1, std::memory_order_relaxed);
  if constexpr (kQ4) {
    if (x.bits == 12) return matmul12<Lay>(w, x, M, y, ldy, n0, n1, sp);
  }
  int loaded = -1;
  // kernel(std::integral_constant<int, R>, rows, out) for every 16 activation rows (R of them: the last
  // may be fewer) of group g, the tiles configured for R rows
  auto each_16_rows = [&](int64_t g, auto&& kernel) __attribute__((always_inline)) {
    for (int64_t m0 = 0; m0 < M; m0 += 16) {
      const int R = static_cast<int>(std::min<int64_t>(16, M - m0));
      if (R != loaded) {
        _tile_loadconfig(&config(R));
        loaded = R;
      }
      const I16Rows rows = x.at_row(m0);
      float* out = y + m0 * ldy + g * kRows;
      by_count<16>(R, [&](auto r) __attribute__((always_inline)) { kernel(r, rows, out); });
    }
  };
  const int64_t groups = w.rows / kRows;
  for (int64_t g = n0 / kRows; g < n1 / kRows; ++g) {
    const uint8_t* group = w.group(g);
    const uint8_t* next = w.group(std::min(g + 1, groups - 1));
    const uint8_t* scales = group + w.lines_bytes;
    const uint8_t* bt = group;
    if constexpr (kQ4) {
      split_nibbles(group, nb, sp);
      bt = sp;
    }
    __asm__ volatile("" ::: "memory");  // the split tiles written before the tile loads read them
    each_16_rows(g, [&](auto r, const I16Rows& rows, float* out) __attribute__((always_inline)) {
      constexpr int kR = decltype(r)::value;
      if constexpr (!kQ4) {
        if (x.bits == 12) return row_block<Lay, kR, Split<12>::kShift>(w, bt, scales, next, rows, out, ldy);
      }
      row_block<Lay, kR, Split<16>::kShift>(w, bt, scales, next, rows, out, ldy);
    });
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

// Calls of the tile kernel so far (bits 12: those on 12-bit rows; tests: the tiles ran; -1 without them in
// this build).
inline int64_t tile_calls(int bits = 0) {
#if defined(VOXLANE_R16_TILES)
  return bits == 12 ? tiles::calls12().load() : tiles::calls().load();
#else
  (void)bits;
  return -1;
#endif
}

// y[m, n] = x^[m] . W[n] for weight rows [n0, n1) (multiples of 16) and M rows of x: in tiles where x is
// 12-bit (quantized for them: the one-call step's prompt rows, where tiles_run) or tiles_run(M) (or tiles
// = 1 asks for them, 0 for the vector kernel: the ops' tests and benchmarks, int16 rows), else r16::matvec
// (VNNI, 8 activation rows at a time; descending: its row groups from the last down, as a step pool task
// taken from a phase's back end).
inline void product(const Weight& w, const I16Rows& x, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1,
                    int tiles = -1, bool descending = false) {
  const bool use = tiles < 0 ? x.bits == 12 || tiles_run(M) : tiles == 1;
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
