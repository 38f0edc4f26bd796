// The pieces of a decode step shared by the per-op kernels (kernels.cpp) and the one-call step
// (decode_step.cpp): RMSNorm of a row, a vectorizing exp, RoPE of one head, and the attention of one
// (sequence, kv head) over its cache slot. The cache's element type KV is float or kv::Half
// (kv_element.h): keys and values are rounded to it where they are written and read back as fp32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "count_dispatch.h"
#include "kv_element.h"
#include "prefill_gemm.h"  // gemm::hsum4 (AVX-512)

namespace voxlane {

inline void rms_row(const float* in, const float* weight, double eps, int64_t D, float* out) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < D; ++i) ss += in[i] * in[i];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(D) + static_cast<float>(eps));
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) out[i] = in[i] * inv * weight[i];
}

// ---- exp that vectorizes ------------------------------------------------------------------------------
// std::exp in a loop stays scalar without -ffast-math (glibc declares its vector variants only then),
// and -ffast-math would also drop the infinities the softmax relies on. Cephes' expf instead:
// e^x = 2^n * e^r with |r| <= ln2/2 and a degree-6 polynomial, ~1 ulp, plain arithmetic that
// `omp simd` loops turn into AVX-512 code. n is rounded by adding and subtracting 1.5 * 2^23
// (std::floor does not vectorize under IEEE trapping rules).
#pragma omp declare simd notinbranch
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.3f), 88.7f);
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n as a float's exponent field
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// o[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i] for i < n (SwiGLU's product): e^-g for up to 64
// values first, then one division each. Why: with fast_exp inlined into the division gcc divided in each
// of its range's branches (three vdivps per 16 values, ~16 cycles each: ~3 % of a prompt's CPU at 43
// tokens); the same operations in two loops give the same values with one.
inline void silu_mul_into(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t i0 = 0; i0 < n; i0 += 64) {
    const int64_t m = std::min<int64_t>(64, n - i0);
    alignas(64) float e[64];
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) e[i] = fast_exp(-g[i0 + i]);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) o[i0 + i] = g[i0 + i] / (1.f + e[i]) * u[i0 + i];
  }
}

