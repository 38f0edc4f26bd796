// Voxlane's fused CPU kernels for the decode step (one new token per sequence, fp32 activations).
//
// Why they exist: at 135M parameters a decode step is ~5,800 small ATen calls when written with
// torch ops, and about half of each step was dispatch overhead, not arithmetic. These four ops
// replace ~190 calls per layer with 8, and the int8 matrix-vector product reads the int8 weights
// directly with fp32 accumulation (no bf16 rounding of activations or outputs).
//
// Built once per machine by engine/kernels.py (torch.utils.cpp_extension, -O3 -march=native) and
// registered as torch.ops.voxlane.*. Every op has a pure-torch twin in engine/kernels.py that the
// tests compare against. Shapes: B sequences, K in-features, N out-features, D hidden, H query
// heads, Hkv kv heads, R = H / Hkv, d head dim, S cache slots, L cache positions.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "decode_ops.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace voxlane {

// ---- int8 weight-only linear ------------------------------------------------------------------
// y[M, N] = x[M, K] @ (w[N, K] * scale[N, None]).T + bias[N]; fp32 in and out, int8 weights.
// The cost is reading w once (memory-bound for small M), so each row block of w is loaded once
// and multiplied by every row of x while it sits in L1.

#if defined(__AVX512F__)
// R weight rows times MB rows of x, 16 columns per iteration. R * MB accumulators (<= 16 zmm).
template <int R, int MB>
static inline void int8_block(const float* x, int64_t K, const int8_t* w, const float* scale, const float* bias,
                              float* y, int64_t N) {
  __m512 acc[MB][R];
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) {
      // Prefetch the same spot of the next row block (R * K bytes ahead): rows are too short
      // (K bytes) for the hardware prefetcher to ramp up. Measured on the model's 121 matrices,
      // batch 1: 18 GB/s with it, 12 GB/s without or with a within-row distance.
      _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * K + k), _MM_HINT_T0);
      __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * K + k));
      wv[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
    }
    for (int m = 0; m < MB; ++m) {
      __m512 xv = _mm512_loadu_ps(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_fmadd_ps(wv[r], xv, acc[m][r]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < R; ++r) {
      float s = _mm512_reduce_add_ps(acc[m][r]);
      for (int64_t t = k; t < K; ++t) s += static_cast<float>(w[r * K + t]) * x[m * K + t];
      y[m * N + r] = s * scale[r] + (bias ? bias[r] : 0.f);
    }
}
#else
template <int R, int MB>
static inline void int8_block(const float* x, int64_t K, const int8_t* w, const float* scale, const float* bias,
                              float* y, int64_t N) {
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < R; ++r) {
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t t = 0; t < K; ++t) s += static_cast<float>(w[r * K + t]) * x[m * K + t];
      y[m * N + r] = s * scale[r] + (bias ? bias[r] : 0.f);
    }
}
#endif

// Rows [n, n + R) of the output for every row of x: batch rows in groups of 8 (only with R = 3,
// to stay within the registers: 24 accumulators), 4, 2, 1.
template <int R>
static void int8_rows(const float* x, int64_t M, int64_t K, const int8_t* w, const float* scale, const float* bias,
                      float* y, int64_t N, int64_t n) {
  const int8_t* wn = w + n * K;
  const float* bn = bias ? bias + n : nullptr;
  int64_t m = 0;
  if constexpr (R == 3)
    for (; m + 8 <= M; m += 8) int8_block<R, 8>(x + m * K, K, wn, scale + n, bn, y + m * N + n, N);
  for (; m + 4 <= M; m += 4) int8_block<R, 4>(x + m * K, K, wn, scale + n, bn, y + m * N + n, N);
  for (; m + 2 <= M; m += 2) int8_block<R, 2>(x + m * K, K, wn, scale + n, bn, y + m * N + n, N);
  for (; m < M; ++m) int8_block<R, 1>(x + m * K, K, wn, scale + n, bn, y + m * N + n, N);
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: contiguous float32 [M, K]");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kChar && w.is_contiguous() && w.size(1) == x.size(1),
              "w: contiguous int8 [N, K]");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == w.size(0) && scale.is_contiguous(),
              "scale: float32 [N]");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N && bias->is_contiguous(), "bias: float32 [N]");
    b = bias->data_ptr<float>();
  }
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Batch 1 takes 8 weight rows at a time (more loads in flight); 2-7 rows of x take 4 weight
  // rows (4 x 4 accumulators); 8 or more take 3 weight rows times 8 rows of x, so each weight is
  // converted to fp32 once per 8 rows (measured over the model at batch 8: 4 x 4 12.9 ms,
  // 2 x 8 11.2 ms; a whole batch-8 decode step 20.5 ms with 2 x 8, 18.4-19.3 ms with 3 x 8).
  const int64_t R = M == 1 ? 8 : (M >= 8 ? 3 : 4);
  const int64_t blocks = N / R;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      if (R == 8) int8_rows<8>(xp, M, K, wp, sp, b, yp, N, i * 8);
      else if (R == 4) int8_rows<4>(xp, M, K, wp, sp, b, yp, N, i * 4);
      else int8_rows<3>(xp, M, K, wp, sp, b, yp, N, i * 3);
    }
  });
  for (int64_t n = blocks * R; n < N; ++n) int8_rows<1>(xp, M, K, wp, sp, b, yp, N, n);
  return y;
}

