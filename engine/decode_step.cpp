// One native call per decode step: ``torch.classes.voxlane.NativeDecoder``.
//
// Why: with the per-op kernels a decode step was still ~1,070 ATen calls and the Python of 30
// layers, and every parallel op forked and joined its own OpenMP team. Here the whole layer stack
// (norms, qkv (+ bias), RoPE + cache write + attention, o_proj, SwiGLU, down, residuals, final
// norm, LM head) is one call: its ~200 phases run on a StepPool (step_pool.h) whose threads stay
// warm for the whole step and take the rows of each matrix in small tasks, with no barrier (a
// thread the OS pauses delays the others by one task, not by its share).
//
// The model is described once (add_linear / add_norm, from engine/native_step.py) with pointers
// into tensors the object keeps alive; weights may be any format of gguf_blocks.h (the GGUF's own
// blocks, our per-channel int8, or fp32). Activations and accumulation are fp32, except with
// set_int8_activations(true): then each phase that produces a matrix's input also quantizes it to Q8
// blocks (q8_matmul.h; per block of 32, so a task quantizes exactly the values it wrote), and the
// GGUF-format weights multiply those with integer dot products (llama.cpp's way); or with
// set_int16_activations(true), in decoding batches (<= 8 rows) the same phases quantize the inputs to
// int16 blocks and the Q4_0 / Q4_1 / Q8_0 weights multiply them through VNNI in their 16-row
// interleaved layout (r16_matmul.h; the model's tensors packed in place, add_linear's r16 flag).
// The KV cache is fp32 or fp16 (kv_element.h; EngineConfig.kv_cache_dtype): the step's k/v are rounded
// where they are written and widened where attention reads them.
// Shapes: B sequences, D hidden, H / Hkv heads, d head dim, I intermediate, V vocabulary,
// S cache slots, L positions per slot.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "decode_ops.h"
#include "q8_matmul.h"
#include "quant_matmul.h"
#include "r16_batch.h"
#include "r16_matmul.h"
#include "r16_tiles.h"
#include "step_pool.h"

namespace voxlane {

QWeight qweight_of(const at::Tensor& w, int64_t format, int64_t cols, const c10::optional<at::Tensor>& row_scale,
                   const c10::optional<at::Tensor>& bias);  // quant_ops.cpp

// A linear layer as row segments (q | k | v, gate | up), possibly of different formats.
struct Linear {
  std::vector<QWeight> parts;
  std::vector<r16::Weight> r16;  // per part: its R16 view when its bytes are in that layout (data null: not)
  std::vector<int64_t> bases;    // per part: its first row
  int64_t rows = 0, cols = 0;
  const float* bias = nullptr;

  // y[m, n] = x[m] . W[n] (+ bias[n]) for rows n in [n0, n1) and every row m of x; with xq (x
  // as Q8 blocks), the segments of a GGUF block format use the integer path.
  // pack: x's bf16 tiles for the prefill GEMM's AMX path, or xq's int8 tiles (one per worker, tagged by phase).
  // bf16x: bf16 activations for the formats that have them (quant_matmul.h's matvec).
  // xi (x as int16 blocks; M <= 8, or any M where AMX runs): the segments in the R16 layout multiply it
  // in their whole groups of 16 rows within [n0, n1) (r16::product: prompt chunks in AMX int8 tiles,
  // r16_tiles.h; else r16_matmul.h's VNNI). Every other product with an R16 segment (prompt chunks
  // without AMX, fp32 or int8 activations, rows outside whole groups) unpacks its rows to the file's
  // blocks first.
  // descending (a step pool task from a phase's back end): the segments, and an R16 segment's row groups
  // in decoding batches, from the last down.
  void run(const float* x, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1,
           const Q8Rows* xq = nullptr, XPack* pack = nullptr, bool bf16x = false,
           const r16::I16Rows* xi = nullptr, bool descending = false) const {
    for (size_t k = 0; k < parts.size(); ++k) {
      const size_t i = descending ? parts.size() - 1 - k : k;
      const QWeight& w = parts[i];
      const int64_t base = bases[i];
      const int64_t a = std::max(n0, base) - base, b = std::min(n1, base + w.rows) - base;
      float* yw = y + base;
      if (a < b && r16[i].data) {
        const int64_t g0 = xi ? (a + r16::kRows - 1) / r16::kRows * r16::kRows : b, g1 = xi ? b / r16::kRows * r16::kRows : b;
        if (g0 < g1) {
          if (M <= 8) r16::batch_product(r16[i], *xi, M, yw, ldy, g0, g1, false, descending);  // decoding batches (r16_batch.h)
          else r16::product(r16[i], *xi, M, yw, ldy, g0, g1, -1, descending);  // prompt chunks: AMX tiles (r16_tiles.h)
          if (a < g0) unpacked(i, x, M, yw, ldy, a, g0, xq, pack, bf16x);
          if (g1 < b) unpacked(i, x, M, yw, ldy, g1, b, xq, pack, bf16x);
        } else {
          unpacked(i, x, M, yw, ldy, a, b, xq, pack, bf16x);
        }
      } else if (a < b) {
        file_rows(w, x, M, yw, ldy, a, b, xq, pack, bf16x);
      }
    }
    if (bias)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n) y[m * ldy + n] += bias[n];
  }

  // Whether run() with xi reads xi only, never x, for any rows [n0, n1) that are whole groups of 16: every
  // segment in the R16 layout and in whole groups (else its rows are unpacked and multiply x or xq).
  bool reads_only_xi() const {
    for (size_t i = 0; i < parts.size(); ++i)
      if (!r16[i].data || bases[i] % r16::kRows || parts[i].rows % r16::kRows) return false;
    return !parts.empty();
  }

  // The first 4 KB that run(rows [n0, n1), descending) reads of its first segment, asked for ahead.
  void prefetch(int64_t n0, int64_t n1, bool descending) const {
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t a = std::max(n0, bases[i]) - bases[i], b = std::min(n1, bases[i] + parts[i].rows) - bases[i];
      if (a >= b || (descending && n1 > bases[i] + parts[i].rows)) continue;  // not the segment run() starts with
      if (r16[i].data && a % r16::kRows == 0 && b % r16::kRows == 0) return r16::prefetch_rows(r16[i], a, b, descending);
      const char* at = reinterpret_cast<const char*>(parts[i].data) + a * parts[i].row_bytes;
      const int64_t bytes = std::min<int64_t>((b - a) * parts[i].row_bytes, 4096);
      for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(at + o, 0, 3);
      return;
    }
  }

  // Rows [a, b) of a segment in the file's layout.
  static void file_rows(const QWeight& w, const float* x, int64_t M, float* y, int64_t ldy, int64_t a, int64_t b,
                        const Q8Rows* xq, XPack* pack, bool bf16x) {
    if (xq && has_q8_path(w.format)) matvec_q8(w, *xq, M, y, ldy, a, b, pack);
    else matvec(w, x, M, w.cols, y, ldy, a, b, pack, bf16x);
  }

  // Rows [a, b) of R16 segment i: its rows unpacked to the file's blocks in a thread-local buffer (a
  // prompt task's 16-128 rows: ~6-45 KB, small next to the products of its rows of x), then file_rows.
  void unpacked(size_t i, const float* x, int64_t M, float* y, int64_t ldy, int64_t a, int64_t b, const Q8Rows* xq,
                XPack* pack, bool bf16x) const {
    thread_local std::vector<uint8_t> rows;
    const QWeight& w = parts[i];
    rows.resize((b - a) * w.row_bytes);
    r16::unpack_rows(r16[i], a, b, rows.data());
    QWeight part = w;
    part.data = rows.data();
    part.rows = b - a;
    file_rows(part, x, M, y + a, ldy, 0, b - a, xq, pack, bf16x);
  }
};

struct Layer {
  Linear qkv, o, gate_up, down;
  const float *input_norm = nullptr, *post_norm = nullptr;
};

class NativeDecoder;

// The row stride of the step's gate/up buffer: 2I and 16 floats more. Why: SmolLM2's 2I = 3,072 floats
// is 3 x 4 KB, so a prompt chunk's rows of it all fall in the same L1 set, and the prefill GEMM
// writes a 64-byte line per row at a time (16 weight rows): one int8 linear of 576 columns, 1 thread,
// AMX, same process (`quant_linear`, whose output rows are N floats apart): N = 3,072 took 8.6 ms at
// 256 rows and 1.14 at 39, N = 3,088 (16 rows more) 2.3 and 0.89.
inline int64_t gate_up_stride(int64_t I) { return 2 * I + 16; }

// The step's buffers (each [B, width] row-major), and the Q8 (int8 activations) or int16 blocks (int16
// activations) of the matrices' inputs (h, attn, act, h_logits; q / q1 null when not used).
// last: the residuals of the last layer's gathered rows (StepWork::last_rows; null: not gathered).
struct StepBuffers {
  float *residual, *h, *delta, *qkv, *attn, *gate_up, *act, *h_logits, *logits, *cos, *sin, *last;
  Q8Rows hq, attnq, actq, logitq;
  r16::I16Rows hi, attni, acti, logiti;
};

class NativeDecoder : public torch::CustomClassHolder {
  friend class StepWork;