// RoPE of one head (HF's rotate-half convention; the sign is folded into sin). With 512-bit vectors
// (half a multiple of 16) the same FMAs as gcc's scalar loop (which stays scalar: out may alias x for
// all it knows): out[i] = fma(x[i], cos[i], x[i + half] sin[i]), out[i + half] = fma(x[i + half],
// cos[i + half], x[i] sin[i + half]).
inline void rope_into(const float* x, const float* cos, const float* sin, int64_t d, float* out) {
  const int64_t half = d / 2;
#if defined(__AVX512F__)
  if (half % 16 == 0) {
    for (int64_t i = 0; i < half; i += 16) {
      const __m512 lo = _mm512_loadu_ps(x + i), hi = _mm512_loadu_ps(x + i + half);
      _mm512_storeu_ps(out + i,
                       _mm512_fmadd_ps(lo, _mm512_loadu_ps(cos + i), _mm512_mul_ps(hi, _mm512_loadu_ps(sin + i))));
      _mm512_storeu_ps(out + i + half, _mm512_fmadd_ps(hi, _mm512_loadu_ps(cos + i + half),
                                                       _mm512_mul_ps(lo, _mm512_loadu_ps(sin + i + half))));
    }
    return;
  }
#endif
  for (int64_t i = 0; i < half; ++i) {
    out[i] = x[i] * cos[i] + x[i + half] * sin[i];
    out[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
  }
}

// One new token per sequence attending its cache slot: shapes as in kernels.cpp's decode_attention.
// RoPE on the new q and k, the new k and v written at (slot, kv head, position), then each of the
// R query heads that share the kv head attends keys 0..position of its own slot (the last `window`
// of them when window > 0: Mistral's sliding window). No mask and no padding.
template <class KV>
struct AttentionArgs {
  const float* qkv;  // [B, (H + 2 Hkv) d]
  const float *cos, *sin;  // [B, d]
  KV *k_cache, *v_cache;  // [S, Hkv, L, d] (one layer's)
  const int64_t *slots, *positions;  // [B]
  float* out;  // [B, H d]
  int64_t H, Hkv, d, L, window;
  int64_t row = (H + 2 * Hkv) * d;
  float scale = 1.f / std::sqrt(static_cast<float>(d));
};

// A task's attended keys and values (attended_kv), and as attend's `next`, those of the task a thread likely
// takes next (null: none), whose lines attend asks for into L2 while it computes (spread over its loops: key
// block j's while it scores its own block j, value j's while it weighs its own value j). Why: a decoding
// batch's attention read its keys and values cold (perf of an 8-row step: ~60 % of attend's own samples on
// the values' loads) and serially with its arithmetic: the lines of a whole layer touched during the qkv
// phase took attention from ~2.4 to ~1.3 ms CPU a step and added ~1.1 to qkv (one thread). Spread like this,
// one thread at positions 40-104, alternating runs: attention 1.69-1.94 ms CPU against 2.27-2.70 without
// (docs/engine.md, sixteenth session).
template <class KV>
struct TaskKV {
  const KV *keys = nullptr, *values = nullptr;
  int64_t n_keys = 0;
};

// The lines of positions [j0, j1) of rows (d values each) `rows`, asked for into L2 (prefetcht2: this host's
// prefetcht1 did not fetch the lines for the attention that read them; t2 and t0 did).
template <class KV>
inline void prefetch_rows(const KV* rows, int64_t j0, int64_t j1, int64_t d) {
  constexpr int64_t kLine = 64 / sizeof(KV);
  for (int64_t o = j0 * d; o < j1 * d; o += kLine) __builtin_prefetch(rows + o, 0, 1);  // locality 1: prefetcht2
}

struct AttentionScratch {
  std::vector<float> q, scores, inv_total;  // q [R, d], scores [R, n_keys]
  std::vector<float> k, v;  // a prompt task's keys and values widened from an fp16 cache: [n_keys, d] each
};

// Row b's new key of kv head g, RoPE'd, written at (slot, g, position) (an fp16 cache: RoPE'd in fp32,
// then rounded once); its new value copied (rounded) likewise.
template <class KV>
inline void write_k(const AttentionArgs<KV>& a, int64_t b, int64_t g) {
  const int64_t d = a.d;
  KV* key = a.k_cache + ((a.slots[b] * a.Hkv + g) * a.L + a.positions[b]) * d;
  const float* src = a.qkv + b * a.row + (a.H + g) * d;
  if constexpr (std::is_same_v<KV, float>) {
    rope_into(src, a.cos + b * d, a.sin + b * d, d, key);
  } else {
    thread_local std::vector<float> rotated;
    rotated.resize(d);
    rope_into(src, a.cos + b * d, a.sin + b * d, d, rotated.data());
    kv::store(rotated.data(), d, key);
  }
}
template <class KV>
inline void write_v(const AttentionArgs<KV>& a, int64_t b, int64_t g) {
  const int64_t d = a.d;
  kv::store(a.qkv + b * a.row + (a.H + a.Hkv + g) * d, d, a.v_cache + ((a.slots[b] * a.Hkv + g) * a.L + a.positions[b]) * d);
}

// Task t = (row b, kv head g) = (t / Hkv, t % Hkv): both.
template <class KV>
inline void write_kv(const AttentionArgs<KV>& a, int64_t t) {
  write_k(a, t / a.Hkv, t % a.Hkv);
  write_v(a, t / a.Hkv, t % a.Hkv);
}

// The first maximum of x[0, n) (its index first + i) as a key that orders as numpy's and torch's argmax
// choose: a larger value is a larger key, of equal values (-0 equals 0) the earlier index, and a NaN
// is above every number (the first NaN wins). The LM head's tasks find their rows' keys while the
// logits are in cache; the step keeps the largest (a greedy sampler then reads no logits). 0: none.
inline uint64_t argmax_key(const float* x, int64_t n, int64_t first) {
  if (n <= 0) return 0;
  int64_t at = -1;  // a NaN's index
  float top = -INFINITY;
  int64_t i = 0;
#if defined(VOXLANE_GEMM)
  __m512 top16 = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    top16 = _mm512_max_ps(top16, v);
  }
  if (!nan) top = _mm512_reduce_max_ps(top16);
  else i = 0;  // a NaN: the scalar loop finds the first
#endif
  for (; i < n && at < 0; ++i) {
    if (std::isnan(x[i])) at = i;
    else top = std::max(top, x[i]);
  }
  uint32_t order = 0xffffffffu;  // a NaN's
  if (at < 0) {  // the first of the maximum (top: a value of x, not a NaN)
    at = 0;
#if defined(VOXLANE_GEMM)
    const __m512 wanted = _mm512_set1_ps(top);
    __mmask16 equal = 0;
    for (; at + 16 <= n && !(equal = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + at), wanted, _CMP_EQ_OQ)); at += 16) {}
    if (equal) at += __builtin_ctz(equal);
