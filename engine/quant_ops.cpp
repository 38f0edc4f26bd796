// torch.ops.voxlane ops over weights kept in their file's block format (engine/gguf_blocks.h):
//   quant_linear(x [M, K] f32, w uint8 [N, row_bytes], format, K, row_scale?, bias?) -> [M, N] f32
//   quant_linear_q8(x, w, format, K, bias?) -> [M, N] f32   x quantized to Q8 blocks first (q8_matmul.h)
//   quant_linear_i16(x, w, format, K, bias?) -> [M, N] f32  x as int16 blocks, the weights' R16 copy
//                                                            (r16_matmul.h; as the one-call step's Linear)
//   quant_linear_r16(x, w, format, K, tiles) -> [M, N]   the same on w already in R16 (N % 16 == 0), any M:
//                                                            tiles 1 AMX int8 tiles (r16_tiles.h) on x as
//                                                            12-bit blocks (the step's prompt rows), 3 the
//                                                            tiles on int16 blocks, 0 the VNNI kernel, -1
//                                                            as the step chooses, 2 the decoding batches'
//                                                            tiles (r16_batch.h, M <= 8)
//   quant_r16_pack_(w, format, K) -> w                    w's blocks rewritten in the R16 layout, in place
//   quantize_i16(x [M, K], how, bits=16) -> [q1, q2 int8 [M, K], s, sx [M, K / 32] f32, sumq int32]   x's
//                                                            int16 (bits 12: 12-bit) blocks (r16_matmul.h):
//                                                            how 0 one block at a time, 1 quantize_rows, 2
//                                                            quantize_column (tests)
//   quant_linear_bf16x(x, w, format, K, row_scale?, bias?)   bf16 activations where the format has them
//                                                            (prefill_gemm.h; bf16_activation_tiles(format))
//                                                            (from 16 rows: AMX int8 tiles where q8_activation_tiles)
//   quant_dequantize(w, format, K) -> [N, K] f32          (tests; the readable twin is in Python)
//   quant_embedding(w, format, K, ids [n] int64) -> [n, K] f32
// Registered next to the decode kernels of kernels.cpp (same library, built together).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "q8_matmul.h"
#include "quant_matmul.h"
#include "r16_matmul.h"
#include "r16_batch.h"
#include "r16_tiles.h"

namespace voxlane {

QWeight qweight_of(const at::Tensor& w, int64_t format, int64_t cols, const c10::optional<at::Tensor>& row_scale,
                   const c10::optional<at::Tensor>& bias) {
  int64_t qk, bytes;
  block_geometry(format, qk, bytes);
  TORCH_CHECK(qk > 0, "unknown weight format ", format);
  TORCH_CHECK(cols > 0 && cols % qk == 0, "cols ", cols, " is not a multiple of the format's block of ", qk);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous() && w.size(1) == cols / qk * bytes,
              "w: contiguous uint8 [N, ", cols / qk * bytes, "] (the rows' blocks)");
  QWeight q;
  q.data = w.data_ptr<uint8_t>();
  q.rows = w.size(0);
  q.cols = cols;
  q.row_bytes = w.size(1);
  q.format = format;
  if (row_scale.has_value()) {
    TORCH_CHECK(row_scale->scalar_type() == at::kFloat && row_scale->numel() == q.rows && row_scale->is_contiguous(),
                "row_scale: float32 [N]");
    q.row_scale = row_scale->data_ptr<float>();
  }
  TORCH_CHECK(format != gguf::I8 || q.row_scale, "I8 weights need their row scales");
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == q.rows && bias->is_contiguous(),
                "bias: float32 [N]");
    q.bias = bias->data_ptr<float>();
  }
  return q;
}