 public:
  NativeDecoder(int64_t dim, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate, int64_t layers,
                double eps, int64_t window, at::Tensor cos, at::Tensor sin, at::Tensor k_cache, at::Tensor v_cache)
      : D(dim), H(heads), Hkv(kv_heads), d(head_dim), I(intermediate), eps(eps), window(window), layers(layers) {
    TORCH_CHECK(heads % kv_heads == 0, "heads must be a multiple of kv_heads");
    TORCH_CHECK(cos.dim() == 2 && cos.size(1) == head_dim && cos.scalar_type() == at::kFloat && cos.is_contiguous() &&
                    sin.sizes() == cos.sizes() && sin.scalar_type() == at::kFloat && sin.is_contiguous(),
                "cos, sin: contiguous float32 [positions, head_dim]");
    half_kv_ = k_cache.scalar_type() == at::kHalf;
    TORCH_CHECK(k_cache.dim() == 5 && k_cache.size(0) == layers && k_cache.size(2) == kv_heads &&
                    k_cache.size(4) == head_dim && (half_kv_ || k_cache.scalar_type() == at::kFloat) &&
                    k_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() &&
                    v_cache.scalar_type() == k_cache.scalar_type() && v_cache.is_contiguous(),
                "k_cache, v_cache: contiguous float32 or float16 [layers, slots, kv_heads, positions, head_dim], both alike");
    keep({cos, sin, k_cache, v_cache});
    cos_ = cos.data_ptr<float>();
    sin_ = sin.data_ptr<float>();
    k_ = k_cache.data_ptr();
    v_ = v_cache.data_ptr();
    S = k_cache.size(1);
    L = k_cache.size(3);
    max_position = cos.size(0);
    layer_.resize(layers);
  }

  // role: "qkv", "o", "gate_up", "down" (layer >= 0), "head", "embed" (layer -1). Segments of
  // one layer are appended in row order; a bias applies to the whole layer (given once).
  // r16: the blocks are in the R16 layout (r16_matmul.h; packed in place by the model for int16 activations).
  void add_linear(int64_t layer, const std::string& role, at::Tensor blocks, int64_t format, int64_t cols,
                  c10::optional<at::Tensor> row_scale, c10::optional<at::Tensor> bias, bool r16) {
    Linear& linear = linear_of(layer, role);
    QWeight w = qweight_of(blocks, format, cols, row_scale, c10::nullopt);
    TORCH_CHECK(linear.parts.empty() || linear.cols == cols, role, ": segments of different widths");
    keep({blocks});
    if (row_scale.has_value()) keep({*row_scale});
    linear.bases.push_back(linear.rows);
    linear.parts.push_back(w);
    TORCH_CHECK(!r16 || (r16::has_layout(format) && w.rows % r16::kRows == 0), role,
                ": the R16 layout needs Q4_0 / Q4_1 / Q8_0 rows in groups of ", r16::kRows);
    linear.r16.push_back(r16 ? r16::view(format, w.data, w.rows, cols, w.row_bytes) : r16::Weight{});
    if (r16 && role != "embed") r16_bytes_ += w.rows * w.row_bytes;
    linear.rows += w.rows;
    linear.cols = cols;
    if (bias.has_value()) {
      TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous(), role, ": bias must be contiguous float32");
      keep({*bias});
      linear.bias = bias->data_ptr<float>();
    }
  }

  // role: "input", "post" (layer >= 0), "final" (layer -1).
  void add_norm(int64_t layer, const std::string& role, at::Tensor weight) {
    TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.numel() == D,
                "norm weight: contiguous float32 [dim]");
    keep({weight});
    const float* p = weight.data_ptr<float>();
    if (role == "final") final_norm = p;
    else if (role == "input") layer_at(layer).input_norm = p;
    else if (role == "post") layer_at(layer).post_norm = p;
    else TORCH_CHECK(false, "unknown norm role ", role);
  }

  // Rows of tokens, positions, slots [T] int64 (one per decoding sequence; a prompt chunk's tokens
  // at consecutive positions of one slot) -> logits [n, V] float32 of the rows ``logit_rows`` [n];
  // writes every row's k/v at (slot, position) of each layer.
  at::Tensor step(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& slots,
                  const at::Tensor& logit_rows);

  int64_t num_layers() const { return layers; }
  // The KV cache's element: true for fp16, false for fp32.
  bool half_kv() const { return half_kv_; }

  // Steps run on one thread because helper threads stalled under contention (engine/step_pool.h).
  int64_t solo_steps() const { return pool_.solo_steps(); }
  void set_stall_fallback(bool on) { pool_.set_stall_fallback(on); }
  // Tests: the stall verdicts (nonzero: stalled) of the next several-thread steps, then clean, and the
  // times of solo and several-thread steps the stall fallback sees (StepPool::script_steps).
  void script_steps(std::vector<int64_t> verdicts, int64_t solo_ns, int64_t ns) {
    pool_.script_steps(std::move(verdicts), solo_ns, ns);
  }
  // The first maximum of each logits row of the last step (numpy's / torch's argmax, a NaN first), found
  // by the LM head's tasks while their logits are in cache: a greedy sampler reads no logits.
  std::vector<int64_t> argmax() const { return argmax_; }
  // This object's address, for the C calls below (engine/native_step.py's StepCalls).
  int64_t address() const { return reinterpret_cast<int64_t>(this); }
  // Another step follows within about `us` microseconds: the step pool's helpers stay awake for it
  // (StepPool::expect_step; us <= 0: they may sleep).
  void expect_step(int64_t us) { pool_.expect_step(us); }

  // Int8 activations for the GGUF-format weights (q8_matmul.h); off: fp32 activations.
  void set_int8_activations(bool on) {
    TORCH_CHECK(!on || (D % kQ8 == 0 && d % kQ8 == 0 && I % kQ8 == 0),
                "int8 activations need dim, head_dim and intermediate_size multiples of ", kQ8);
    TORCH_CHECK(!on || !int16_activations_, "int8 activations: not with int16 activations");
    int8_activations_ = on;
  }
  bool int8_activations() const { return int8_activations_; }

  // Int16 activations in decoding batches (<= 8 rows) for the matrices added in the R16 layout (Q4_0,
  // Q4_1, Q8_0 with rows in groups of 16; r16_matmul.h); the others keep fp32 activations.
  void set_int16_activations(bool on) {
    TORCH_CHECK(!on || (D % r16::kBlock == 0 && d % r16::kBlock == 0 && I % r16::kBlock == 0),
                "int16 activations need dim, head_dim and intermediate_size multiples of ", r16::kBlock);
    TORCH_CHECK(!on || !int8_activations_, "int16 activations: not with int8 activations");
    int16_activations_ = on;
  }
  bool int16_activations() const { return int16_activations_; }
  // Bytes of the matrices added in the R16 layout (the embedding not counted again).
  int64_t r16_bytes() const { return r16_bytes_; }

  // bf16 activations for the GGUF formats whose weights are exact in two bf16 tiles (Q4_0, Q5_0, Q4_1;
  // prefill_gemm.h), from kBf16MinRows rows on (prompt chunks), where AMX runs; every other format and
  // decoding batches stay fp32.
  void set_bf16_activations(bool on) { bf16_activations_ = on; }
  bool bf16_activations() const { return bf16_activations_; }

  // The last layer after its qkv for the rows whose logits are wanted only (on: StepWork::last_rows), or
  // for every row (off: as before; tests compare the two).
  void set_last_rows_only(bool on) { last_rows_only_ = on; }
  bool last_rows_only() const { return last_rows_only_; }
  // A prompt's fp16 keys and values widened once per layer and kv head for its attention tasks (on:
  // StepWork::runs), or by each task for itself (off: as before; tests compare the two); and the keys
  // (as many values) widened so for prompt attention since the decoder was made.
  void set_widen_once(bool on) { widen_once_ = on; }
  bool widen_once() const { return widen_once_; }
  int64_t widened_keys() const { return widened_keys_; }
  // Times StepWork::kv32's buffer was allocated (grown) since the decoder was made (tests: kept between steps).
  int64_t kv32_allocations() const { return kv32_allocations_; }
  // A gate/up task's gate and up outputs and silu(gate) * up in its worker's own scratch (on, where down
  // reads only the int16 blocks of act: StepWork::act_local), or in the step's shared gate_up and act
  // buffers (off: as before; tests compare the two); and the floats of the workers' scratch (tests).
  void set_act_scratch(bool on) { act_scratch_ = on; }
  bool act_scratch() const { return act_scratch_; }
  // A decoding row's attention task asks for the lines of the task its thread likely takes next while it
  // computes (on: attend's next TaskKV, spread over its loops), or only for their pages' first lines (off: as
  // before; tests compare the two). Prefetches only: the same results.
  void set_kv_ahead(bool on) { kv_ahead_ = on; }
  bool kv_ahead() const { return kv_ahead_; }
  // StepPool::set_halves: a prompt's matrix phases walked upwards from two halves (on), or one range from
  // its two ends (A/B, tests).
  void set_halves(bool on) { pool_.set_halves(on); }
  bool halves() const { return pool_.halves(); }
  // StepPool::set_steer: sleeping helpers woken off the waking thread's CPU (on), or wherever the OS puts them.
  void set_steer(bool on) { pool_.set_steer(on); }
  bool steer() const { return pool_.steer(); }
  int64_t steers() { return pool_.steers(); }
  // A prompt's attention outputs in the worker's scratch where o_proj reads only their int16 blocks (on:
  // StepWork::attn_local), or in the step's shared attn (off: as before).
  void set_attn_scratch(bool on) { attn_scratch_ = on; }
  bool attn_scratch() const { return attn_scratch_; }
  int64_t act_scratch_floats() const {
    int64_t n = 0;
    for (const ActScratch& s : act_scratch_slots_) n += s.floats;
    return n;
  }

  // Profiling: CPU time summed over threads per phase kind (input norm, qkv, k/v write, attention,
  // o_proj, post norm, gate/up + SiLU, down, final norm, LM head), in ms, since the last reset.
  void set_profiling(bool on) {
    profiling_ = on;
    for (auto& t : profile_ns_) t.store(0);
    pool_.set_profiling(on);
    step_ns_ = 0;
  }
  // Profiling of the hand-offs (StepPool::profile): [ns in step() calls, then the pool's figures:
  // steps, ns in its run(), the calling thread's ns after its last task, per worker task / wait /
  // other ns, tasks, waits].
  std::vector<int64_t> handoff_profile() const {
    std::vector<int64_t> out{step_ns_};
    const std::vector<int64_t> pool = pool_.profile();
    out.insert(out.end(), pool.begin(), pool.end());
    return out;
  }
  std::vector<double> profile_ms() const {
    std::vector<double> out;
    for (const auto& t : profile_ns_) out.push_back(t.load() / 1e6);
    return out;
  }

 private:
  int64_t D, H, Hkv, d, I;
  double eps;
  int64_t window, layers, S = 0, L = 0, max_position = 0;
  const float *cos_ = nullptr, *sin_ = nullptr, *final_norm = nullptr;
  void *k_ = nullptr, *v_ = nullptr;  // the caches: float, or kv::Half when half_kv_
  bool half_kv_ = false;
  std::vector<Layer> layer_;
  Linear head, embed;
  std::vector<at::Tensor> owned_;
  StepPool pool_;
  bool profiling_ = false;
  bool int8_activations_ = false;
  bool bf16_activations_ = false;
  bool int16_activations_ = false;
  bool last_rows_only_ = true;
  bool widen_once_ = true;
  int64_t widened_keys_ = 0;  // the steps' per-worker counts (StepWork::Worker::widened), summed after each step
  // StepWork::kv32's storage (floats): grown, kept (a prompt step allocated its own before).
  std::unique_ptr<float[]> kv32_;
  int64_t kv32_capacity_ = 0, kv32_allocations_ = 0;
  // Per worker, the gate/up and attention tasks' scratch (StepWork::act_local, attn_local): grown by its
  // own worker, kept; a cache line each for the slots (read by every task of their worker, written when
  // one grows).
  struct alignas(64) ActScratch {
    std::unique_ptr<float[]> data;
    float* at = nullptr;  // data's first 64-byte-aligned float
    int64_t floats = 0;
    float* get(int64_t n) {
      if (n > floats) {
        data.reset(new float[n + 16]);
        at = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(data.get()) + 63) & ~uintptr_t{63});
        floats = n;
      }
      return at;
    }
  };
  std::vector<ActScratch> act_scratch_slots_;
  bool act_scratch_ = true;
  bool kv_ahead_ = true;
  bool attn_scratch_ = true;
  int64_t r16_bytes_ = 0;
  std::array<std::atomic<int64_t>, 10> profile_ns_{};
  int64_t step_ns_ = 0;  // profiling: ns in step() calls
  // The step's argmax keys (decode_ops.h's argmax_key) per worker and logits row, argmax_stride_ apart (a
  // cache line or more between two workers'), and the last step's argmax per logits row.
  std::vector<uint64_t> argmax_keys_;
  int64_t argmax_stride_ = 0;
  std::vector<int64_t> argmax_;

  void keep(std::initializer_list<at::Tensor> tensors) { owned_.insert(owned_.end(), tensors); }

  Layer& layer_at(int64_t layer) {
    TORCH_CHECK(layer >= 0 && layer < layers, "layer out of range");
    return layer_[layer];
  }

  Linear& linear_of(int64_t layer, const std::string& role) {
    if (role == "head") return head;
    if (role == "embed") return embed;
    Layer& l = layer_at(layer);
    if (role == "qkv") return l.qkv;
    if (role == "o") return l.o;
    if (role == "gate_up") return l.gate_up;
    if (role == "down") return l.down;
    TORCH_CHECK(false, "unknown linear role ", role);
  }

  void check_complete() const {
    TORCH_CHECK(final_norm && !head.parts.empty() && embed.parts.size() == 1 && embed.cols == D && head.cols == D,
                "NativeDecoder: the head, embedding and final norm must be added before step()");
    for (const Layer& l : layer_)
      TORCH_CHECK(l.input_norm && l.post_norm && l.qkv.rows == (H + 2 * Hkv) * d && l.qkv.cols == D &&
                      l.o.rows == D && l.o.cols == H * d && l.gate_up.rows == 2 * I && l.gate_up.cols == D &&
                      l.down.rows == D && l.down.cols == I,
                  "NativeDecoder: a layer is incomplete or of the wrong shape");
  }

  void embed_row(int64_t token, float* out) const {
    if (!embed.r16[0].data) return dequant_row(embed.parts[0], token, out);
    thread_local std::vector<uint8_t> row;  // R16: the token's row back to the file's blocks
    row.resize(embed.parts[0].row_bytes);
    r16::unpack_rows(embed.r16[0], token, token + 1, row.data());
    QWeight one = embed.parts[0];
    one.data = row.data();
    one.rows = 1;
    dequant_row(one, 0, out);
  }

  // residual += x (when given), then h = rmsnorm(residual) * weight, for each of the B rows.
  void add_and_norm(float* residual, const float* x, const float* weight, float* out, int64_t B) const {
    for (int64_t b = 0; b < B; ++b) {
      float* r = residual + b * D;
      if (x)
        for (int64_t i = 0; i < D; ++i) r[i] += x[b * D + i];
      rms_row(r, weight, eps, D, out + b * D);
    }
  }
};