#endif
    while (x[at] != top) ++at;
    const float value = top + 0.f;     // -0 -> 0
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    order = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
  }
  return (uint64_t(order) << 32) | (0xffffffffu - uint32_t(first + at));
}

// The index of a key of argmax_key.
inline int64_t argmax_index(uint64_t key) { return int64_t(0xffffffffu - uint32_t(key)); }

#if defined(VOXLANE_GEMM)
// Attention's two products with 512-bit vectors, for a long row of keys (a prompt's rows attend up
// to all of its keys; the plain loops above reduce each 64-value dot product to a float on its own
// and add every weighted value into memory).
// scores[r * n_keys + j] = q_r . key_j * scale for the first n_keys - n_keys % 16 keys, 16 at a time:
// 16 dot products kept as vectors, reduced 4 at a time (gemm::hsum4). -> the keys done.
template <int D16, class KV>
inline void scores_by_16(const float* q, int64_t R, const KV* keys, int64_t n16, float scale, float* scores,
                         int64_t n_keys, const TaskKV<KV>& next) {
  constexpr int64_t d = 16 * D16;
  const __m128 s = _mm_set1_ps(scale);
  for (int64_t r = 0; r < R; ++r) {
    __m512 qv[D16];
    for (int c = 0; c < D16; ++c) qv[c] = _mm512_loadu_ps(q + r * d + 16 * c);
    for (int64_t j0 = 0; j0 < n16; j0 += 16) {
      if (r == 0 && next.keys && j0 < next.n_keys) prefetch_rows(next.keys, j0, std::min(j0 + 16, next.n_keys), d);
      __m512 acc[16];
#pragma GCC unroll 16
      for (int jj = 0; jj < 16; ++jj) {
        const KV* key = keys + (j0 + jj) * d;
        acc[jj] = _mm512_mul_ps(qv[0], kv::load16(key));
        for (int c = 1; c < D16; ++c) acc[jj] = _mm512_fmadd_ps(qv[c], kv::load16(key + 16 * c), acc[jj]);
      }
      for (int k = 0; k < 4; ++k)
        _mm_storeu_ps(scores + r * n_keys + j0 + 4 * k,
                      _mm_mul_ps(gemm::hsum4(acc[4 * k], acc[4 * k + 1], acc[4 * k + 2], acc[4 * k + 3]), s));
    }
  }
}

// (d = 16 D16 a compile-time size, so a block's 16 accumulators stay in registers.)
template <class KV>
inline int64_t scores_by_16(const float* q, int64_t R, const KV* keys, int64_t n_keys, int64_t d, float scale,
                            float* scores, const TaskKV<KV>& next = {}) {
  const int64_t n16 = n_keys / 16 * 16;
  if (next.keys && n16 < next.n_keys) prefetch_rows(next.keys, n16, next.n_keys, d);  // the keys past this task's blocks
  switch (d / 16) {
    case 1: scores_by_16<1>(q, R, keys, n16, scale, scores, n_keys, next); break;
    case 2: scores_by_16<2>(q, R, keys, n16, scale, scores, n_keys, next); break;
    case 3: scores_by_16<3>(q, R, keys, n16, scale, scores, n_keys, next); break;
    case 4: scores_by_16<4>(q, R, keys, n16, scale, scores, n_keys, next); break;
    case 5: scores_by_16<5>(q, R, keys, n16, scale, scores, n_keys, next); break;
    case 6: scores_by_16<6>(q, R, keys, n16, scale, scores, n_keys, next); break;
    case 7: scores_by_16<7>(q, R, keys, n16, scale, scores, n_keys, next); break;
    default: scores_by_16<8>(q, R, keys, n16, scale, scores, n_keys, next); break;
  }
  return n16;
}