at::Tensor linear_of(const at::Tensor& x, const at::Tensor& w, int64_t format, int64_t cols,
                     const c10::optional<at::Tensor>& row_scale, const c10::optional<at::Tensor>& bias, bool bf16x) {
  const QWeight q = qweight_of(w, format, cols, row_scale, bias);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) == cols,
              "x: contiguous float32 [M, ", cols, "]");
  const int64_t M = x.size(0), N = q.rows;
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  constexpr int64_t kRowsPerTask = 16;  // a multiple of every row-group size of quant_matmul.h
  at::parallel_for(0, (N + kRowsPerTask - 1) / kRowsPerTask, 1, [&](int64_t t0, int64_t t1) {
    matvec(q, xp, M, cols, yp, N, t0 * kRowsPerTask, std::min(N, t1 * kRowsPerTask), nullptr, bf16x);
  });
  return y;
}

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, int64_t format, int64_t cols,
                        const c10::optional<at::Tensor>& row_scale, const c10::optional<at::Tensor>& bias) {
  return linear_of(x, w, format, cols, row_scale, bias, false);
}

// quant_linear with bf16 activations (EngineConfig.bf16_activations): what the one-call step's matmuls do
// when they are on, as one op for the tests.
at::Tensor quant_linear_bf16x(const at::Tensor& x, const at::Tensor& w, int64_t format, int64_t cols,
                              const c10::optional<at::Tensor>& row_scale, const c10::optional<at::Tensor>& bias) {
  return linear_of(x, w, format, cols, row_scale, bias, true);
}

// Whether format's rows take bf16 activations in AMX tiles here (quant_matmul.h's matvec, from
// kBf16MinRows rows).
bool bf16_activation_tiles(int64_t format) {
  bool tiles = false;
  gguf::with_format(format, [&](auto block) { tiles = bf16x_tiles<decltype(block)>(); });
  return tiles;
}

at::Tensor quant_linear_q8(const at::Tensor& x, const at::Tensor& w, int64_t format, int64_t cols,
                           const c10::optional<at::Tensor>& bias) {
  const QWeight q = qweight_of(w, format, cols, c10::nullopt, bias);
  TORCH_CHECK(has_q8_path(format), "format ", format, " has no int8-activation path");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) == cols,
              "x: contiguous float32 [M, ", cols, "]");
  const int64_t M = x.size(0), N = q.rows;
  at::Tensor xq = at::empty({M, cols}, x.options().dtype(at::kChar));
  at::Tensor scales = at::empty({2, M, cols / kQ8}, x.options());
  const Q8Rows rows{xq.data_ptr<int8_t>(), scales.data_ptr<float>(), scales.data_ptr<float>() + M * (cols / kQ8), cols};
  quantize_rows(x.data_ptr<float>(), M, cols, rows);
  at::Tensor y = at::empty({M, N}, x.options());
  float* yp = y.data_ptr<float>();
  constexpr int64_t kRowsPerTask = 16;
  at::parallel_for(0, (N + kRowsPerTask - 1) / kRowsPerTask, 1, [&](int64_t t0, int64_t t1) {
    matvec_q8(q, rows, M, yp, N, t0 * kRowsPerTask, std::min(N, t1 * kRowsPerTask));
  });
  return y;
}

// x [M, K] (K % 32 == 0) as int16 blocks (bits 16) or 12-bit ones (bits 12; q1 and q2 returned apart, not
// side by side as the tiles read them), quantized in r16::rows_over's layout (the step's and I16Input's)
// one block at a time (how 0: r16::quantize per block), by rows (1: quantize_rows) or by columns of blocks
// (2: quantize_column, as the step's gate/up tasks): tests.
std::vector<at::Tensor> quantize_i16(const at::Tensor& x, int64_t how, int64_t bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) % r16::kBlock == 0 &&
                  how >= 0 && how <= 2 && (bits == 16 || bits == 12),
              "x: contiguous float32 [M, K % 32 == 0]; how 0, 1 or 2; bits 16 or 12");
  const int64_t M = x.size(0), K = x.size(1), nb = K / r16::kBlock;
  at::Tensor bytes = at::empty({r16::rows_bytes(M, K, static_cast<int>(bits))}, x.options().dtype(at::kChar)),
             scales = at::empty({3, M, nb}, x.options());
  const r16::I16Rows rows = r16::rows_over(bytes.data_ptr<int8_t>(), scales.data_ptr<float>(), M, K, static_cast<int>(bits));
  const float* xp = x.data_ptr<float>();
  if (how == 1) {
    r16::quantize_rows(xp, M, K, rows);
  } else if (how == 2) {
    for (int64_t c = 0; c < K; c += r16::kBlock) r16::quantize_column(xp + c, M, K, rows, c);
  } else {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < K; c += r16::kBlock) r16::quantize(xp + m * K + c, r16::kBlock, rows.at_row(m), c);
  }
  const at::Tensor s = scales[0], sx = scales[1], sumq = scales[2].view(at::kInt);
  if (bits == 12) {  // each row's blocks as [q1 | q2] (a row every pitch12(K) bytes): q1 and q2 apart, [M, K] each
    const at::Tensor blocks = bytes.view({M, r16::pitch12(K)}).narrow(1, 0, 2 * K).reshape({M, nb, 2, r16::kBlock});
    return {blocks.select(2, 0).reshape({M, K}), blocks.select(2, 1).reshape({M, K}), s, sx, sumq};
  }
  const at::Tensor halves = bytes.view({2, M, K});  // the rows' q1, then their q2
  return {halves[0], halves[1], s, sx, sumq};
}