// One step as phases for the StepPool. Rows are tokens: one per decoding sequence, and every token
// of a prompt chunk (consecutive positions of one slot). Per layer: (0) add + input norm, (1) qkv,
// (2) RoPE'd k and v written into the cache for every row (in practice by the qkv tasks that computed
// them instead: the phase is empty; see kv_in_qkv), (3) attention of every row over its slot's keys
// 0..position (after (2): a chunk's rows see each other causally), (4) o_proj,
// (5) add + post norm, (6) gate and up rows of the same intermediate indices, then silu(gate) * up,
// (7) down; then the final norm and the LM head, for the rows whose logits are wanted only; in a prompt
// chunk the last layer's (3)-(7) too (last_rows: its qkv runs for every row, whose k/v the cache keeps).
// Matrix phases hand out weight rows in units (16 rows, qkv in decoding batches head_dim and in prompt
// chunks 16 rows of q, then head_dim of k and of v, gate/up 32, the head 128 or, in decoding batches on
// several threads, 16), up to task_rows' rows per task (the
// step pool's chunks), times every row of x (8 at a time, quant_matmul.h). In decoding batches the norms
// (5) and (0) are the tails of (4) and the layer before's (7) (has_tail), and the final norm the last
// layer's (7)'s.
class StepWork : public PhasedWork {
 public:
  StepWork(NativeDecoder& m, int64_t T, const int64_t* positions, const int64_t* slots, const int64_t* logit_rows,
           int64_t n_logits, StepBuffers buffers, int threads)
      : m(m), T(T), positions(positions), slots(slots), logit_rows(logit_rows), n_logits(n_logits), buf(buffers),
        bf16x(m.bf16_activations_), Nqkv((m.H + 2 * m.Hkv) * m.d), scratch(threads), packs(threads), workers(threads), decoding(T <= 8),
        kv_in_qkv(decoding || m.d % kRows == 0), norms_in_tails(decoding),
        qkv_unit(decoding ? std::lcm(kRows, m.d) : kRows), q_units(decoding || !kv_in_qkv ? 0 : m.H * m.d / kRows),
        norm_unit(decoding ? kRows : kNormRows), head_unit(threads > 1 && decoding ? kRows : kHeadRows),
        qkv_chunk(task_rows(Nqkv, qkv_unit, threads) / qkv_unit), d_chunk(task_rows(m.D, kRows, threads) / kRows),
        act_chunk(task_rows(m.I, kActRows, threads) / kActRows),
        head_chunk(decoding ? task_rows(m.head.rows, kHeadRows, threads) / head_unit : kPromptHeadUnits),
        head_tasks(threads > 1 && T * m.Hkv < 4 * threads ? m.H / m.Hkv : 1),
        last_rows(last_layer_rows(m, T, n_logits)), act_local(act_local_of(m, buffers, decoding)),
        attn_local(attn_local_of(m, buffers, decoding)) {
    if ((act_local || attn_local) && static_cast<int64_t>(m.act_scratch_slots_.size()) < threads)
      m.act_scratch_slots_.resize(threads);
#if defined(VOXLANE_GEMM)
    if (!decoding && m.half_kv_ && kv_in_qkv && m.d <= 128 && m.widen_once_) find_runs();
#endif
  }

  // The rows of the last layer's phases after its qkv (attention, o_proj, post norm, gate/up, down) and
  // of the final norm: T (every row, as the layers before), or, in a prompt chunk (T > 8) whose logits
  // are wanted for n < T rows (only: NativeDecoder::set_last_rows_only), the n rows gathered (row i:
  // logit row i; llama.cpp's inp_out_ids), and as many copies of the first as make kLastMinRows: the
  // kernels then run on as many rows as their prompt paths need (a row's results do not depend on the
  // others', but some kernels' paths do on the count of rows), so the logits are bit-equal to those of
  // every row. No logits (a chunk of a prompt before its last): 0 rows, nothing after the last qkv.
  // Decoding batches keep T (their kernels are per count of rows; all their rows are usually wanted), and
  // so do bf16 activations (a row's products there depend on its block of 16: prefill_gemm.h's
  // bf16x_panel sums two blocks' tiles otherwise than a lone last block's).
  // Why: a 43-token prompt's last layer is ~1/30 of its work after the qkv phases.
  static int64_t last_layer_rows(const NativeDecoder& m, int64_t T, int64_t n) {
    if (!m.last_rows_only_ || m.bf16_activations_ || n >= T) return T;
    if (n == 0) return 0;
    return T > 8 ? std::min(T, std::max(n, kLastMinRows)) : T;
  }

