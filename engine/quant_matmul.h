// Matrix-vector products straight from a weight format's blocks (engine/gguf_blocks.h), for up
// to 8 activation rows at once, fp32 activations and fp32 accumulation: the result is the exact
// product with the file's dequantized weights (only the summation order differs).
//
// Why this shape: at batch 1-8 a linear layer's cost is reading its weights, so each block is
// read once, expanded to fp32 in registers (never written out) and multiplied into every
// activation row while it is there. R weight rows x MB activation rows of accumulators, chosen so
// they fit AVX2's 16 registers: 4 x 1, 4 x 2, 2 x 3, 2 x 4, then 1 x 5..8.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "gemv512.h"
#include "gguf_blocks.h"
#include "prefill_gemm.h"

namespace voxlane {

// One weight matrix as the kernels see it: rows x cols weights, each row ``row_bytes`` of blocks.
struct QWeight {
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0, row_bytes = 0;
  int64_t format = gguf::F32;
  const float* row_scale = nullptr;  // I8: one scale per row
  const float* bias = nullptr;       // [rows] or null
};

#if defined(VOXLANE_AVX2)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// sums[m * R + r] = dot(x row m, weight row r) for R consecutive weight rows starting at w.
template <class B, int R, int MB>
inline void dot_rows(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const float* x, int64_t ldx,
                     float* sums) {
#if defined(VOXLANE_AVX2)
  __m256 acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = _mm256_setzero_ps();
  const int64_t ahead = prefetch_distance(R * row_bytes);
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const float* xb = x + blk * B::QK;
    for (int r = 0; r < R; ++r) {
      const uint8_t* wb = w + r * row_bytes + blk * B::BYTES;
      for (int line = 0; line < B::BYTES; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(wb + ahead + line), _MM_HINT_T0);
      B::expand(wb, [&](int g, __m256 wv) {
        for (int m = 0; m < MB; ++m) acc[r][m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xb + m * ldx + 8 * g), acc[r][m]);
      });
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) sums[m * R + r] = hsum(acc[r][m]);
#else
  float block[B::QK];
  for (int i = 0; i < R * MB; ++i) sums[i] = 0.f;
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    for (int r = 0; r < R; ++r) {
      B::dequant(w + r * row_bytes + blk * B::BYTES, block);
      for (int m = 0; m < MB; ++m) {
        const float* xb = x + m * ldx + blk * B::QK;
        float s = 0.f;
        for (int i = 0; i < B::QK; ++i) s += block[i] * xb[i];
        sums[m * R + r] += s;
      }
    }
  }
#endif
}

// Weight rows [n0, n1) in groups of R, then one by one: dot(rows, first row's bytes, sums) with rows
// an std::integral_constant (R or 1) fills sums[m * rows + r]; stored as y[m, n] = sum * row_scale + bias.
template <int R, int MB, class Dot>
inline void row_groups(const QWeight& w, float* y, int64_t ldy, int64_t n0, int64_t n1, Dot&& dot) {
  float sums[R * MB];
  int64_t n = n0;
  auto store = [&](int64_t row, int rr, int r_count) {
    const float scale = w.row_scale ? w.row_scale[row] : 1.f, bias = w.bias ? w.bias[row] : 0.f;
    for (int m = 0; m < MB; ++m) y[m * ldy + row] = sums[m * r_count + rr] * scale + bias;
  };
  for (; n + R <= n1; n += R) {
    dot(std::integral_constant<int, R>{}, w.data + n * w.row_bytes, sums);
    for (int r = 0; r < R; ++r) store(n + r, r, R);
  }
  for (; n < n1; ++n) {
    dot(std::integral_constant<int, 1>{}, w.data + n * w.row_bytes, sums);
    store(n, 0, 1);
  }
}

template <class B, int R, int MB>
inline void rows_times(const QWeight& w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t nblocks = w.cols / B::QK;
  row_groups<R, MB>(w, y, ldy, n0, n1, [&](auto rows, const uint8_t* p, float* sums) {
    dot_rows<B, decltype(rows)::value, MB>(p, w.row_bytes, nblocks, x, ldx, sums);
  });
}

#if defined(VOXLANE_GEMM)
// 2 <= M <= 8 rows of x for the formats with gemm::Wide (prefill_gemm.h's wide_rows: weights expanded
// in 512-bit registers): 4 weight rows x M (M <= 4) or 2 x M (16 accumulators at most).
template <class B, int R, int MB>
inline void wide_times(const QWeight& w, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t nblocks = w.cols / B::QK;
  row_groups<R, MB>(w, y, ldy, n0, n1, [&](auto rows, const uint8_t* p, float* sums) {
    gemm::wide_rows<B, decltype(rows)::value, MB>(p, w.row_bytes, nblocks, x, ldx, sums);
  });
}

template <class B>
inline void wide_matvec(const QWeight& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, int64_t n0,
                        int64_t n1) {
  with_rows<2, 8>(M, [&](auto rows) {  // 4 weight rows x up to 4 activation rows, else 2 x up to 8
    constexpr int MB = decltype(rows)::value;
    wide_times<B, MB <= 4 ? 4 : 2, MB>(w, x, ldx, y, ldy, n0, n1);
  });
}
#endif