// Whether format's int8-activation products of 16+ rows run in AMX int8 tiles here (q8_matmul.h).
bool q8_activation_tiles(int64_t format) { return q8_tiles(format); }

// x [M, cols] quantized to int16 blocks (bits 12: 12-bit ones, as the step's prompt rows; r16::quantize_rows),
// in tensors held here.
struct I16Input {
  at::Tensor bytes, scales;
  r16::I16Rows rows;
  I16Input(const at::Tensor& x, int64_t cols, int bits = 16) {
    const int64_t M = x.size(0), nb = cols / r16::kBlock;
    bytes = at::empty({r16::rows_bytes(M, cols, bits)}, x.options().dtype(at::kChar));
    scales = at::empty({3, M, nb}, x.options());
    float* sc = scales.data_ptr<float>();
    rows = r16::rows_over(bytes.data_ptr<int8_t>(), sc, M, cols, bits);
    r16::quantize_rows(x.data_ptr<float>(), M, cols, rows);
  }
};

// Int16 activations (EngineConfig.int16_activations) as the one-call step runs them (decode_step.cpp's
// Linear): x [M <= 8, K] quantized to int16 blocks, the weight's whole groups of 16 rows copied to the
// R16 layout and multiplied there, the rows after the last whole group in fp32 (quant_matmul.h).
at::Tensor quant_linear_i16(const at::Tensor& x, const at::Tensor& w, int64_t format, int64_t cols,
                            const c10::optional<at::Tensor>& bias) {
  const QWeight q = qweight_of(w, format, cols, c10::nullopt, bias);
  TORCH_CHECK(r16::has_layout(format), "format ", format, " has no int16-activation (R16) path");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) == cols &&
                  x.size(0) >= 1 && x.size(0) <= 8,
              "x: contiguous float32 [M <= 8, ", cols, "]");
  const int64_t M = x.size(0), N = q.rows, grouped = N / r16::kRows * r16::kRows;
  const I16Input in(x, cols);
  const r16::I16Rows& rows = in.rows;
  at::Tensor packed = at::empty({grouped, q.row_bytes}, w.options());
  if (grouped) r16::pack(format, q.data, grouped, cols, q.row_bytes, packed.data_ptr<uint8_t>());
  const r16::Weight r = r16::view(format, packed.data_ptr<uint8_t>(), grouped, cols, q.row_bytes);
  at::Tensor y = at::empty({M, N}, x.options());
  float* yp = y.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  constexpr int64_t kRowsPerTask = 16;
  at::parallel_for(0, (N + kRowsPerTask - 1) / kRowsPerTask, 1, [&](int64_t t0, int64_t t1) {
    const int64_t n0 = t0 * kRowsPerTask, n1 = std::min(N, t1 * kRowsPerTask), g1 = std::min(n1, grouped);
    if (n0 < g1) r16::matvec(r, rows, M, yp, N, n0, g1);
    if (g1 < n1) matvec(q, xp, M, cols, yp, N, std::max(n0, g1), n1);
  });
  if (q.bias)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < grouped; ++n) yp[m * N + n] += q.bias[n];  // matvec added its rows' bias
  return y;
}