// scores[r * n_keys + j] for the last keys j0..n_keys-1 (1 to 15 of them, after scores_by_16's) exactly
// as attend's plain loop computes each on its own (gcc's `omp simd` reduction for d a multiple of 16:
// lane l = sum over c of q[16 c + l] key[16 c + l] by FMAs from 0, then 0 + lane 0 + lane 1 + ... +
// lane 15 one add at a time, times scale), with the keys in the lanes: the keys' lane vectors
// transposed, then the 16 adds as vectors. Why: one at a time, each dot product waited out 16
// dependent adds (~10 % of a decoding row's attention in cache at ~100 keys, perf). Checked bit-equal
// to the loop's scores through decode_attention and prompt_attention (784 cases, d = 32-128, 1-299
// keys, a build of each; the loop's order is gcc's, so another compiler may round these keys otherwise).
template <class KV>
inline void scores_tail(const float* q, int64_t R, const KV* keys, int64_t j0, int64_t n_keys, int64_t d,
                        float scale, float* scores) {
  const int n = static_cast<int>(n_keys - j0);
  const __mmask16 keys_in = static_cast<__mmask16>((1u << n) - 1);
  const int64_t chunks = d / 16;
  for (int64_t r = 0; r < R; ++r) {
    __m512 lanes[16];
    for (int jj = 0; jj < 16; ++jj) {
      lanes[jj] = _mm512_setzero_ps();
      if (jj >= n) continue;
      const KV* key = keys + (j0 + jj) * d;
      for (int64_t c = 0; c < chunks; ++c)
        lanes[jj] = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * d + 16 * c), kv::load16(key + 16 * c), lanes[jj]);
    }
    gemm::transpose16(lanes);  // lanes[l]: lane l of every key
    __m512 dot = _mm512_setzero_ps();
    for (int l = 0; l < 16; ++l) dot = _mm512_add_ps(dot, lanes[l]);
    _mm512_mask_storeu_ps(scores + r * n_keys + j0, keys_in, _mm512_mul_ps(dot, _mm512_set1_ps(scale)));
  }
}

// The largest of x[0..n) (n >= 1) as std::max_element finds it (its value: a NaN counts only as x[0]),
// 16 at a time: vmaxps(x, m) keeps m where x is NaN. (Equal zeros of either sign may give the other's
// sign; the softmax's x - top and fast_exp give the same for both.) Why: std::max_element is a chain of
// dependent scalar maxima (perf: ~17 % of a decoding row's attention in cache at ~100 keys).
inline float max_of(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + j), m);
  if (j < n) m = _mm512_max_ps(_mm512_mask_loadu_ps(m, static_cast<__mmask16>((1u << (n - j)) - 1), x + j), m);
  return std::isnan(x[0]) ? x[0] : _mm512_reduce_max_ps(m);
}

// out[r] = sum_j p[r][j] / total[r] * value_j for the R heads (d = 16 * D16), the outputs of up to
// 20 / D16 heads held in registers while the values pass once.
template <int D16, class KV>
inline void weigh_values(const AttentionScratch& scratch, int64_t R, int64_t n_keys, const KV* values, float* out,
                         const TaskKV<KV>& next = {}) {
  if (next.values) prefetch_rows(next.values, std::min(n_keys, next.n_keys), next.n_keys, 16 * D16);  // past this task's
  constexpr int kHeads = D16 == 4 ? 5 : 2;
  for (int64_t r0 = 0; r0 < R; r0 += kHeads) {
    const int heads = static_cast<int>(std::min<int64_t>(kHeads, R - r0));
    __m512 acc[kHeads][D16];
    for (int h = 0; h < kHeads; ++h)
      for (int c = 0; c < D16; ++c) acc[h][c] = _mm512_setzero_ps();
    const float* p[kHeads];
    for (int h = 0; h < heads; ++h) p[h] = scratch.scores.data() + (r0 + h) * n_keys;
    for (int64_t j = 0; j < n_keys; ++j) {
      if (r0 == 0 && j < next.n_keys) prefetch_rows(next.values, j, j + 1, 16 * D16);
      __m512 v[D16];
      for (int c = 0; c < D16; ++c) v[c] = kv::load16(values + j * 16 * D16 + 16 * c);
      for (int h = 0; h < heads; ++h) {
        const __m512 w = _mm512_set1_ps(p[h][j]);
        for (int c = 0; c < D16; ++c) acc[h][c] = _mm512_fmadd_ps(w, v[c], acc[h][c]);
      }
    }
    for (int h = 0; h < heads; ++h) {
      const __m512 inv = _mm512_set1_ps(scratch.inv_total[r0 + h]);
      for (int c = 0; c < D16; ++c) _mm512_storeu_ps(out + (r0 + h) * 16 * D16 + 16 * c, _mm512_mul_ps(acc[h][c], inv));
    }
  }
}
#endif

