// AMX int8 tiles for decoding batches (the one-call step's batches of kBatchTileMinRows-8 rows; the ops
// take 1-8) on R16 weights with int16 activations: one tile product per 32-value block for all M rows
// and both parts of x.
//
// Why: at 8 rows r16_matmul.h's VNNI kernel is bound by vpdpbusd itself (two per 4 weights, 16 weight
// rows and activation row: 128 per block of a 16-row group at 8 rows, about one per cycle here; in one
// linear in cache 8 rows took 4.7x one row's time), and r16_tiles.h's prompt tiles (two products and two
// tile stores per block, whatever the row count) tie with it at 8 rows. Here q1 and q2 of the M rows are
// ONE A tile of 2M rows: rows 0..M-1 q1, rows M..2M-1 q2, which is where they lie when the I16Rows hold
// exactly M rows (q2 = q1 + M K: the one-call step's buffers and the ops' inputs), so one strided tile
// load reads them; one TDPBSUD (B = the block's 16 weight rows, as in r16_tiles.h) gives both parts'
// sums; one tile store of 2M x 64 bytes. The epilogue per activation row m is r16_tiles.h's
// (tiles::accumulate_block): dot = (C[m] << 7) + C[M + m] (- Z sum(Q)), acc[m] += float(dot) * (d[16] *
// s[m]) (+ m[16] * sx[m]): the VNNI
// kernel's integer sums and fp32 operations in its order, so the outputs are bit-equal to r16::matvec's
// (the tests check it). The products run two blocks ahead of the epilogues, across the call's groups
// (four C tiles; see matmul).
// Q4's B tiles (a line's low and high nibbles as 8 B rows) are split 6 blocks ahead into a ring on the
// stack, during an earlier block's epilogue (a whole group split one group ahead, double-buffered, is 48
// KB for down's 48 blocks: down took 1.04x the VNNI kernel's time in one linear at 8 rows, 0.92x with the
// ring). The tiles are not released at the end of a call: each user of AMX here loads its own
// configuration first, and releasing per call (the step calls this once per task and linear: ~280 calls
// per SmolLM2 layer on one thread) made o_proj 1.4x slower than the VNNI kernel in a batch-8 step; and
// the configuration is loaded only when the thread's is another (tiles::load_config).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include "r16_tiles.h"