// x [M, K] as int16 blocks times w, already in the R16 layout (quant_r16_pack_; N % 16 == 0), no bias:
// tiles = 1 in AMX int8 tiles on x as 12-bit blocks (the step's prompt rows; an error where they cannot
// run), 3 the tiles on int16 blocks, 0 the VNNI kernel (r16::matvec), -1 as the one-call step's Linear
// chooses (r16::product: 12-bit blocks in the tiles from kTileMinRows rows where they run, else int16
// blocks), 2 the batch tiles (r16::batch_product: M <= 8, an error where they cannot run). Each thread
// takes a contiguous range of groups.
at::Tensor quant_linear_r16(const at::Tensor& x, const at::Tensor& w, int64_t format, int64_t cols, int64_t tiles) {
  const QWeight q = qweight_of(w, format, cols, c10::nullopt, c10::nullopt);
  TORCH_CHECK(r16::has_layout(format) && q.rows % r16::kRows == 0, "format ", format, " with ", q.rows,
              " rows: no R16 layout");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) == cols && x.size(0) >= 1,
              "x: contiguous float32 [M, ", cols, "]");
  TORCH_CHECK(tiles >= -1 && tiles <= 3, "tiles: -1, 0, 1, 2 or 3");
  TORCH_CHECK((tiles != 1 && tiles != 3) || r16::tiles_run(r16::kTileMinRows), "AMX int8 tiles do not run here");
  const int64_t M = x.size(0), N = q.rows;
  const bool b12 = tiles == 1 || (tiles == -1 && r16::tiles_run(M));
  const I16Input in(x, cols, b12 ? 12 : 16);
  const r16::I16Rows& rows = in.rows;
  TORCH_CHECK(tiles != 2 || r16::batch_tiles_usable(rows, M), "the batch tiles do not run here (or M > 8)");
  const r16::Weight r = r16::view(format, q.data, N, cols, q.row_bytes);
  at::Tensor y = at::empty({M, N}, x.options());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N / r16::kRows, 1, [&](int64_t g0, int64_t g1) {
    if (tiles == 2) return r16::batch_product(r, rows, M, yp, N, g0 * r16::kRows, g1 * r16::kRows, true);
    r16::product(r, rows, M, yp, N, g0 * r16::kRows, g1 * r16::kRows, tiles == 3 ? 1 : static_cast<int>(tiles));
  });
  return y;
}

int64_t r16_tile_calls(int64_t bits) { return r16::tile_calls(static_cast<int>(bits)); }
int64_t r16_pitch12(int64_t K) { return r16::pitch12(K); }  // the bytes between 12-bit rows of width K (tests)
int64_t r16_batch_tile_calls() { return r16::batch_tile_calls(); }

// Allow or forbid the batch tiles (r16_batch.h) in decoding batches -> whether they run now (allowed,
// built, and AMX allowed and granted by the OS).
bool set_r16_batch_tiles(bool allowed) {
  r16::batch_tiles_allowed().store(allowed);
#if defined(VOXLANE_R16_TILES)
  return allowed && amx_runs();
#else
  return false;
#endif
}

// w (file blocks, N % 16 == 0 rows) rewritten in place in the R16 layout: what the model's weights
// become when int16 activations are on (engine/native_weights.py's pack_r16). Returns w.
at::Tensor quant_r16_pack_(at::Tensor w, int64_t format, int64_t cols) {
  const QWeight q = qweight_of(w, format, cols, c10::nullopt, c10::nullopt);
  TORCH_CHECK(r16::has_layout(format), "format ", format, " has no R16 layout");
  TORCH_CHECK(q.rows % r16::kRows == 0, "R16: rows must be a multiple of ", r16::kRows, ", got ", q.rows);
  r16::pack_in_place(format, w.data_ptr<uint8_t>(), q.rows, cols, q.row_bytes);
  return w;
}

bool r16_layout(int64_t format) { return r16::has_layout(format); }

// Whether this build runs the int16-activation kernels with AVX-512 VNNI (else their scalar version).
bool r16_vnni() {
#if defined(VOXLANE_R16_VNNI)
  return true;
#else
  return false;
#endif
}