// Task t's (row b, kv head g) attended keys and values: positions first..position of the row's slot (first >
// 0 only under a sliding window), for attend, its prefetches and the next task's.
template <class KV>
inline TaskKV<KV> attended_kv(const AttentionArgs<KV>& a, int64_t t) {
  const int64_t b = t / a.Hkv, g = t % a.Hkv, pos = a.positions[b];
  const int64_t first = a.window > 0 ? std::max<int64_t>(0, pos + 1 - a.window) : 0;
  const int64_t offset = ((a.slots[b] * a.Hkv + g) * a.L + first) * a.d;
  return {a.k_cache + offset, a.v_cache + offset, pos + 1 - first};
}

// The first line of each 4 KB page of the keys and values that task t = (row b, kv head g) attends
// (positions first..position of its slot; attend's), asked for ahead: the keys into L1 when `now` (the
// task starts), else into L2 as its values. Why: a decoding row's task reads two streams of ~28 KB (its
// keys, then its values) that are not in any cache (the weights streamed since this layer's keys were
// last read), and the hardware's prefetcher starts again at each page: a decoding batch of 8 rows read
// SmolLM2's 1.33 MB a layer at ~10 GB/s against ~3x that rate hot. With the pages of a task's and of
// the next task's streams asked for at its start, 0.85-0.94x the time per layer (docs/engine.md's
// eleventh session; 24 tasks at positions 50-170, cold, one thread).
template <class KV>
inline void prefetch_kv_pages(const AttentionArgs<KV>& a, int64_t t, bool now) {
  const TaskKV<KV> kv = attended_kv(a, t);
  const int64_t n = kv.n_keys * a.d;
  constexpr int64_t kPage = 4096 / sizeof(KV);
  for (int64_t o = 0; o < n; o += kPage) {
    if (now) __builtin_prefetch(kv.keys + o, 0, 3);  // T0
    else __builtin_prefetch(kv.keys + o, 0, 2);     // T1
    __builtin_prefetch(kv.values + o, 0, 2);
  }
}

// Task t = (row b, kv head g): the R query heads of the row that share kv head g attend keys
// first..position of the row's slot (written before: by earlier steps, or by write_kv for every
// row of this call, which is what makes a prompt chunk's rows causal), each key and value read
// once for all R heads; or only heads [first_head, end_head) of the R (a decode step on several
// threads splits a group's heads over tasks: 3 groups of 3 heads are 9 tasks).
// out_row: where row b's outputs go (its H d values; null: row b of a.out).
template <class KV>
inline void attend(const AttentionArgs<KV>& a, int64_t t, AttentionScratch& scratch, int64_t first_head = 0,
                   int64_t end_head = -1, float* out_row = nullptr, const TaskKV<KV>& next = {}) {
  const int64_t H = a.H, Hkv = a.Hkv, d = a.d, R = (end_head < 0 ? H / Hkv : end_head) - first_head;
  scratch.q.resize(R * d);
  scratch.inv_total.resize(R);
  const int64_t b = t / Hkv, g = t % Hkv;
  const TaskKV<KV> kv = attended_kv(a, t);
  const int64_t n_keys = kv.n_keys;
  const KV *keys = kv.keys, *values = kv.values;  // the n_keys attended: positions first..pos
  const float* src = a.qkv + b * a.row;
  const float *c = a.cos + b * d, *s = a.sin + b * d;
  // HF's grouping: query head h = g * (H / Hkv) + r uses kv head g; this task's are r = first_head + 0..R-1.
  const int64_t h0 = g * (H / Hkv) + first_head;
  for (int64_t r = 0; r < R; ++r) rope_into(src + (h0 + r) * d, c, s, d, scratch.q.data() + r * d);
  scratch.scores.resize(R * n_keys);
  int64_t j0 = 0;
#if defined(VOXLANE_GEMM)
  if (d % 16 == 0 && d <= 128) {
    j0 = scores_by_16(scratch.q.data(), R, keys, n_keys, d, a.scale, scratch.scores.data(), next);
    if (j0 < n_keys) scores_tail(scratch.q.data(), R, keys, j0, n_keys, d, a.scale, scratch.scores.data());
    j0 = n_keys;
  }
#endif
  for (int64_t j = j0; j < n_keys; ++j) {
    const KV* key = keys + j * d;
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = scratch.q.data() + r * d;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < d; ++i) dot += qr[i] * kv::to_float(key[i]);
      scratch.scores[r * n_keys + j] = dot * a.scale;
    }
  }
  for (int64_t r = 0; r < R; ++r) {  // softmax numerators and 1 / sum, per head
    float* row_scores = scratch.scores.data() + r * n_keys;
#if defined(VOXLANE_GEMM)
    const float top = max_of(row_scores, n_keys);
#else
    const float top = *std::max_element(row_scores, row_scores + n_keys);
#endif
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < n_keys; ++j) total += (row_scores[j] = fast_exp(row_scores[j] - top));
    scratch.inv_total[r] = 1.f / total;
  }
  float* out = (out_row ? out_row : a.out + b * H * d) + h0 * d;  // [R, d]: the group's heads are adjacent in y