namespace voxlane::r16 {

#if defined(VOXLANE_R16_TILES)
namespace batch {

inline std::atomic<int64_t> calls{0};  // the kernel's calls (batch_tile_calls)

// Tiles 0-3: C (2M x 64 bytes, four banks); 4, 5: A (2M x 32); 6, 7: B (8 x 64); M activation rows.
inline const amx::TileConfig& config(int M) {
  static const auto configs = [] {
    std::array<amx::TileConfig, 8> all;
    for (int m = 1; m <= 8; ++m) all[m - 1].tiles(0, 4, 2 * m, 64).tiles(4, 2, 2 * m, 32).tiles(6, 2, 8, 64);
    return all;
  }();
  return configs[M - 1];
}

// y[m, n] = x^[m] . W[n] for weight rows [n0, n1) (multiples of 16) and the M (1-8) rows of x, whose q2
// follows its q1 (x.q2 == x.q1 + M K).
// kM > 0: M == kM at compile time, so the M accumulators stay in registers (with a run-time row count gcc
// kept them on the stack: a load and a store per row and block); kM == 0: any M (1-8).
template <class B, int kM = 0>
inline void matmul(const Weight& w, const I16Rows& x, int64_t rows, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  using Lay = Layout<B>;
  const int64_t M = kM > 0 ? kM : rows;
  const int64_t K = x.K, nb = w.nblocks, groups = w.rows / kRows;
  // The call's blocks i = 0..total-1 (group g0 + i / nb, its block i % nb) in one pipeline across its
  // groups: while block i's epilogue runs, block i + 1's C tile has just been stored and the products
  // of blocks i + 2 and i + 3 are under way. Why: a product's result takes long to come (the tile store
  // waits for it), and a tile store's data is not forwarded to the epilogue's loads (they wait until it
  // is written): with the product issued one block ahead and stored just before its epilogue, those
  // waits were half of a block's time (perf, 8 rows of gate/up, one thread). Block i's C tile is
  // i % 4 (its A and B tiles 4 + i % 2, 6 + i % 2); the stores go to a ring of three.
  // Q4: the B tiles in a ring of kRing blocks, block i split kAhead blocks ahead during block i -
  // kAhead's epilogue (its loads are the stream's prefetch, and its stores are done well before the tile
  // load reads them).
  constexpr int64_t kAhead = 6, kRing = 8;
  alignas(64) uint8_t ring[Lay::kNibbles ? kRing * 512 : 64];
  tiles::load_config(config(static_cast<int>(M)));  // the prompt tiles keep theirs after a call too
  calls.fetch_add(1, std::memory_order_relaxed);
  alignas(64) int32_t c[3][256];
  const int8_t* q = x.q1;
  const float *s = x.s, *sx = x.sx;
  const int32_t* sumq = x.sumq;
  const int64_t g0 = n0 / kRows, g1 = n1 / kRows, total = (g1 - g0) * nb;
  // The splits and the products each take the call's blocks in order: a cursor each (the block's group
  // and its index in it), moved on by one per block. Why: i / nb and i % nb per block were two 64-bit
  // divisions (idivq: nb is known at run time) on the way to the tile loads' addresses; with the cursors
  // a block took 0.83-0.96x the time (median 0.94x; SmolLM2's four shapes at 8 rows, in cache, thread CPU,
  // docs/engine.md's eleventh session).
  struct Cursor {
    const uint8_t* group;
    int64_t b = 0;
    void advance(int64_t blocks, int64_t group_bytes) {
      if (++b == blocks) b = 0, group += group_bytes;
    }
  };
  Cursor at_split{w.group(g0)}, at_product{w.group(g0)};
  auto split = [&](int64_t i) {  // block i of the call (the split cursor's) into its ring slot
    if (i < total) {
      tiles::split_nibbles(at_split.group + at_split.b * Lay::kLines * 64, 1, ring + 512 * (i % kRing));
      at_split.advance(nb, w.group_bytes);
    }
  };
  // B of block i (the product cursor's): its ring slot (Q4) or its 8 lines in its group (Q8_0).
  auto btile = [&](int64_t i) -> const uint8_t* {
    if constexpr (Lay::kNibbles) return ring + 512 * (i % kRing);
    return at_product.group + 512 * at_product.b;
  };
  if constexpr (Lay::kNibbles)
    for (int64_t i = 0; i < kAhead; ++i) split(i);
  int64_t g = g0, b = 0;  // the group and block of the next epilogue
  const uint8_t* scales = w.group(g) + w.lines_bytes;
  const uint8_t* next = w.group(std::min(g + 1, groups - 1));
  constexpr int kAcc = kM > 0 ? kM : 8;
  std::array<__m512, kAcc> acc;
  tiles::each_row<kAcc>([&](auto m) __attribute__((always_inline)) { std::get<m.value>(acc) = _mm512_setzero_ps(); });
  // Block b's epilogue for the M rows (C's rows: q1 sums at cb, q2 sums at cb + 16 M).
  auto accumulate = [&](const int32_t* cb) __attribute__((always_inline)) {
    if constexpr (kM > 0) {
      __m512 d, mn;
      tiles::block_scales<Lay>(scales, b, d, mn);
      tiles::accumulate_rows<Lay, kM>(cb, cb + 16 * kM, d, mn, s, sx, sumq, nb, b, acc);
    } else {
      tiles::accumulate_block<Lay, 8>(cb, cb + 16 * M, static_cast<int>(M), scales, s, sx, sumq, nb, b, acc.data());
    }
  };
  // The group's rows out (y's column block g), the accumulators zeroed for the next group.
  auto store_group = [&]() __attribute__((always_inline)) {
    tiles::each_row<kAcc>([&](auto m) __attribute__((always_inline)) {
      if (kM > 0 || m.value < M) _mm512_storeu_ps(y + m.value * ldy + g * kRows, std::get<m.value>(acc));
      std::get<m.value>(acc) = _mm512_setzero_ps();
    });
  };
  // Tile numbers are immediates (pasted into the instruction's text): macros. The empty asm reads the B
  // tile's 512 bytes: the ring's stores before the tile load that reads them (gcc's tile loads say
  // nothing of memory; the "memory" clobber this had also made every value the compiler kept in memory
  // be written back and reloaded around each product).
#define VOXLANE_R16B_PRODUCT(C, A, Bt, i)                                              \
  do {                                                                                 \
    __asm__ volatile("" ::"m"(*reinterpret_cast<const uint8_t(*)[512]>(btile(i))));   \
    _tile_zero(C);                                                                     \
    _tile_loadd(Bt, btile(i), 64);                                                     \
    _tile_loadd(A, q + kBlock * at_product.b, K);                                      \
    _tile_dpbsud(C, A, Bt);                                                            \
    at_product.advance(nb, w.group_bytes);                                             \
  } while (0)
  // Block j's epilogue (C's rows: q1 sums of the M rows, then q2's), then its group's rows out after its
  // last block.
#define VOXLANE_R16B_EPILOGUE(j)                                                                                    \
  do {                                                                                                              \
    if constexpr (Lay::kNibbles) split((j) + kAhead);                                                               \
    tiles::prefetch_block<Lay>(w, next, b); /* the next group's block b (a group ahead: ~6-16 KB) */                \
    accumulate(c[(j) % 3]);                                                                                         \
    if (++b == nb) {                                                                                                \
      store_group();                                                                                                \
      b = 0;                                                                                                        \
      if (++g < g1) {                                                                                               \
        scales = w.group(g) + w.lines_bytes;                                                                        \
        next = w.group(std::min(g + 1, groups - 1));                                                                \
      }                                                                                                             \
    }                                                                                                               \
  } while (0)
  // Block j = i + k (k = j % 4): C tile k. Stores block j + 1 (C tile (k + 1) % 4), issues block j + 3's
  // product (C tile (k + 3) % 4, A and B tiles of parity (k + 1) % 2), then block j's epilogue.
#define VOXLANE_R16B_STEP(k, C1, C3, A3, B3)                                    \
  do {                                                                          \
    const int64_t j = i + (k);                                                  \
    if (j + 1 < total) amx::tile_store<C1>(c[(j + 1) % 3]);                     \
    if (j + 3 < total) VOXLANE_R16B_PRODUCT(C3, A3, B3, j + 3);                 \
    VOXLANE_R16B_EPILOGUE(j);                                                   \
    if (j + 1 == total) goto done;                                              \
  } while (0)
  VOXLANE_R16B_PRODUCT(0, 4, 6, 0);
  if (total > 1) VOXLANE_R16B_PRODUCT(1, 5, 7, 1);
  if (total > 2) VOXLANE_R16B_PRODUCT(2, 4, 6, 2);
  amx::tile_store<0>(c[0]);
  for (int64_t i = 0;; i += 4) {
    VOXLANE_R16B_STEP(0, 1, 3, 5, 7);
    VOXLANE_R16B_STEP(1, 2, 0, 4, 6);
    VOXLANE_R16B_STEP(2, 3, 1, 5, 7);
    VOXLANE_R16B_STEP(3, 0, 2, 4, 6);
  }
done:;
#undef VOXLANE_R16B_STEP
#undef VOXLANE_R16B_EPILOGUE
#undef VOXLANE_R16B_PRODUCT
  // No _tile_release: every user of the tiles loads its own configuration first (q8_matmul.h,
  // prefill_gemm.h, r16_tiles.h, here), and a decode step calls this once per task and linear.
}

}  // namespace batch
#endif

// Whether decoding batches may use the batch tiles where AMX runs (A/Bs and tests turn them off to run
// the VNNI kernel on the same machine; torch.ops.voxlane.set_r16_batch_tiles).
inline std::atomic<bool>& batch_tiles_allowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

// Activation rows from which a decoding batch runs in the batch tiles (the step's choice). Why
// (`python -m bench.decode_profile --batch B --int16-activations --ab-batch-tiles`, SmolLM2, 21:16-21:21,
// load 5-6): at 8 rows a step took 0.88x the VNNI kernel's time on 2 threads and 0.94x on 1 (every
// matrix phase faster; the LM head 0.80x); at 4 rows 1.08x (o_proj and down slower: the tiles' fixed cost
// per block, ~25 ns in one linear, is the VNNI kernel's whole cost per block at 2-4 rows).
constexpr int64_t kBatchTileMinRows = 8;

// Whether the batch tiles can take M rows of x here: 1-8 int16 rows whose q2 follows q1 (x holds exactly
// those rows), built with AMX int8 and VNNI, allowed (set_r16_batch_tiles, set_prefill_amx) and granted.
inline bool batch_tiles_usable(const I16Rows& x, int64_t M) {
#if defined(VOXLANE_R16_TILES)
  return M >= 1 && M <= 8 && x.bits == 16 && x.q2 == x.q1 + M * x.K && batch_tiles_allowed().load(std::memory_order_relaxed) &&
         amx_runs();
#else
  (void)x, (void)M;
  return false;
#endif
}

// Whether a decoding batch of M rows runs in the batch tiles (the one-call step's choice).
inline bool batch_tiles_run(const I16Rows& x, int64_t M) { return M >= kBatchTileMinRows && batch_tiles_usable(x, M); }

// y[m, n] = x^[m] . W[n] for weight rows [n0, n1) (multiples of 16) and the M <= 8 rows of x: in the batch
// tiles where batch_tiles_run (or, forced = true, wherever batch_tiles_usable: the ops' tests), else
// r16::matvec (VNNI; descending: its row groups from the last down, as a step pool task taken from a
// phase's back end). batch_tile_calls() counts the tiles' calls (tests; -1 without them in this build).
inline void batch_product(const Weight& w, const I16Rows& x, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1,
                          bool forced = false, bool descending = false) {
#if defined(VOXLANE_R16_TILES)
  if (forced ? batch_tiles_usable(x, M) : batch_tiles_run(x, M)) {
    gguf::with_format(w.format, [&](auto block) {
      if constexpr (has_layout<decltype(block)>()) {
        if (M == 8) return batch::matmul<decltype(block), 8>(w, x, M, y, ldy, n0, n1);  // the step's batches
        batch::matmul<decltype(block)>(w, x, M, y, ldy, n0, n1);
      }
    });
    return;
  }
#endif
  (void)forced;
  matvec(w, x, M, y, ldy, n0, n1, descending);
}

inline int64_t batch_tile_calls() {
#if defined(VOXLANE_R16_TILES)
  return batch::calls.load();
#endif
  return -1;
}

}  // namespace voxlane::r16