  // Whether a prompt chunk's gate/up tasks keep their gate and up outputs and silu(gate) * up in their
  // worker's scratch (NativeDecoder::ActScratch; the step's gate_up and act buffers are then not allocated)
  // instead of the shared buffers: where act's int16 blocks are down's only input (int16 activations,
  // every layer's down in whole R16 groups), and NativeDecoder::set_act_scratch is on. Why: a task's 128
  // columns of the shared buffers are 43 rows x 512 B spread over 43 rows of 12 KB (gate_up) and 6 KB
  // (act): ~130 4 KB pages and ~0.8 MB a layer that nobody reads after the task, written where the other
  // core's task may have written them the layer before; a task's scratch (43 x (2 x 128 + 16) floats, ~46
  // KB, 12 pages) stays in its own core's L1 / L2. The same products and SiLU, so the same acti, bit for
  // bit. Measured (docs/engine.md, fifteenth session): the gate/up phase's CPU 0.95x on one thread.
  // Decoding batches (<= 8 rows) keep the shared buffers (not measured there).
  static bool act_local_of(const NativeDecoder& m, const StepBuffers& buf, bool decoding) {
    return !decoding && m.act_scratch_ && only_blocks_read(m, buf.acti, buf.actq, &Layer::down);
  }

  // Whether a prompt's attention tasks (16 rows, a kv head) write their outputs into their worker's scratch
  // and quantize them from there into attni, instead of writing the step's shared attn: where attni is
  // o_proj's only input (int16 activations, o in whole R16 groups), in prompt chunks (not the last layer's
  // gathered rows: attend_gathered copies rows of attn), and NativeDecoder::set_attn_scratch is on.
  static bool attn_local_of(const NativeDecoder& m, const StepBuffers& buf, bool decoding) {
    return !decoding && m.attn_scratch_ && only_blocks_read(m, buf.attni, buf.attnq, &Layer::o);
  }

  // Whether every layer's `matrix` reads its input only as the int16 blocks xi (the step quantizes it to
  // them, not to int8 blocks xq, and the matrix is in whole R16 groups): act_local_of and attn_local_of.
  static bool only_blocks_read(const NativeDecoder& m, const r16::I16Rows& xi, const Q8Rows& xq,
                               Linear Layer::*matrix) {
    if (!xi.q1 || xq.q) return false;
    for (const Layer& layer : m.layer_)
      if (!(layer.*matrix).reads_only_xi()) return false;
    return true;
  }