#if defined(VOXLANE_GEMM)
  if (d == 64 || d == 128) return d == 64 ? weigh_values<4>(scratch, R, n_keys, values, out, next)
                                          : weigh_values<8>(scratch, R, n_keys, values, out, next);
#endif
  std::fill(out, out + R * d, 0.f);
  for (int64_t j = 0; j < n_keys; ++j) {
    const KV* value = values + j * d;
    for (int64_t r = 0; r < R; ++r) {
      const float p = scratch.scores[r * n_keys + j] * scratch.inv_total[r];
      float* out_r = out + r * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) out_r[i] += p * kv::to_float(value[i]);
    }
  }
}

// A prompt chunk's rows share their keys: rows b0..b0+n-1 (n <= 16) of one slot at consecutive positions
// p0..p0+n-1 attend together, row m over keys 0..p0+m (kv head g, its R query heads), each key and value
// read once for the n rows of each head instead of once per row. Lanes are the rows: a head's queries
// transposed to q[i][m] (RoPE'd), so a key's score for 16 rows is d FMAs with the key's values broadcast,
// 16 keys at a time in 16 accumulators; no horizontal sums (scores_by_16 reduces each dot product); the
// scores stay [key][row] for the softmax (per lane) and the weighted values (out[i][m] += p[j][m] v_j[i],
// 16 dims at a time, transposed into the rows at the end). The same products and exp as attend, in
// another addition order (float tolerance). Where it does not apply (window cuts keys, d not a multiple
// of 16 or > 128, fewer than kBlockMinRows rows), attend per row.
// keys, values: the slot's [n_keys, d] of kv head g as fp32 (attend_rows: the cache's own, or widened).
// out: where row b0's outputs go (its H d values, the next rows' H d apart; null: row b0 of a.out).
// A row's results are its lane's alone: the same for any n and any lane (the keys after its position
// masked add exact zeros to its sums), so a row attended on its own (n = 1) equals it attended in a block.
constexpr int64_t kBlockMinRows = 4;
#if defined(VOXLANE_GEMM)

// r[i] = column i of the 16 x 16 floats whose row i was r[i] (unpacks within 128-bit lanes, then lanes
// exchanged twice: 64 shuffles). attend_rows16's queries into lanes and its outputs back into rows. Why:
// those transposes were scalar (a load and a store per value, 2 x 3,072 a 16-row task of SmolLM2's).
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // t[2i], t[2i+1]: rows 2i and 2i+1 interleaved, per 128-bit lane
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i+j]: rows 4i..4i+3 of column 4k+j in each lane k
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
  }
}

