// A sampled token from one row of fp32 logits, in C (engine/sampler.py's Sampler on fp32 CPU rows):
// temperature, top-k, top-p and one draw, by the rule of sampler.py's nucleus_numpy and
// _sample_row_numpy (the penalties are applied to the row before). Why: a persona's sampled decode step
// spent ~0.2 ms in numpy (a partition or a full-vocabulary exp, the nucleus's sort, a float64 exp and
// cumsum of the kept tokens: passes and allocations over 49,152 logits), ~7 % of SmolLM2's step.
//
// The rule (filter_top_k_top_p's, with the draw):
//   x = logits / temperature (fp32);
//   pool: the ids with x >= the k-th largest x (top_k in (0, V)), else every id;
//   top_p < 1: e = exp(x - max) over the pool, total = their sum; of the ids in descending x (equal ones by
//     index), keep one while the mass before it is below top_p of the total (the first always). Only the
//     e >= 1e-4 (else 1e-8, else all) are ordered where they hold top_p of the mass: every smaller one has
//     at least that much before it;
//   draw: weights exp(x - top) of the kept ids in index order; the first whose cumulative weight exceeds u
//     times the total (u uniform in [0, 1) from the request's generator).
// exp is decode_ops.h's fast_exp (~1 ulp), sums in double: the kept set and the token are numpy's except
// where a cumulative mass lands within rounding of top_p or of the draw. Plain loops (`omp simd`) but for
// the double sums (AVX-512 where the kernels are built with it, a plain loop elsewhere).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

#include "decode_ops.h"

namespace voxlane {
namespace sampling {

// Scratch of one thread's draws (kept between calls: no allocation per token).
struct Scratch {
  std::vector<float> x, e;
  std::vector<int32_t> pool, order, kept;
};

// The k-th largest of x[0..V) (0 < k < V): a min-heap of the k largest so far; a value enters only above
// its smallest. Why not std::nth_element: it copies and permutes all V values, ~4x numpy's partition here.
inline float kth_largest(const float* x, int64_t V, int64_t k) {
  std::priority_queue<float, std::vector<float>, std::greater<float>> heap;
  for (int64_t i = 0; i < k; ++i) heap.push(x[i]);
  float bound = heap.top();
  for (int64_t i = k; i < V; ++i)
    if (x[i] > bound) {
      heap.pop();
      heap.push(x[i]);
      bound = heap.top();
    }
  return bound;
}

// The sum, in double, of the e[i] >= floor for i < n. With AVX-512 sixteen at a time into two vectors of
// double lanes (gcc left the plain loop's double lanes scalar, a chain through memory: ~60 % of a draw).
inline double sum_from(const float* e, int64_t n, float floor) {
  double sum = 0.0;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
  const __m512 bound = _mm512_set1_ps(floor);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(e + i);
    const __m512 kept = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, bound, _CMP_GE_OQ), v);
    low = _mm512_add_pd(low, _mm512_cvtps_pd(_mm512_castps512_ps256(kept)));
    high = _mm512_add_pd(high, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(kept), 1))));
  }
  sum = _mm512_reduce_add_pd(_mm512_add_pd(low, high));
#endif
  for (; i < n; ++i) sum += e[i] >= floor ? static_cast<double>(e[i]) : 0.0;
  return sum;
}

// e[i] = exp(e[i] - top) for i < n (0 below e^-87.3, fast_exp's floor: -inf logits weigh nothing) -> their sum.
inline double exp_and_sum(float* e, int64_t n, float top) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float d = e[i] - top;
    e[i] = d < -87.3f ? 0.f : fast_exp(d);
  }
  return sum_from(e, n, -1.f);
}

// The largest of v[0..n) (n >= 1), NaN ignored: sixteen lanes (std::max's loop stays a scalar chain).
inline float largest(const float* v, int64_t n) {
  float lanes[16];
  for (int l = 0; l < 16; ++l) lanes[l] = -INFINITY;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
#pragma omp simd
    for (int l = 0; l < 16; ++l) lanes[l] = v[i + l] > lanes[l] ? v[i + l] : lanes[l];
  float top = -INFINITY;
  for (; i < n; ++i) top = v[i] > top ? v[i] : top;
  for (int l = 0; l < 16; ++l) top = lanes[l] > top ? lanes[l] : top;
  return top;
}

// The j < n with e[j] >= floor, ascending, into o -> how many: blocks of 16 without one are passed over
// after one vector compare (the nucleus's candidates are ~1 % of a vocabulary).
inline int64_t collect_from(const float* e, int64_t n, float floor, int32_t* o) {
  int64_t count = 0;
  for (int64_t b = 0; b < n; b += 16) {
    const int64_t end = std::min(n, b + 16);
    int any = 0;
#pragma omp simd reduction(| : any)
    for (int64_t j = b; j < end; ++j) any |= e[j] >= floor;
    if (!any) continue;
    for (int64_t j = b; j < end; ++j) {  // branch-free: write every id, advance past those kept
      o[count] = static_cast<int32_t>(j);
      count += e[j] >= floor;
    }
  }
  return count;
}

