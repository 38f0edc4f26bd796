// The prompt path's matrix product: y[m, n] = x[m, :] . W[n, :] for many activation rows at once
// (a prefill chunk: tens to hundreds of rows), fp32 activations and accumulation, weights in any
// format of gguf_blocks.h. The result is the exact product with the file's dequantized weights (only
// the summation order differs), like quant_matmul.h's small-batch path.
//
// Why a second path: quant_matmul.h is built for 1-8 rows, where reading the weights is the cost:
// each block is expanded to fp32 in registers and multiplied into at most 8 rows, so a chunk of 43
// rows expands every weight 6 times and runs 256-bit FMAs whose other operand is a load (1 weight
// row x 8 activation rows). Here a task's weight rows are expanded once into an fp32 buffer (thread
// local, L2-sized: 16-32 rows x K), then a register tile of 4 weight rows x 6 activation rows
// (24 accumulators of 16 lanes) runs over K with 512-bit FMAs: per 16 k, 10 loads for 24 FMAs, so
// the FMA units, not the loads, set the pace. The 4 x 6 sums are reduced 4 at a time (one
// vector of the 4 weight rows' sums per activation row). AVX-512F only; elsewhere matvec keeps the
// small-batch path for every M.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "gguf_blocks.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(VOXLANE_AVX2)
#define VOXLANE_GEMM 1
#endif

namespace voxlane {

// Activation rows above which matvec uses the GEMM (at <= 8 rows the weights are read once anyway).
constexpr int64_t kGemmMinRows = 9;

#if defined(VOXLANE_GEMM)
namespace gemm {

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
  switch (mb) {
    case 1: return tile<R, 1>(w, ldw, x, ldx, K, sums);
    case 2: return tile<R, 2>(w, ldw, x, ldx, K, sums);
    case 3: return tile<R, 3>(w, ldw, x, ldx, K, sums);
    case 4: return tile<R, 4>(w, ldw, x, ldx, K, sums);
    case 5: return tile<R, 5>(w, ldw, x, ldx, K, sums);
    default: return tile<R, kM>(w, ldw, x, ldx, K, sums);
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

// y[m, n] = (x[m, :] . W[n, :]) * row_scale[n] + bias[n] for rows n in [n0, n1) and all M rows of
// x (row stride ldx; y's ldy). Single-threaded: callers split [0, N) among threads.
template <class B>
inline void gemm_format(const uint8_t* data, int64_t row_bytes, int64_t K, const float* row_scale, const float* bias,
                        const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, int64_t n0, int64_t n1) {
  thread_local std::vector<float> expanded;
  if (!std::is_same_v<B, gguf::BlockF32> && static_cast<int64_t>(expanded.size()) < gemm::kPanel * K)
    expanded.resize(gemm::kPanel * K);
  float sums[gemm::kR * gemm::kM];
  for (int64_t p0 = n0; p0 < n1; p0 += gemm::kPanel) {  // a panel of weight rows, expanded once
    const int64_t p1 = std::min(n1, p0 + gemm::kPanel);
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

}  // namespace voxlane