template <class KV>
inline void attend_rows16(const AttentionArgs<KV>& a, int64_t b0, int64_t n, int64_t g, const float* keys,
                          const float* values, AttentionScratch& scratch, float* out = nullptr) {
  if (!out) out = a.out + b0 * a.H * a.d;
  const int64_t H = a.H, Hkv = a.Hkv, d = a.d, R = H / Hkv, h0 = g * R;
  const int64_t p0 = a.positions[b0], n_keys = p0 + n;
  scratch.q.resize(R * d * 16);  // [R][d][16 rows]: every value written below (rows n.. 0)
  scratch.scores.resize(n_keys * 16);  // one head's [n_keys][16 rows]
  alignas(64) float heads[16][128];  // one query head's RoPE'd rows (rows n.. 0)
  for (int64_t m = n; m < 16; ++m) std::fill_n(heads[m], d, 0.f);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t m = 0; m < n; ++m)
      rope_into(a.qkv + (b0 + m) * a.row + (h0 + r) * d, a.cos + (b0 + m) * d, a.sin + (b0 + m) * d, d, heads[m]);
    for (int64_t i0 = 0; i0 < d; i0 += 16) {  // q[r][i][m] = heads[m][i], 16 x 16 at a time
      __m512 block[16];
      for (int m = 0; m < 16; ++m) block[m] = _mm512_load_ps(heads[m] + i0);
      transpose16(block);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(scratch.q.data() + (r * d + i0 + i) * 16, block[i]);
    }
  }
  const __m512 scale = _mm512_set1_ps(a.scale), minus_inf = _mm512_set1_ps(-INFINITY);
  const __m512i lane_pos = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(p0)),
                                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  for (int64_t r = 0; r < R; ++r) {
    const float* q = scratch.q.data() + r * d * 16;
    float* S = scratch.scores.data();
    __m512 top = minus_inf;
    // key j's scores: masked (-inf) in the lanes of rows before it (position p0 + m < j)
    auto keep = [&](int64_t j, __m512 acc) {
      __m512 s = _mm512_mul_ps(acc, scale);
      if (j > p0) s = _mm512_mask_mov_ps(s, _mm512_cmplt_epi32_mask(lane_pos, _mm512_set1_epi32(static_cast<int32_t>(j))),
                                         minus_inf);
      _mm512_storeu_ps(S + j * 16, s);
      top = _mm512_max_ps(top, s);
    };
    // C keys from j0: each key's 16 rows' scores summed over the head's dims in order, C accumulators apart
    auto key_block = [&](auto count, int64_t j0) __attribute__((always_inline)) {
      constexpr int C = decltype(count)::value;
      __m512 acc[C];
      for (int jj = 0; jj < C; ++jj) acc[jj] = _mm512_setzero_ps();
      const float* k = keys + j0 * d;
      for (int64_t i = 0; i < d; ++i) {
        const __m512 qi = _mm512_loadu_ps(q + i * 16);
#pragma GCC unroll 16
        for (int jj = 0; jj < C; ++jj) acc[jj] = _mm512_fmadd_ps(qi, _mm512_set1_ps(k[jj * d + i]), acc[jj]);
      }
      for (int jj = 0; jj < C; ++jj) keep(j0 + jj, acc[jj]);
    };
    int64_t j0 = 0;
    for (; j0 + 16 <= n_keys; j0 += 16) key_block(std::integral_constant<int, 16>{}, j0);
    // The last < 16 keys together too (the same sums: each key's own chain of FMAs). Why: one at a time, each
    // key's d dependent FMAs waited on each other (~4 cycles each: a 43-token prompt's last 11 keys ~2,800
    // cycles a head against ~500 for a block of 16, by count); one thread's attention CPU 1.36 vs 1.45 ms.
    by_count<15>(n_keys - j0, [&](auto count) __attribute__((always_inline)) { key_block(count, j0); });
    alignas(64) float top_m[16], total[16] = {};
    _mm512_store_ps(top_m, top);
    for (int64_t j = 0; j < n_keys; ++j) {  // softmax numerators (0 where masked) and their sums, per row
      float* sj = S + j * 16;
#pragma omp simd
      for (int m = 0; m < 16; ++m) {
        const float e = j <= p0 + m ? fast_exp(sj[m] - top_m[m]) : 0.f;
        sj[m] = e;
        total[m] += e;
      }
    }
    alignas(64) float inv[16];
    for (int m = 0; m < 16; ++m) inv[m] = 1.f / total[m];
    const __m512 inv_v = _mm512_load_ps(inv);
    for (int64_t i0 = 0; i0 < d; i0 += 16) {
      __m512 acc[16];
      for (int ii = 0; ii < 16; ++ii) acc[ii] = _mm512_setzero_ps();
      for (int64_t j = 0; j < n_keys; ++j) {
        const __m512 p = _mm512_loadu_ps(S + j * 16);
        const float* v = values + j * d + i0;
#pragma GCC unroll 16
        for (int ii = 0; ii < 16; ++ii) acc[ii] = _mm512_fmadd_ps(p, _mm512_set1_ps(v[ii]), acc[ii]);
      }
      for (int ii = 0; ii < 16; ++ii) acc[ii] = _mm512_mul_ps(acc[ii], inv_v);
      transpose16(acc);  // acc[m]: row m's 16 dims
      for (int64_t m = 0; m < n; ++m) _mm512_storeu_ps(out + m * H * d + (h0 + r) * d + i0, acc[m]);
    }
  }
}
#endif