// Allow or forbid AMX in the prompt path's GEMM (prefill_gemm.h) -> whether AMX runs now (allowed and
// granted by the OS on a machine that has it).
bool set_prefill_amx(bool allowed) {
  amx_allowed().store(allowed);
#if defined(VOXLANE_AMX)
  return allowed && amx::enabled();
#else
  return false;
#endif
}

at::Tensor quant_dequantize(const at::Tensor& w, int64_t format, int64_t cols) {
  const QWeight q = qweight_of(w, format, cols, c10::nullopt, c10::nullopt);
  at::Tensor out = at::empty({q.rows, cols}, at::TensorOptions().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  at::parallel_for(0, q.rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dequant_row(q, r, op + r * cols);
  });
  return out;
}

at::Tensor quant_embedding(const at::Tensor& w, int64_t format, int64_t cols, const c10::optional<at::Tensor>& row_scale,
                           const at::Tensor& ids) {
  const QWeight q = qweight_of(w, format, cols, row_scale, c10::nullopt);
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong && ids.is_contiguous(), "ids: int64 [n]");
  const int64_t n = ids.size(0);
  const int64_t* idp = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(idp[i] >= 0 && idp[i] < q.rows, "token id out of range");
  at::Tensor out = at::empty({n, cols}, at::TensorOptions().dtype(at::kFloat));
  for (int64_t i = 0; i < n; ++i) dequant_row(q, idp[i], out.data_ptr<float>() + i * cols);
  return out;
}

}  // namespace voxlane

TORCH_LIBRARY_FRAGMENT(voxlane, m) {
  m.def("quant_linear(Tensor x, Tensor w, int format, int cols, Tensor? row_scale, Tensor? bias) -> Tensor");
  m.def("quant_linear_q8(Tensor x, Tensor w, int format, int cols, Tensor? bias) -> Tensor");
  m.def("quant_linear_i16(Tensor x, Tensor w, int format, int cols, Tensor? bias) -> Tensor");
  m.def("r16_vnni() -> bool", &voxlane::r16_vnni);
  m.def("quant_linear_r16(Tensor x, Tensor w, int format, int cols, int tiles) -> Tensor");
  m.def("r16_tile_calls(int bits=0) -> int", &voxlane::r16_tile_calls);
  m.def("r16_pitch12(int K) -> int", &voxlane::r16_pitch12);
  m.def("r16_batch_tile_calls() -> int", &voxlane::r16_batch_tile_calls);
  m.def("set_r16_batch_tiles(bool allowed) -> bool", &voxlane::set_r16_batch_tiles);
  m.def("r16_layout(int format) -> bool", &voxlane::r16_layout);
  m.def("quant_r16_pack_(Tensor(a!) w, int format, int cols) -> Tensor(a!)");
  m.def("quantize_i16(Tensor x, int how, int bits=16) -> Tensor[]");
  m.def("quant_linear_bf16x(Tensor x, Tensor w, int format, int cols, Tensor? row_scale, Tensor? bias) -> Tensor");
  m.def("bf16_activation_tiles(int format) -> bool", &voxlane::bf16_activation_tiles);
  m.def("q8_activation_tiles(int format) -> bool", &voxlane::q8_activation_tiles);
  m.def("quant_dequantize(Tensor w, int format, int cols) -> Tensor");
  m.def("set_prefill_amx(bool allowed) -> bool", &voxlane::set_prefill_amx);  // no tensor: not per device
  m.def("quant_embedding(Tensor w, int format, int cols, Tensor? row_scale, Tensor ids) -> Tensor");
}

TORCH_LIBRARY_IMPL(voxlane, CPU, m) {
  m.impl("quant_linear", &voxlane::quant_linear);
  m.impl("quant_linear_q8", &voxlane::quant_linear_q8);
  m.impl("quant_linear_bf16x", &voxlane::quant_linear_bf16x);
  m.impl("quant_linear_i16", &voxlane::quant_linear_i16);
  m.impl("quant_r16_pack_", &voxlane::quant_r16_pack_);
  m.impl("quantize_i16", &voxlane::quantize_i16);
  m.impl("quant_linear_r16", &voxlane::quant_linear_r16);
  m.impl("quant_dequantize", &voxlane::quant_dequantize);
  m.impl("quant_embedding", &voxlane::quant_embedding);
}