  // base moved back by n0 floats, as an integer (no pointer before base): what a writer that indexes its
  // output by absolute column or row (Linear::run's y, attend_rows' out) takes to write column / row n0
  // at base.
  static float* moved_back(float* base, int64_t n0) {
    return reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(base) - n0 * sizeof(float));
  }

  int64_t phases() const override { return m.layers * kPerLayer + 2; }

  int64_t size(int64_t p) const override {
    if (p >= m.layers * kPerLayer)
      return p == m.layers * kPerLayer ? (norms_in_tails || !last_rows ? 0 : 1)
                                       : (n_logits ? chunks(m.head.rows, head_unit) : 0);
    const int64_t rows = rows_of(p);
    if (!rows) return 0;
    switch (p % kPerLayer) {
      case 0: return norms_in_tails && p > 0 ? 0 : chunks(T, norm_unit);  // layer 0's input norm stays a phase
      case 5: return norms_in_tails ? 0 : chunks(rows, norm_unit);
      case 1: return q_units ? q_units + 2 * m.Hkv : chunks(Nqkv, qkv_unit);
      case 2: return kv_in_qkv ? 0 : T * m.Hkv;
      case 3:
        if (gathered(p)) return n_logits * m.Hkv;  // a logits row and kv head a unit
        return decoding ? T * m.Hkv * head_tasks : chunks(T, kRows) * m.Hkv;  // prompt chunks: 16 rows a unit
      case 6: return chunks(m.I, kActRows);
      default: return chunks(m.D, kRows);  // o_proj, down
    }
  }

  // Whether phase p (or a layer's phase of kind >= 3) works on the gathered rows: the last layer's after
  // its qkv, when last_rows < T.
  bool gathered(int64_t p) const { return last_rows < T && p / kPerLayer == m.layers - 1 && p % kPerLayer >= 3; }
  // The rows of phase p: last_rows where it works on the gathered rows, else T.
  int64_t rows_of(int64_t p) const { return gathered(p) ? last_rows : T; }

  int64_t max_chunk(int64_t p) const override {
    if (p >= m.layers * kPerLayer) return p == m.layers * kPerLayer ? 1 : head_chunk;
    switch (p % kPerLayer) {
      case 1: return qkv_chunk;
      case 4: case 7: return d_chunk;
      case 6: return act_chunk;
      case 0: case 5: return decoding ? 1 : kPromptNormTaskRows / kNormRows;
      default: return 1;
    }
  }

  // The stall fallback's count of this step (PhasedWork::weight): a decoding batch 1, a prompt chunk of T
  // rows T / 8 (rounded up): about its time in decode steps (SmolLM2 on two threads: a 43-token prompt
  // ~24 ms, 512 tokens ~290, a decode step ~4.6-5).
  int64_t weight() const override { return decoding ? 1 : chunks(T, 8); }

  // A prompt chunk's o_proj, gate/up, down and LM head phases are split in two halves that the two ends of
  // the step pool each walk upwards (StepPool's kHalves): a matrix task reads its weight groups upwards, so
  // a back end taking each task below its last started every task on cold weights. Measured (43-token
  // prompt, two threads, alternating prefill by prefill): the wall 0.97-0.98x, gate/up's CPU 0.96x. qkv
  // keeps one range (its top units are the k/v heads, which also write the cache: with halves its CPU and
  // attention's rose ~0.1 ms), and so do decoding batches (their back end's VNNI kernel walks its rows down).
  bool halves(int64_t p) const override {
    if (decoding) return false;
    if (p >= m.layers * kPerLayer) return p > m.layers * kPerLayer;
    const int64_t kind = p % kPerLayer;
    return kind == 4 || kind == 6 || kind == 7;
  }

  // In decoding batches the norms run as the tails of the matrix phases before them: o_proj's the post
  // norm, down's the next layer's input norm (the last layer's: the final norm), so a layer has 5 phases
  // (qkv, attention, o_proj, gate/up, down) and 5 hand-offs instead of 7.
  bool has_tail(int64_t p) const override {
    return norms_in_tails && p < m.layers * kPerLayer && (p % kPerLayer == 4 || p % kPerLayer == 7);
  }

  void tail(int64_t p, int) override {
    const int64_t l = p / kPerLayer;
    if (p % kPerLayer == 4) return timed(5, [&] { post_norm(p + 1, 0, rows_of(p)); });
    if (l + 1 < m.layers) return timed(0, [&] { input_norm(l + 1, 0, T); });
    timed(8, [&] { final_norm(); });
  }

  // Rows [n0, n1) of phase p's matrix (its first 4 KB in the task's order) while the phase before ends.
  void prefetch(int64_t p, int64_t u0, int64_t u1, bool descending) override {
    if (p > m.layers * kPerLayer) return m.head.prefetch(u0 * head_unit, std::min(m.head.rows, u1 * head_unit), descending);
    if (p == m.layers * kPerLayer) return;
    const Layer& layer = m.layer_[p / kPerLayer];
    switch (p % kPerLayer) {
      case 1: return layer.qkv.prefetch(qkv_row(u0), qkv_row(u1), descending);
      case 4: return layer.o.prefetch(u0 * kRows, std::min(m.D, u1 * kRows), descending);
      case 6: return layer.gate_up.prefetch(u0 * kActRows, std::min(m.I, u1 * kActRows), descending);
      case 7: return layer.down.prefetch(u0 * kRows, std::min(m.D, u1 * kRows), descending);
      default: return;
    }
  }

  // Units [u0, u1) of phase p, their CPU time added to the decoder's profile when profiling is on.
  void run(int64_t p, int64_t u0, int64_t u1, int worker, bool descending) override {
    const int64_t kind = p >= m.layers * kPerLayer ? kPerLayer + (p - m.layers * kPerLayer) : p % kPerLayer;
    timed(kind, [&] { run_task(p, u0, u1, worker, descending); });
  }

  // The keys widened for prompt attention in this step (Worker::widened summed).
  int64_t widened() const {
    int64_t n = 0;
    for (const Worker& w : workers) n += w.widened;
    return n;
  }

  template <class F> void timed(int64_t kind, F&& f) {
    if (!m.profiling_) return f();
    const auto start = std::chrono::steady_clock::now();
    f();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
    m.profile_ns_[kind].fetch_add(ns.count(), std::memory_order_relaxed);
  }

  // Rows [r0, r1) of h = input_norm(residual (+ delta: the layer before's down)), and their blocks.
  void input_norm(int64_t l, int64_t r0, int64_t r1) const {
    const int64_t D = m.D;
    m.add_and_norm(buf.residual + r0 * D, l == 0 ? nullptr : buf.delta + r0 * D, m.layer_[l].input_norm,
                   buf.h + r0 * D, r1 - r0);
    quantize_h(r0, r1);
  }
  // Rows [r0, r1) of phase p's (a post norm's) h = post_norm(residual + delta: o_proj's), and their blocks.
  // Gathered rows (the last layer's): row i's residual that of logit row i (after n_logits: of the first),
  // gathered into buf.last.
  void post_norm(int64_t p, int64_t r0, int64_t r1) const {
    const int64_t D = m.D;
    float* residual = buf.residual;
    if (gathered(p)) {
      residual = buf.last;
      for (int64_t i = r0; i < r1; ++i)
        std::memcpy(residual + i * D, buf.residual + logit_rows[i < n_logits ? i : 0] * D, D * sizeof(float));
    }
    m.add_and_norm(residual + r0 * D, buf.delta + r0 * D, m.layer_[p / kPerLayer].post_norm, buf.h + r0 * D, r1 - r0);
    quantize_h(r0, r1);
  }
  void quantize_h(int64_t r0, int64_t r1) const { quantize_input(buf.h, r0, r1, buf.hq, buf.hi); }
  // Rows [r0, r1) of x (an input of the next matrices, D wide) into the step's int8 or int16 blocks of
  // it, whichever the activations are (neither: fp32 or bf16 activations read x itself).
  void quantize_input(const float* x, int64_t r0, int64_t r1, const Q8Rows& q8, const r16::I16Rows& i16) const {
    const int64_t D = m.D;
    if (q8.q) quantize_rows(x + r0 * D, r1 - r0, D, q8.at_row(r0));
    if (i16.q1) r16::quantize_rows(x + r0 * D, r1 - r0, D, i16.at_row(r0));
  }
  // The final norm of the rows whose logits are wanted, gathered.
  void final_norm() const {
    const int64_t D = m.D;
    const bool gathered_rows = last_rows < T;  // logit row i is row i of buf.last and delta
    for (int64_t i = 0; i < n_logits; ++i) {
      const int64_t r = gathered_rows ? i : logit_rows[i];
      m.add_and_norm((gathered_rows ? buf.last : buf.residual) + r * D, buf.delta + r * D, m.final_norm,
                     buf.h_logits + i * D, 1);
    }
    quantize_input(buf.h_logits, 0, n_logits, buf.logitq, buf.logiti);
  }

  void run_task(int64_t p, int64_t u0, int64_t u1, int worker, bool descending) {
    const int64_t D = m.D, I = m.I;
    if (p >= m.layers * kPerLayer) {
      if (p == m.layers * kPerLayer) return final_norm();
      const int64_t V = m.head.rows, n0 = u0 * head_unit, n1 = std::min(V, u1 * head_unit);
      m.head.run(buf.h_logits, n_logits, buf.logits, V, n0, n1, q8(buf.logitq), pack(worker, p), bf16x, i16(buf.logiti),
                 descending);
      for (int64_t i = 0; i < n_logits; ++i) {  // the rows' first maxima so far, while these logits are in cache
        uint64_t& best = m.argmax_keys_[worker * m.argmax_stride_ + i];
        best = std::max(best, argmax_key(buf.logits + i * V + n0, n1 - n0, n0));
      }
      return;
    }
    const int64_t l = p / kPerLayer;
    const Layer& layer = m.layer_[l];
    const int64_t M = rows_of(p);
    const int64_t r0 = u0 * norm_unit, r1 = std::min(M, u1 * norm_unit);  // the norms' rows
    switch (p % kPerLayer) {
      case 0: return input_norm(l, r0, r1);
      case 1: case 2: case 3:
        if (m.half_kv_) return cache_task(args_of<kv::Half>(l), p, u0, u1, worker, descending);
        return cache_task(args_of<float>(l), p, u0, u1, worker, descending);
      case 4: return layer.o.run(buf.attn, M, buf.delta, D, u0 * kRows, std::min(D, u1 * kRows), q8(buf.attnq),
                                 pack(worker, p), bf16x, i16(buf.attni), descending);
      case 5: return post_norm(p, r0, r1);
      case 6: {  // gate rows i and up rows I + i by the same task: silu(gate) * up needs no other phase
        const int64_t a0 = u0 * kActRows, a1 = std::min(I, u1 * kActRows);
        if (act_local) return gate_up_local(layer, M, a0, a1, worker, p, descending);
        const int64_t ld = gate_up_stride(I);
        layer.gate_up.run(buf.h, M, buf.gate_up, ld, a0, a1, q8(buf.hq), pack(worker, p), bf16x, i16(buf.hi), descending);
        layer.gate_up.run(buf.h, M, buf.gate_up, ld, I + a0, I + a1, q8(buf.hq), pack(worker, p), bf16x, i16(buf.hi),
                          descending);
        for (int64_t b = 0; b < M; ++b) {
          const float *g = buf.gate_up + b * ld, *u = g + I;
          float* o = buf.act + b * I;
          silu_mul_into(g + a0, u + a0, o + a0, a1 - a0);
          if (buf.actq.q) {  // this task's blocks of 32 (I is a multiple of 32 when int8 activations are on)
            const Q8Rows row = buf.actq.at_row(b);
            quantize_q8(o + a0, a1 - a0, row.q + a0, row.d + a0 / kQ8, row.s + a0 / kQ8);
          }
        }
        if (buf.acti.q1)  // this task's blocks of 32 of every row, 16 rows at a time
          for (int64_t c = a0; c < a1; c += r16::kBlock) r16::quantize_column(buf.act + c, M, I, buf.acti, c);
        return;
      }
      default: return layer.down.run(buf.act, M, buf.delta, D, u0 * kRows, std::min(D, u1 * kRows), q8(buf.actq),
                                     pack(worker, p), bf16x, i16(buf.acti), descending);
    }
  }

  // Gate/up columns [a0, a1) of M rows (act_local): row b's gate values at s + b ld, its up values w
  // further (w = a1 - a0, ld = 2 w + 16: the 16 as gate_up_stride's), silu(gate) * up written over the
  // gate values, then quantized into acti's blocks [a0, a1) of every row, as the shared buffers' path does.
  void gate_up_local(const Layer& layer, int64_t M, int64_t a0, int64_t a1, int worker, int64_t p, bool descending) {
    const int64_t I = m.I, w = a1 - a0, ld = 2 * w + 16;
    float* s = m.act_scratch_slots_[worker].get(M * ld);
    // run() writes y[b ldy + n] for its rows n: columns a0 (gate) and I + a0 (up) at s and s + w.
    layer.gate_up.run(buf.h, M, moved_back(s, a0), ld, a0, a1, q8(buf.hq), pack(worker, p), bf16x, i16(buf.hi),
                      descending);
    layer.gate_up.run(buf.h, M, moved_back(s + w, I + a0), ld, I + a0, I + a1, q8(buf.hq), pack(worker, p), bf16x,
                      i16(buf.hi), descending);
    for (int64_t b = 0; b < M; ++b) silu_mul_into(s + b * ld, s + b * ld + w, s + b * ld, w);
    for (int64_t c = a0; c < a1; c += r16::kBlock) r16::quantize_column(s + (c - a0), M, ld, buf.acti, c);
  }

  // Layer l's attention over the cache (its elements KV: the decoder's float or kv::Half).
  template <class KV>
  AttentionArgs<KV> args_of(int64_t l) const {
    const int64_t stride = m.S * m.Hkv * m.L * m.d;
    return {buf.qkv, buf.cos, buf.sin, static_cast<KV*>(m.k_) + l * stride, static_cast<KV*>(m.v_) + l * stride,
            slots, positions, buf.attn, m.H, m.Hkv, m.d, m.L, m.window};
  }

  // Units [u0, u1) of the phases that touch the cache: (1) qkv (and, where kv_in_qkv, the k/v its
  // rows computed written), (2) the k/v written, (3) attention.
  template <class KV>
  void cache_task(const AttentionArgs<KV>& args, int64_t p, int64_t u0, int64_t u1, int worker, bool descending) {
    const Layer& layer = m.layer_[p / kPerLayer];
    switch (p % kPerLayer) {
      case 1: {
        const int64_t n0 = qkv_row(u0), n1 = qkv_row(u1);
        layer.qkv.run(buf.h, T, buf.qkv, Nqkv, n0, n1, q8(buf.hq), pack(worker, p), bf16x, i16(buf.hi), descending);
        if (kv_in_qkv) write_own_kv(args, n0, n1, worker);
        return;
      }
      case 2:
        for (int64_t t = u0; t < u1; ++t) write_kv(args, t);
        return;
      default:
        if (gathered(p)) return attend_gathered(args, u0, u1, worker);
        for (int64_t task = u0; task < u1; ++task) {
          if (!decoding) {  // a prompt chunk's rows 16 at a time (attend_rows), the most keys first
            const int64_t rank = attention_rank(task), g = rank % m.Hkv;
            const int64_t b0 = (chunks(T, kRows) - 1 - rank / m.Hkv) * kRows, n = std::min(kRows, T - b0);
            const auto [keys, values] = keys_of(b0, g);
            count_widened(rows_together(args, b0, n), positions[b0] + n, keys, worker);
            if (attn_local) {  // rows b0.. of the worker's scratch (its kv head's columns), then attni
              const int64_t Hd = m.H * m.d, R = m.H / m.Hkv, c0 = g * R * m.d;
              float* s = m.act_scratch_slots_[worker].get(n * Hd);
              AttentionArgs<KV> a = args;
              a.out = moved_back(s, b0 * Hd);
              attend_rows(a, b0, n, g, scratch[worker], keys, values);
              for (int64_t b = b0; b < b0 + n; ++b) r16::quantize(s + (b - b0) * Hd + c0, R * m.d, buf.attni.at_row(b), c0);
              continue;
            }
            attend_rows(args, b0, n, g, scratch[worker], keys, values);
            if (buf.attnq.q || buf.attni.q1)
              for (int64_t b = b0; b < b0 + n; ++b) quantize_heads(b * m.Hkv + g, 0, m.H / m.Hkv);
            continue;
          }
          const int64_t t = task / head_tasks, h0 = (task % head_tasks) * (m.H / m.Hkv / head_tasks);
          const int64_t h1 = h0 + m.H / m.Hkv / head_tasks;
          // This task's pages of keys and values, and those of the task this thread likely takes next
          // (the step pool's front end walks up, its back end down).
          const int64_t next = descending ? t - 1 : t + 1;
          const bool has_next = next >= 0 && next < T * m.Hkv;
          prefetch_kv_pages(args, t, true);
          if (has_next) prefetch_kv_pages(args, next, false);
          // the next task's keys and values, asked for while this one computes
          const TaskKV<KV> ahead = m.kv_ahead_ && has_next ? attended_kv(args, next) : TaskKV<KV>{};
          attend(args, t, scratch[worker], h0, h1, nullptr, ahead);
          if (buf.attnq.q || buf.attni.q1) quantize_heads(t, h0, h1);
        }
        return;
    }
  }

 private:
  static constexpr int64_t kPerLayer = 8;
  static constexpr int64_t kRows = 16;       // rows per task: a multiple of every row group of quant_matmul.h
  static constexpr int64_t kHeadRows = 128;  // the LM head's tasks (49k-152k rows)
  static constexpr int64_t kActRows = kQ8;   // gate/up: a task's act values are whole Q8 blocks of each row
  static constexpr int64_t kTasksPerThread = 8;
  // Prompt chunks: the most rows of a task (the matrices' weight rows, the norms' rows), the norms' rows
  // per unit (a 43-token prompt's norm was 3 tasks of 16, 16 and 11 rows: on two threads one thread ran
  // two of them while the other waited), and the LM head's units per task (of kHeadRows; its rows are a
  // prompt's last rows only, often one).
  static constexpr int64_t kPromptTaskRows = 128, kPromptNormTaskRows = 64, kNormRows = 4, kPromptHeadUnits = 4;
  // The fewest gathered rows of the last layer (last_layer_rows): as many as the products of prompt rows
  // take their prompt paths with (prefill GEMM, bf16 and int8 tiles; the R16 tiles').
  static constexpr int64_t kLastMinRows = 16;
  static_assert(kLastMinRows >= kGemmMinRows && kLastMinRows >= kBf16MinRows && kLastMinRows >= kQ8TileMinRows &&
                kLastMinRows >= r16::kTileMinRows);
  static int64_t chunks(int64_t rows, int64_t size) { return (rows + size - 1) / size; }

  // The most rows per task of a matrix of `rows` rows: `unit` (a multiple of it), or with several threads
  // at batch <= 8, about kTasksPerThread tasks per thread (the step pool makes the tasks smaller, down to
  // one unit, where the threads meet at a phase's end). Why: a 16-row task of Qwen2.5-0.5B's q/k/v or
  // o_proj streams ~10 KB of weights, while each task updates counters that the other core wrote
  // last (the ticket and the phase's done count: a cache-line transfer each).
  // One thread keeps the small tasks (its counters stay in its own cache). Prompt chunks: up to
  // kPromptTaskRows rows (the step pool's chunks: a quarter of what is left on two threads, single units
  // where the threads meet). Why: in AMX tiles a 16-row unit of a 43-token prompt takes ~3 us (qkv,
  // o_proj), and on two threads each task's ticket and done count cost ~0.15-0.2 us (profiled: ~1.1 ms of
  // each thread's 24 in ~5,000 tasks). 128 rows, not 64 (the thirteenth session): each task's first weight
  // group comes unprefetched (a task prefetches the group after its last, and the back end's thread walks
  // down), ~1 us a task; the step pool's two-thread run of SmolLM2's down by 43 12-bit rows (a harness, 2
  // layers a step, min of 3,000 alternating): 167-169 us a step with tasks of up to 128 rows against
  // 185-186 with 64, 164-166 with each thread's half as one task.
  int64_t task_rows(int64_t rows, int64_t unit, int threads) const {
    if (T > 8) return std::max(unit, kPromptTaskRows / unit * unit);
    if (threads < 2) return unit;
    const int64_t per = chunks(rows, threads * kTasksPerThread);
    return std::max(unit, chunks(per, unit) * unit);
  }
  // A prompt chunk's attention unit u -> the rank of its (16 rows, kv head) by keys (0: the last rows,
  // the most keys; a rank's kv heads one after another): ranks 0, 2, 4, ... from the phase's front,
  // 1, 3, 5, ... from its back, so both threads start with the longest tasks and meet at the shortest.
  // Before (ranks in unit order) a 43-token prompt's 9 tasks (rows 32-42, 16-31 and 0-15 of each kv
  // head: ~418, 392 and 136 query-key pairs a head), taken from both ends (one thread the longest, the
  // other the shortest first), ended ~1.12x the phase's even split (one thread idle ~21 % of it; with
  // these costs, simulated), now ~1.04x (~7 %).
  int64_t attention_rank(int64_t u) const {
    const int64_t n = chunks(T, kRows) * m.Hkv;
    return 2 * u < n ? 2 * u : 2 * (n - 1 - u) + 1;
  }
  // The first row of qkv unit u (u = the phase's size: Nqkv).
  int64_t qkv_row(int64_t u) const {
    if (!q_units) return std::min(Nqkv, u * qkv_unit);
    return u <= q_units ? u * kRows : m.H * m.d + (u - q_units) * m.d;
  }
  // Units [u0, u1) of the last layer's attention over gathered rows: unit u = (row i, kv head g) = (u / Hkv,
  // u % Hkv) attends logit row i's queries of g as attend_rows does in its task of 16 rows (attend_row_of),
  // into row i of attn; (0, g) also copies its heads into the rows after n_logits (last_rows).
  template <class KV>
  void attend_gathered(const AttentionArgs<KV>& args, int64_t u0, int64_t u1, int worker) {
    const int64_t Hkv = m.Hkv, R = m.H / Hkv, Hd = m.H * m.d, heads = R * m.d;
    const bool quantized = buf.attnq.q || buf.attni.q1;
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t i = u / Hkv, g = u % Hkv, r = logit_rows[i], b0 = r / kRows * kRows;
      const auto [keys, values] = keys_of(r, g);
      count_widened(rows_together(args, b0, std::min(kRows, T - b0)), positions[r] + 1, keys, worker);
      attend_row_of(args, b0, std::min(kRows, T - b0), r, g, buf.attn + i * Hd, scratch[worker], keys, values);
      if (quantized) quantize_heads(i * Hkv + g, 0, R);
      for (int64_t j = n_logits; i == 0 && j < last_rows; ++j) {
        std::memcpy(buf.attn + j * Hd + g * heads, buf.attn + g * heads, heads * sizeof(float));
        if (quantized) quantize_heads(j * Hkv + g, 0, R);
      }
    }
  }

  static const Q8Rows* q8(const Q8Rows& rows) { return rows.q ? &rows : nullptr; }
  static const r16::I16Rows* i16(const r16::I16Rows& rows) { return rows.q1 ? &rows : nullptr; }

  // The worker's XPack for phase p's input (a prompt chunk's rows only; packed by its first task there).
  XPack* pack(int worker, int64_t p) {
    if (T < kGemmMinRows) return nullptr;
    XPack& x = packs[worker];
    if (x.tag != p) {
      x.tag = p;
      x.invalidate();
    }
    return &x;
  }

  // Attention task t = (row b, kv head g) wrote heads r0..r1 of the group's R, outputs
  // [(g R + r0) d, (g R + r1) d) of row b: their Q8 blocks (head_dim is a multiple of 32 when int8
  // activations are on).
  void quantize_heads(int64_t t, int64_t r0, int64_t r1) const {
    const int64_t Hkv = m.Hkv, R = m.H / Hkv, d = m.d, b = t / Hkv, g = t % Hkv, c0 = (g * R + r0) * d;
    if (buf.attni.q1) return r16::quantize(buf.attn + b * m.H * d + c0, (r1 - r0) * d, buf.attni.at_row(b), c0);
    const Q8Rows row = buf.attnq.at_row(b);
    quantize_q8(buf.attn + b * m.H * d + c0, (r1 - r0) * d, row.q + c0, row.d + c0 / kQ8, row.s + c0 / kQ8);
  }

  // The qkv task of rows [n0, n1) (a multiple of head_dim apart, so every head's rows are one task's)
  // writes the new keys (RoPE'd) and values of the kv heads whose rows it computed, for every row of
  // the step, so no phase of its own is needed: attention comes after the whole qkv phase anyway.
  template <class KV>
  void write_own_kv(const AttentionArgs<KV>& args, int64_t n0, int64_t n1, int worker) {
    const int64_t d = m.d, k0 = m.H * d, v0 = (m.H + m.Hkv) * d;
    for (int64_t g = 0; g < m.Hkv; ++g) {
      const bool k = n0 <= k0 + g * d && k0 + (g + 1) * d <= n1, v = n0 <= v0 + g * d && v0 + (g + 1) * d <= n1;
      for (int64_t b = 0; b < T && (k || v); ++b) {
        if (k) write_k(args, b, g);
        if (v) write_v(args, b, g);
      }
      if (k || v) widen_runs(args, g, k, v, worker);
    }
  }

  // Prompt chunks over an fp16 cache: the runs of rows that attend_rows16 may take together (one slot's
  // consecutive positions, kBlockMinRows rows or more), and per run and kv head its slot's keys and values
  // 0..the run's last position as fp32 in kv32 (widened from the cache once per layer by the qkv task that
  // wrote the kv head's rows, widen_runs; attention's tasks read them: keys_of). Why: each attention task
  // (16 rows, kv head) widened its keys 0..p0+n-1 and values itself, O(T^2) over a prompt (~14 % of
  // attention's CPU at 512 tokens, docs/engine.md's twelfth session). The same values either way.
  struct Run {
    int64_t first, keys;  // its first row; keys: its slot's positions 0..keys-1
    int64_t at;           // kv head g's keys at kv32 + at + g keys d, its values kv32_values further
  };
  std::vector<Run> runs;
  std::vector<int64_t> run_of;  // per row: its run's index, or -1
  float* kv32 = nullptr;  // NativeDecoder::kv32_
  int64_t kv32_values = 0;

  void find_runs() {
    run_of.assign(T, -1);
    int64_t at = 0;
    for (int64_t b0 = 0, b1; b0 < T; b0 = b1) {
      for (b1 = b0 + 1; b1 < T && slots[b1] == slots[b0] && positions[b1] == positions[b1 - 1] + 1; ++b1) {}
      if (b1 - b0 < kBlockMinRows) continue;
      runs.push_back({b0, positions[b1 - 1] + 1, at});
      std::fill(run_of.begin() + b0, run_of.begin() + b1, static_cast<int64_t>(runs.size() - 1));
      at += m.Hkv * runs.back().keys * m.d;
    }
    kv32_values = at;
    if (2 * at > m.kv32_capacity_) {
      m.kv32_.reset(new float[2 * at]);
      m.kv32_capacity_ = 2 * at;
      ++m.kv32_allocations_;
    }
    kv32 = m.kv32_.get();
  }
  // Kv head g's keys (k) and values (v) of the runs' slots, widened into kv32 (after the head's rows are written).
  template <class KV>
  void widen_runs(const AttentionArgs<KV>& a, int64_t g, bool k, bool v, int worker) {
    if constexpr (std::is_same_v<KV, kv::Half>) {
      for (const Run& run : runs) {
        const int64_t d = m.d, offset = ((slots[run.first] * m.Hkv + g) * m.L) * d;
        float* keys = kv32 + run.at + g * run.keys * d;
        if (k) kv::widen(a.k_cache + offset, run.keys * d, keys);
        if (v) kv::widen(a.v_cache + offset, run.keys * d, keys + kv32_values);
        if (k) workers[worker].widened += run.keys;
      }
    }
  }
  // The n_keys keys a task attending rows together widens itself (keys_of had none), counted.
  void count_widened(bool together, int64_t n_keys, const float* keys, int worker) {
    if (together && !keys && m.half_kv_) workers[worker].widened += n_keys;
  }
  // Row b's slot's fp32 keys and values of kv head g (positions 0..), or nulls (not in a run).
  std::pair<const float*, const float*> keys_of(int64_t b, int64_t g) const {
    if (run_of.empty() || run_of[b] < 0) return {nullptr, nullptr};
    const Run& run = runs[run_of[b]];
    const float* keys = kv32 + run.at + g * run.keys * m.d;
    return {keys, keys + kv32_values};
  }

  NativeDecoder& m;
  const int64_t T;
  const int64_t *positions, *slots, *logit_rows;
  const int64_t n_logits;
  const StepBuffers buf;
  const bool bf16x;  // bf16 activations (NativeDecoder::set_bf16_activations)
  const int64_t Nqkv;
  std::vector<AttentionScratch> scratch;  // one per worker
  std::vector<XPack> packs;  // one per worker: the bf16 tiles of the input of the phase it last packed
  // One per worker, a cache line each (written by its own thread only): the keys it widened for prompt
  // attention (NativeDecoder::widened_keys sums them after the step; before, a shared atomic that both
  // threads' qkv and attention tasks bumped).
  struct alignas(64) Worker {
    int64_t widened = 0;
  };
  std::vector<Worker> workers;
  const bool decoding;  // <= 8 rows: decoding batches (attend() per row; else attend_rows per 16 rows)
  // Each qkv task writes the k/v rows it computed into the cache (write_own_kv; the k/v phase is then
  // empty), its units whole heads of k and v: in decoding batches every unit a multiple of head_dim
  // rows, in prompt chunks (when head_dim is a multiple of 16) q's rows 16 at a time, then k's and v's
  // a head each (q_units: the q units). Why in prompt chunks: the k/v phase was T x Hkv tasks of ~0.1 us
  // each (129 for a 43-token prompt of SmolLM2, ~3,900 a prompt) and a hand-off per layer; on two
  // threads each task's ticket and done count cost more than its work (a cache line from the other
  // core each).
  const bool kv_in_qkv;
  const bool norms_in_tails;  // decoding batches: the norms are tails of the matrix phases before them
  // Rows per unit of the qkv phase (a multiple of head_dim in decoding batches; else 16, q_units of q
  // and then head_dim a unit) and of the LM head's (16 in decoding batches on several threads, else
  // kHeadRows); o_proj, down: kRows, gate/up: kActRows.
  const int64_t qkv_unit, q_units, norm_unit, head_unit;
  // The most units per task of each matrix phase: task_rows' rows (decoding batches on one thread: 1).
  const int64_t qkv_chunk, d_chunk, act_chunk, head_chunk;
  // Attention tasks per (row, kv head): its R query heads split in this many (R, or 1 when there are
  // enough (row, kv head) pairs for the threads): a batch-1 step of SmolLM2 has 3 kv heads for 2 threads.
  const int64_t head_tasks;
  const int64_t last_rows;  // last_layer_rows
  const bool act_local;     // act_local_of
  const bool attn_local;    // attn_local_of
};