// ---- RMSNorm, with the residual add fused in ------------------------------------------------------
// residual[M, D] += x[M, D] (in place, when x is given); returns residual / rms(residual) * weight.
at::Tensor add_rms_norm_(at::Tensor& residual, const c10::optional<at::Tensor>& x, const at::Tensor& weight,
                         double eps) {
  TORCH_CHECK(residual.dim() == 2 && residual.scalar_type() == at::kFloat && residual.is_contiguous(),
              "residual: contiguous float32 [M, D]");
  const int64_t M = residual.size(0), D = residual.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.numel() == D, "weight: float32 [D]");
  float* rp = residual.data_ptr<float>();
  if (x.has_value()) {
    TORCH_CHECK(x->sizes() == residual.sizes() && x->scalar_type() == at::kFloat && x->is_contiguous(),
                "x: contiguous float32 like residual");
    const float* xp = x->data_ptr<float>();
#pragma omp simd
    for (int64_t i = 0; i < M * D; ++i) rp[i] += xp[i];
  }
  at::Tensor out = at::empty_like(residual);
  const float* wp = weight.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) rms_row(rp + m * D, wp, eps, D, out.data_ptr<float>() + m * D);
  return out;
}

// ---- SwiGLU activation ------------------------------------------------------------------------------
// gate_up[M, 2I] (gate | up) -> silu(gate) * up [M, I].
at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == at::kFloat && gate_up.is_contiguous() &&
                  gate_up.size(1) % 2 == 0,
              "gate_up: contiguous float32 [M, 2I]");
  const int64_t M = gate_up.size(0), I = gate_up.size(1) / 2;
  at::Tensor out = at::empty({M, I}, gate_up.options());
  const float* in = gate_up.data_ptr<float>();
  float* result = out.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) silu_mul_into(in + m * 2 * I, in + m * 2 * I + I, result + m * I, I);
  return out;
}