// Whether attend_rows takes rows b0..b0+n-1 together (attend_rows16): they are one slot's consecutive
// positions, enough of them, and it applies (d, window).
template <class KV>
inline bool rows_together(const AttentionArgs<KV>& a, int64_t b0, int64_t n) {
#if defined(VOXLANE_GEMM)
  bool together = n >= kBlockMinRows && n <= 16 && a.d % 16 == 0 && a.d <= 128 &&
                  (a.window <= 0 || a.positions[b0] + n <= a.window);
  for (int64_t m = 1; together && m < n; ++m)
    together = a.slots[b0 + m] == a.slots[b0] && a.positions[b0 + m] == a.positions[b0] + m;
  return together;
#else
  (void)a, (void)b0, (void)n;
  return false;
#endif
}

// attend_rows16 of rows b0..b0+n-1 (rows_together), its outputs at `out` (null: a.out's rows). It reads
// its keys and values as fp32 many times (a key once per query head, a value d / 16 times per head, as
// broadcasts): from an fp16 cache the slot's keys 0..p0+n-1 and values of kv head g as fp32 `keys32`,
// `values32` (the one-call step's, widened once per layer and kv head: StepWork::widen_runs), or if null
// widened here into scratch, 16 a conversion (~2 n_keys d / 16 instructions against the 2 R n_keys d FMAs
// of its 16 rows; a prompt's tasks widen O(T^2) keys so).
template <class KV>
inline void attend_together(const AttentionArgs<KV>& a, int64_t b0, int64_t n, int64_t g, AttentionScratch& scratch,
                            float* out = nullptr, const float* keys32 = nullptr, const float* values32 = nullptr) {
#if defined(VOXLANE_GEMM)
  const int64_t d = a.d, offset = ((a.slots[b0] * a.Hkv + g) * a.L) * d, n_keys = a.positions[b0] + n;
  if (keys32) {
    attend_rows16(a, b0, n, g, keys32, values32, scratch, out);
  } else if constexpr (std::is_same_v<KV, float>) {
    attend_rows16(a, b0, n, g, a.k_cache + offset, a.v_cache + offset, scratch, out);
  } else {
    scratch.k.resize(n_keys * d);
    scratch.v.resize(n_keys * d);
    kv::widen(a.k_cache + offset, n_keys * d, scratch.k.data());
    kv::widen(a.v_cache + offset, n_keys * d, scratch.v.data());
    attend_rows16(a, b0, n, g, scratch.k.data(), scratch.v.data(), scratch, out);
  }
#else
  (void)a, (void)b0, (void)n, (void)g, (void)scratch, (void)out, (void)keys32, (void)values32;
#endif
}

// Rows b0..b0+n-1 attend kv head g: together (attend_together; keys32, values32: its fp32 keys and values,
// or null) where they are one slot's consecutive positions and it applies, else each on its own (attend).
template <class KV>
inline void attend_rows(const AttentionArgs<KV>& a, int64_t b0, int64_t n, int64_t g, AttentionScratch& scratch,
                        const float* keys32 = nullptr, const float* values32 = nullptr) {
  if (rows_together(a, b0, n)) return attend_together(a, b0, n, g, scratch, nullptr, keys32, values32);
  for (int64_t m = 0; m < n; ++m) attend(a, (b0 + m) * a.Hkv + g, scratch);
}

// Row b of the rows b0..b0+n-1 that attend_rows takes as one task, alone, its outputs (kv head g's heads)
// at `out` (its H d values): bit-equal to its outputs there (attend_rows16's rows are its lanes', attend's
// its own). Why: the last layer of a prompt chunk attends only the rows whose logits are wanted.
template <class KV>
inline void attend_row_of(const AttentionArgs<KV>& a, int64_t b0, int64_t n, int64_t b, int64_t g, float* out,
                          AttentionScratch& scratch, const float* keys32 = nullptr, const float* values32 = nullptr) {
  if (rows_together(a, b0, n)) return attend_together(a, b, 1, g, scratch, out, keys32, values32);
  attend(a, b * a.Hkv + g, scratch, 0, -1, out);
}

// Both, for one new token per sequence (each row its own slot): the per-op decode_attention.
template <class KV>
inline void attend_one(const AttentionArgs<KV>& a, int64_t t, AttentionScratch& scratch) {
  write_kv(a, t);
  attend(a, t, scratch);
}

}  // namespace voxlane