// The quantized activation blocks of the step's four matrix inputs (h, attn, act, h_logits) in one int8
// and one fp32 allocation: input i has rows[i] rows of widths[i] values (a multiple of 32), bytes(rows,
// width) int8 bytes and each block of 32 `floats` fp32 words (scales, sums). make(q, scales, values,
// width) -> the input's Rows view of its pieces; an input without rows keeps its default (null: the
// step does not quantize it).
template <class Rows, class Bytes, class Make>
static void carve_blocks(const int64_t (&widths)[4], std::array<int64_t, 4> rows, Bytes bytes, int floats,
                         std::array<Rows*, 4> targets, at::Tensor& q_bytes, at::Tensor& q_scales, Make make) {
  constexpr int64_t kBlockValues = 32;  // kQ8 and r16::kBlock
  static_assert(kQ8 == kBlockValues && r16::kBlock == kBlockValues);
  int64_t values = 0, total = 0;
  for (int i = 0; i < 4; ++i) values += rows[i] * widths[i], total += bytes(rows[i], widths[i]);
  q_bytes = at::empty({total}, at::TensorOptions().dtype(at::kChar));
  q_scales = at::empty({floats * values / kBlockValues}, at::TensorOptions().dtype(at::kFloat));
  int8_t* q = q_bytes.data_ptr<int8_t>();
  float* sc = q_scales.data_ptr<float>();
  for (int i = 0; i < 4; ++i) {
    const int64_t v = rows[i] * widths[i];
    if (!v) continue;
    *targets[i] = make(q, sc, v, widths[i]);
    q += bytes(rows[i], widths[i]);
    sc += floats * v / kBlockValues;
  }
}