// ---- attention of one new token per sequence against its cache slot ---------------------------------
// RoPE on the new q and k (HF's rotate-half convention; the sign is folded into sin), writes the
// new k and v into the cache at (slot, :, position), then each of the R query heads that share a
// kv head attends keys 0..position of its own slot (the last `window` of them when window > 0:
// Mistral's sliding window). No mask tensor and no padding: each sequence
// reads exactly its own length. Replaces RoPE, two index_put, the GQA reshapes and SDPA.
// The caches are float32 or float16 (kv_element.h: the new k/v rounded where written).
static at::Tensor attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                            at::Tensor& v_cache, const at::Tensor& slots, const at::Tensor& positions,
                            int64_t num_heads, int64_t num_kv_heads, int64_t window, bool rows_together) {
  const int64_t B = qkv.size(0), H = num_heads, Hkv = num_kv_heads, d = k_cache.size(3), L = k_cache.size(2);
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous() &&
                  qkv.size(1) == (H + 2 * Hkv) * d,
              "qkv: contiguous float32 [B, (H + 2*Hkv) * d]");
  const bool half = k_cache.scalar_type() == at::kHalf;
  TORCH_CHECK(k_cache.dim() == 4 && (half || k_cache.scalar_type() == at::kFloat) && k_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == k_cache.scalar_type() &&
                  v_cache.is_contiguous() && k_cache.size(1) == Hkv,
              "k_cache, v_cache: contiguous float32 or float16 [S, Hkv, L, d], both alike");
  TORCH_CHECK(cos.sizes() == at::IntArrayRef({B, d}) && sin.sizes() == cos.sizes() && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "cos, sin: contiguous float32 [B, d]");
  TORCH_CHECK(slots.numel() == B && positions.numel() == B && slots.scalar_type() == at::kLong &&
                  positions.scalar_type() == at::kLong && slots.is_contiguous() && positions.is_contiguous(),
              "slots, positions: int64 [B]");
  TORCH_CHECK(H % Hkv == 0, "num_heads must be a multiple of num_kv_heads");
  const int64_t S = k_cache.size(0);
  const int64_t* slot_p = slots.data_ptr<int64_t>();
  const int64_t* pos_p = positions.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(slot_p[b] >= 0 && slot_p[b] < S, "slot out of range");
    TORCH_CHECK(pos_p[b] >= 0 && pos_p[b] < L, "position out of range");
  }
  at::Tensor y = at::empty({B, H * d}, qkv.options());
  const float *qkv_p = qkv.data_ptr<float>(), *cos_p = cos.data_ptr<float>(), *sin_p = sin.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  auto run = [&](auto* kc, auto* vc) {
    using KV = std::remove_pointer_t<decltype(kc)>;
    const AttentionArgs<KV> args{qkv_p, cos_p, sin_p, kc, vc, slot_p, pos_p, yp, H, Hkv, d, L, window};
    if (rows_together) {
      // As the one-call step runs a prompt chunk: every row's k/v written, then rows 16 at a time (attend_rows).
      for (int64_t t = 0; t < B * Hkv; ++t) write_kv(args, t);
      AttentionScratch scratch;
      for (int64_t b0 = 0; b0 < B; b0 += 16)
        for (int64_t g = 0; g < Hkv; ++g) attend_rows(args, b0, std::min<int64_t>(16, B - b0), g, scratch);
      return;
    }
    // One task per (sequence, kv head): decode_ops.h's attend_one.
    at::parallel_for(0, B * Hkv, 1, [&](int64_t t0, int64_t t1) {
      AttentionScratch scratch;
      for (int64_t t = t0; t < t1; ++t) attend_one(args, t, scratch);
    });
  };
  if (half) run(static_cast<kv::Half*>(k_cache.data_ptr()), static_cast<kv::Half*>(v_cache.data_ptr()));
  else run(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
  return y;
}

at::Tensor decode_attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                            at::Tensor& v_cache, const at::Tensor& slots, const at::Tensor& positions,
                            int64_t num_heads, int64_t num_kv_heads, int64_t window) {
  return attention(qkv, cos, sin, k_cache, v_cache, slots, positions, num_heads, num_kv_heads, window, false);
}

// Rows of prompt chunks (one slot's consecutive positions, in order) as the one-call step attends them;
// its twin is decode_attention_reference over the same rows in order (each row sees the keys before it).
at::Tensor prompt_attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                            at::Tensor& v_cache, const at::Tensor& slots, const at::Tensor& positions,
                            int64_t num_heads, int64_t num_kv_heads, int64_t window) {
  return attention(qkv, cos, sin, k_cache, v_cache, slots, positions, num_heads, num_kv_heads, window, true);
}

}  // namespace voxlane

TORCH_LIBRARY(voxlane, m) {
  m.def("int8_linear(Tensor x, Tensor w, Tensor scale, Tensor? bias) -> Tensor");
  m.def("add_rms_norm_(Tensor(a!) residual, Tensor? x, Tensor weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("decode_attention(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor slots, Tensor positions, int num_heads, int num_kv_heads, int window) -> Tensor");
  m.def("prompt_attention(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor slots, Tensor positions, int num_heads, int num_kv_heads, int window) -> Tensor");
}

TORCH_LIBRARY_IMPL(voxlane, CPU, m) {
  m.impl("int8_linear", &voxlane::int8_linear);
  m.impl("add_rms_norm_", &voxlane::add_rms_norm_);
  m.impl("silu_mul", &voxlane::silu_mul);
  m.impl("decode_attention", &voxlane::decode_attention);
  m.impl("prompt_attention", &voxlane::prompt_attention);
}