// One activation row with gemv512.h's 512-bit kernels (formats where gemv512::has<B>()).
template <class B>
inline void rows_times_512(const QWeight& w, const float* x, float* y, int64_t n0, int64_t n1) {
#if defined(VOXLANE_GEMV512)
  constexpr int R = 4;
  if constexpr (std::is_same_v<B, gguf::BlockI8>) {
    row_groups<R, 1>(w, y, 0, n0, n1, [&](auto rows, const uint8_t* p, float* sums) {
      gemv512::dot_rows_i8<decltype(rows)::value>(p, w.row_bytes, w.cols, x, sums);
    });
  } else {
    using V = gemv512::Values<B>;
    const int64_t nblocks = w.cols / B::QK;
    gemv512::Scratch& s = gemv512::scratch();
    if constexpr (V::kMin) {  // per block of x: sum(x)
      s.xsum.resize(nblocks);
      for (int64_t b = 0; b < nblocks; ++b)
        s.xsum[b] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(x + 32 * b), _mm512_loadu_ps(x + 32 * b + 16)));
    }
    s.group.build(R, w.row_bytes, nblocks, B::BYTES, V::kD);
    s.single.build(1, w.row_bytes, nblocks, B::BYTES, V::kD);
    if (static_cast<int64_t>(s.scales.size()) < 2 * s.group.padded) s.scales.resize(2 * s.group.padded);
    row_groups<R, 1>(w, y, 0, n0, n1, [&](auto rows, const uint8_t* p, float* sums) {
      constexpr int r = decltype(rows)::value;
      gemv512::dot_rows<B, r>(p, w.row_bytes, nblocks, x, s.xsum.data(), r == R ? s.group : s.single, s.scales.data(), sums);
    });
  }
#else
  (void)w, (void)x, (void)y, (void)n0, (void)n1;
#endif
}

// y[m, n] = x[m, :] . W[n, :] (* row_scale[n]) + bias[n] for rows n in [n0, n1) and M <= 8 rows of
// x (row stride ldx; y's row stride ldy). Single-threaded: callers split [0, rows) among threads.
template <class B>
inline void matvec_format(const QWeight& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, int64_t n0,
                          int64_t n1) {
  if constexpr (gemv512::has<B>())
    if (M == 1) return rows_times_512<B>(w, x, y, n0, n1);
  switch (M) {
    case 1: rows_times<B, 4, 1>(w, x, ldx, y, ldy, n0, n1); break;
    case 2: rows_times<B, 4, 2>(w, x, ldx, y, ldy, n0, n1); break;
    case 3: rows_times<B, 2, 3>(w, x, ldx, y, ldy, n0, n1); break;
    case 4: rows_times<B, 2, 4>(w, x, ldx, y, ldy, n0, n1); break;
    case 5: rows_times<B, 1, 5>(w, x, ldx, y, ldy, n0, n1); break;
    case 6: rows_times<B, 1, 6>(w, x, ldx, y, ldy, n0, n1); break;
    case 7: rows_times<B, 1, 7>(w, x, ldx, y, ldy, n0, n1); break;
    default: rows_times<B, 1, 8>(w, x, ldx, y, ldy, n0, n1); break;
  }
}

// Any M: groups of 8 rows of x (each group re-reads the weights); a prompt chunk of more rows goes
// through prefill_gemm.h's GEMM where the machine has AVX-512 (each weight expanded once per task).
// `pack`: x's bf16 tiles for the AMX path (prefill_gemm.h's XPack), kept by the caller across calls with
// the same x; null: packed per call. `bf16x` (EngineConfig.bf16_activations): from kBf16MinRows rows on
// (prompt chunks) the formats that have the bf16-activation tiles (bf16x_tiles) multiply x rounded to
// bf16 there; fewer rows (decoding batches) keep fp32 activations.
inline void matvec(const QWeight& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, int64_t n0,
                   int64_t n1, XPack* pack = nullptr, bool bf16x = false) {
  gguf::with_format(w.format, [&](auto block) {
    using B = decltype(block);
#if defined(VOXLANE_GEMM)
    if (M >= kGemmMinRows)
      return gemm_format<B>(w.data, w.row_bytes, w.cols, w.row_scale, w.bias, x, M, ldx, y, ldy, n0, n1, pack, bf16x);
    if constexpr (gemm::Wide<B>::ok) {  // 2-8 rows: 512-bit, weights expanded in registers (prefill_gemm.h)
      if (M >= 2) return wide_matvec<B>(w, x, M, ldx, y, ldy, n0, n1);
    }
#endif
    (void)pack;
    (void)bf16x;
    for (int64_t m = 0; m < M; m += 8)
      matvec_format<B>(w, x + m * ldx, M - m < 8 ? M - m : 8, ldx, y + m * ldy, ldy, n0, n1);
  });
}

// Row ``row`` of the weight, dequantized into out[cols] (the embedding lookup).
inline void dequant_row(const QWeight& w, int64_t row, float* out) {
  gguf::with_format(w.format, [&](auto block) {
    using B = decltype(block);
    const uint8_t* p = w.data + row * w.row_bytes;
    for (int64_t b = 0; b < w.cols / B::QK; ++b) B::dequant(p + b * B::BYTES, out + b * B::QK);
  });
  if (w.row_scale)
    for (int64_t i = 0; i < w.cols; ++i) out[i] *= w.row_scale[row];
}

// Block geometry of a format: (weights per block, bytes per block); (0, 0) if unknown.
inline void block_geometry(int64_t format, int64_t& qk, int64_t& bytes) {
  qk = bytes = 0;
  gguf::with_format(format, [&](auto block) {
    qk = decltype(block)::QK;
    bytes = decltype(block)::BYTES;
  });
}

}  // namespace voxlane