at::Tensor NativeDecoder::step(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& slots,
                               const at::Tensor& logit_rows) {
  check_complete();
  const auto started = std::chrono::steady_clock::now();
  const int64_t T = tokens.numel(), n = logit_rows.numel();
  auto int64_rows = [](const at::Tensor& t) { return t.dim() == 1 && t.scalar_type() == at::kLong && t.is_contiguous(); };
  TORCH_CHECK(T > 0 && int64_rows(tokens) && int64_rows(positions) && int64_rows(slots) && int64_rows(logit_rows) &&
                  positions.numel() == T && slots.numel() == T,
              "tokens, positions, slots: contiguous int64 [T]; logit_rows: contiguous int64 [n]");
  const int64_t *tok = tokens.data_ptr<int64_t>(), *pos = positions.data_ptr<int64_t>(), *slot = slots.data_ptr<int64_t>();
  const int64_t* rows = logit_rows.data_ptr<int64_t>();
  for (int64_t r = 0; r < T; ++r) {
    TORCH_CHECK(tok[r] >= 0 && tok[r] < embed.rows, "token id out of range");
    TORCH_CHECK(pos[r] >= 0 && pos[r] < L && pos[r] < max_position, "position out of range");
    TORCH_CHECK(slot[r] >= 0 && slot[r] < S, "slot out of range");
  }
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(rows[i] >= 0 && rows[i] < T, "logit row out of range");
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const int64_t Nqkv = (H + 2 * Hkv) * d, V = head.rows;
  at::Tensor residual = at::empty({T, D}, f32), h = at::empty({T, D}, f32), delta = at::empty({T, D}, f32);
  at::Tensor qkv = at::empty({T, Nqkv}, f32), attn = at::empty({T, H * d}, f32);
  at::Tensor h_logits = at::empty({n, D}, f32), logits = at::empty({n, V}, f32), rope = at::empty({2, T, d}, f32);
  float* cos_b = rope.data_ptr<float>();
  float* sin_b = cos_b + T * d;
  for (int64_t r = 0; r < T; ++r) {
    std::memcpy(cos_b + r * d, cos_ + pos[r] * d, d * sizeof(float));
    std::memcpy(sin_b + r * d, sin_ + pos[r] * d, d * sizeof(float));
    embed_row(tok[r], residual.data_ptr<float>() + r * D);
  }
  const int threads = std::max(1, at::get_num_threads());
  const int64_t last_rows = StepWork::last_layer_rows(*this, T, n);
  at::Tensor last = at::empty({last_rows < T ? last_rows : 0, D}, f32);
  StepBuffers buffers{residual.data_ptr<float>(), h.data_ptr<float>(), delta.data_ptr<float>(),
                      qkv.data_ptr<float>(), attn.data_ptr<float>(), nullptr,
                      nullptr, h_logits.data_ptr<float>(), logits.data_ptr<float>(), cos_b, sin_b,
                      last.data_ptr<float>(), {}, {}, {}, {}, {}, {}, {}, {}};
  // Int8 activations: the four inputs' Q8 blocks (q bytes, then d and s per block); int16: their int16
  // blocks (q1 and q2 bytes, then s, sx and sumq per block) in decoding batches (T <= 8), and for the
  // LM head wherever it has <= 8 rows (a prompt chunk's last token: else its R16 rows would be unpacked
  // for the fp32 path); with AMX (the R16 products of prompt chunks in int8 tiles, r16_tiles.h), every
  // step, an input of kTileMinRows+ rows (a prompt chunk's, with any decoding rows in its step) as 12-bit
  // blocks (r16_matmul.h's I16Rows with bits 12: the tiles' one product per block).
  at::Tensor q_bytes, q_scales;
  const int64_t widths[4] = {D, H * d, I, D};
  if (int8_activations_) {
    carve_blocks<Q8Rows>(widths, {T, T, T, n}, [](int64_t rows, int64_t width) { return rows * width; }, 2,
                         {&buffers.hq, &buffers.attnq, &buffers.actq, &buffers.logitq},
                         q_bytes, q_scales, [](int8_t* q, float* sc, int64_t values, int64_t width) {
                           return Q8Rows{q, sc, sc + values / kQ8, width};
                         });
  } else if (const bool i16_tiles = r16::tiles_run(r16::kTileMinRows); int16_activations_ && (std::min(T, n) <= 8 || i16_tiles)) {
    const int64_t t = T <= 8 || i16_tiles ? T : 0;
    auto bits = [&](int64_t rows) { return i16_tiles && rows >= r16::kTileMinRows ? 12 : 16; };
    auto bytes = [&](int64_t rows, int64_t width) { return r16::rows_bytes(rows, width, bits(rows)); };
    carve_blocks<r16::I16Rows>(widths, {t, t, t, n <= 8 || i16_tiles ? n : 0}, bytes, 3,
                               {&buffers.hi, &buffers.attni, &buffers.acti, &buffers.logiti}, q_bytes, q_scales,
                               [&](int8_t* q, float* sc, int64_t values, int64_t width) {
                                 const int64_t rows = values / width;
                                 return r16::rows_over(q, sc, rows, width, bits(rows));
                               });
  }
  // The shared gate_up and act buffers, where the gate/up tasks do not keep them in their scratch.
  const int64_t act_rows = StepWork::act_local_of(*this, buffers, T <= 8) ? 0 : T;
  at::Tensor gate_up = at::empty({act_rows, gate_up_stride(I)}, f32), act = at::empty({act_rows, I}, f32);
  buffers.gate_up = gate_up.data_ptr<float>();
  buffers.act = act.data_ptr<float>();
  argmax_stride_ = n + 8;
  argmax_keys_.assign(threads * argmax_stride_, 0);
  StepWork work(*this, T, pos, slot, rows, n, buffers, threads);
  pool_.run(work, threads);
  widened_keys_ += work.widened();
  argmax_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t best = 0;
    for (int w = 0; w < threads; ++w) best = std::max(best, argmax_keys_[w * argmax_stride_ + i]);
    argmax_[i] = argmax_index(best);
  }
  if (profiling_)
    step_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
  return logits;
}

}  // namespace voxlane