// The first i whose cumulative weight w[0] + .. + w[i] exceeds target (the last if none does): the sums of
// blocks of 64 first, then one block's weights one by one.
inline int64_t first_above(const float* w, int64_t n, double target) {
  constexpr int64_t kBlock = 64;
  double cumulative = 0.0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = std::min(n, b + kBlock);
    const double block = sum_from(w + b, end - b, -1.f);
    if (cumulative + block > target || end == n) {
      for (int64_t i = b; i < end; ++i) {
        cumulative += w[i];
        if (cumulative > target) return i;
      }
      return n - 1;
    }
    cumulative += block;
  }
  return n - 1;
}

// The token sampled from logits [V] (see above); -1 for settings outside the rule (temperature <= 0 or
// not a number, V < 1).
inline int64_t sample_row(const float* logits, int64_t V, float temperature, int64_t top_k, double top_p,
                          double u) {
  if (V < 1 || !(temperature > 0.f)) return -1;
  thread_local Scratch scratch;
  Scratch& sc = scratch;  // one thread-local look-up, not one per element
  sc.x.resize(V);
  float* x = sc.x.data();
#pragma omp simd
  for (int64_t i = 0; i < V; ++i) x[i] = logits[i] / temperature;

  // The pool: every id, or those >= the k-th largest x (in index order), gathered into values e.
  const bool every = !(top_k > 0 && top_k < V);
  int64_t P = V;
  sc.e.resize(V);
  float* e = sc.e.data();
  int32_t* pool = nullptr;
  if (every) {
    std::copy(x, x + V, e);
  } else {
    const float bound = kth_largest(x, V, top_k);
    sc.pool.resize(V);
    pool = sc.pool.data();
    P = 0;
    for (int64_t i = 0; i < V; ++i) {  // branch-free: write every id, advance past those kept
      pool[P] = static_cast<int32_t>(i);
      P += x[i] >= bound;
    }
    for (int64_t j = 0; j < P; ++j) e[j] = x[pool[j]];
  }
  auto id = [&](int64_t j) { return every ? static_cast<int32_t>(j) : pool[j]; };

  // The kept ids (ascending), or all of the pool (top_p >= 1).
  std::vector<int32_t>& kept = sc.kept;
  kept.clear();
  if (top_p < 1.0) {
    const double total = exp_and_sum(e, P, largest(e, P));
    std::vector<int32_t>& order = sc.order;
    order.resize(P);
    int32_t* o = order.data();
    int64_t n = -1;  // the ordered candidates: the e >= floor that hold top_p of the mass, else all
    for (float floor : {1e-4f, 1e-8f})
      if (sum_from(e, P, floor) >= top_p * total) {
        n = collect_from(e, P, floor, o);
        break;
      }
    if (n < 0) {
      n = P;
      for (int64_t j = 0; j < P; ++j) o[j] = static_cast<int32_t>(j);
    }
    // descending x, equal ones by index (stable: the candidates are in index order)
    std::stable_sort(o, o + n, [&](int32_t a, int32_t b) { return x[id(a)] > x[id(b)]; });
    double cumulative = 0.0;
    int64_t keep = 0;
    for (int64_t i = 0; i < n; ++i) {  // kept: the mass before it below top_p (numpy: (cumulative - p) / total)
      const double p = e[o[i]];
      cumulative += p;
      if ((cumulative - p) / total >= top_p) break;
      ++keep;
    }
    keep = std::max<int64_t>(keep, 1);
    for (int64_t i = 0; i < keep; ++i) kept.push_back(id(o[i]));
    std::sort(kept.begin(), kept.end());
  }

  // The draw over the kept ids' weights in index order.
  const bool all_kept = top_p >= 1.0;
  const int64_t K = all_kept ? P : static_cast<int64_t>(kept.size());
  auto kept_id = [&](int64_t i) { return all_kept ? id(i) : kept[i]; };
  float* w = e;  // reused: the pool's values are not needed any more
  if (all_kept) {
    if (!every)
      for (int64_t i = 0; i < K; ++i) w[i] = x[pool[i]];
    else
      std::copy(x, x + V, w);
  } else {
    for (int64_t i = 0; i < K; ++i) w[i] = x[kept[i]];
  }
  const double sum = exp_and_sum(w, K, largest(w, K));
  return kept_id(first_above(w, K, u * sum));
}

}  // namespace sampling
}  // namespace voxlane

// sample_row as a plain C function for ctypes (engine/sampler.py's native_sample_row).
extern "C" int64_t voxlane_sample_row(const float* logits, int64_t V, double temperature, int64_t top_k,
                                      double top_p, double u) {
  return voxlane::sampling::sample_row(logits, V, static_cast<float>(temperature), top_k, top_p, u);
}