// A greedy step (decode rows, prompt chunks or both) and expect_step as plain C functions, called through
// ctypes by the engine's loop (engine/native_step.py): after a step has streamed its ~100 MB of weights
// through the caches, calling a custom-class method from Python took 60-100 us at load 4 (its call path is
// out of cache: argument matching, IValue conversions, the returned tensor's wrapping), a ctypes call 10-17 us.
// rows: [3, T] int64 (token ids, positions, slots); logit_rows: [L]; argmax: [L], each logit row's argmax
// (the logits themselves are not returned). A decode batch is T = L rows; a prompt's step has T rows, of
// which its chunks' last ones want a token. Returns nullptr, or the error's message (valid until this
// thread's next call).
namespace {
// decoder's step of the rows (as voxlane_greedy_rows' arguments), then done(the step's logits [L, V]) ->
// nullptr, or the error's message (valid until this thread's next call): the C calls' common part.
template <class Done>
const char* c_step(voxlane::NativeDecoder* decoder, int64_t* rows, int64_t T, int64_t* logit_rows, int64_t L,
                   Done&& done) {
  thread_local std::string error;
  try {
    const auto row = [&](int64_t k) { return at::from_blob(rows + k * T, {T}, at::kLong); };
    done(decoder->step(row(0), row(1), row(2), at::from_blob(logit_rows, {L}, at::kLong)));
    return nullptr;
  } catch (const std::exception& e) {
    error = e.what();
    return error.c_str();
  }
}
}  // namespace

extern "C" const char* voxlane_greedy_rows(voxlane::NativeDecoder* decoder, int64_t* rows, int64_t T,
                                           int64_t* logit_rows, int64_t L, int64_t* argmax) {
  return c_step(decoder, rows, T, logit_rows, L, [&](const at::Tensor&) {
    const std::vector<int64_t> found = decoder->argmax();
    std::copy(found.begin(), found.end(), argmax);
  });
}

// The same step for a sampled plan: the logit rows' logits [L, V] copied into `logits` (L x V floats, the
// caller's), which the sampler draws from. Why: the custom-class call, its input tensors and the returned
// tensor cost a sampled decode step what they cost the greedy one before voxlane_greedy_rows.
extern "C" const char* voxlane_logits_rows(voxlane::NativeDecoder* decoder, int64_t* rows, int64_t T,
                                           int64_t* logit_rows, int64_t L, float* logits) {
  return c_step(decoder, rows, T, logit_rows, L, [&](const at::Tensor& out) {
    std::memcpy(logits, out.data_ptr<float>(), static_cast<size_t>(out.numel()) * sizeof(float));
  });
}

extern "C" void voxlane_expect_step(voxlane::NativeDecoder* decoder, int64_t us) { decoder->expect_step(us); }

TORCH_LIBRARY_FRAGMENT(voxlane, m) {
  m.class_<voxlane::NativeDecoder>("NativeDecoder")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, int64_t, at::Tensor, at::Tensor,
                       at::Tensor, at::Tensor>())
      .def("add_linear", &voxlane::NativeDecoder::add_linear)
      .def("add_norm", &voxlane::NativeDecoder::add_norm)
      .def("step", &voxlane::NativeDecoder::step)
      .def("num_layers", &voxlane::NativeDecoder::num_layers)
      .def("half_kv", &voxlane::NativeDecoder::half_kv)
      .def("solo_steps", &voxlane::NativeDecoder::solo_steps)
      .def("set_stall_fallback", &voxlane::NativeDecoder::set_stall_fallback)
      .def("script_steps", &voxlane::NativeDecoder::script_steps)
      .def("expect_step", &voxlane::NativeDecoder::expect_step)
      .def("argmax", &voxlane::NativeDecoder::argmax)
      .def("address", &voxlane::NativeDecoder::address)
      .def("set_int8_activations", &voxlane::NativeDecoder::set_int8_activations)
      .def("int8_activations", &voxlane::NativeDecoder::int8_activations)
      .def("set_bf16_activations", &voxlane::NativeDecoder::set_bf16_activations)
      .def("bf16_activations", &voxlane::NativeDecoder::bf16_activations)
      .def("set_last_rows_only", &voxlane::NativeDecoder::set_last_rows_only)
      .def("last_rows_only", &voxlane::NativeDecoder::last_rows_only)
      .def("set_kv_ahead", &voxlane::NativeDecoder::set_kv_ahead)
      .def("kv_ahead", &voxlane::NativeDecoder::kv_ahead)
      .def("set_halves", &voxlane::NativeDecoder::set_halves)
      .def("halves", &voxlane::NativeDecoder::halves)
      .def("set_steer", &voxlane::NativeDecoder::set_steer)
      .def("steer", &voxlane::NativeDecoder::steer)
      .def("steers", &voxlane::NativeDecoder::steers)
      .def("set_act_scratch", &voxlane::NativeDecoder::set_act_scratch)
      .def("set_attn_scratch", &voxlane::NativeDecoder::set_attn_scratch)
      .def("attn_scratch", &voxlane::NativeDecoder::attn_scratch)
      .def("act_scratch", &voxlane::NativeDecoder::act_scratch)
      .def("act_scratch_floats", &voxlane::NativeDecoder::act_scratch_floats)
      .def("set_widen_once", &voxlane::NativeDecoder::set_widen_once)
      .def("widen_once", &voxlane::NativeDecoder::widen_once)
      .def("widened_keys", &voxlane::NativeDecoder::widened_keys)
      .def("kv32_allocations", &voxlane::NativeDecoder::kv32_allocations)
      .def("set_int16_activations", &voxlane::NativeDecoder::set_int16_activations)
      .def("int16_activations", &voxlane::NativeDecoder::int16_activations)
      .def("r16_bytes", &voxlane::NativeDecoder::r16_bytes)
      .def("set_profiling", &voxlane::NativeDecoder::set_profiling)
      .def("profile_ms", &voxlane::NativeDecoder::profile_ms)
      .def("handoff_profile", &voxlane::NativeDecoder::handoff_profile);
}
