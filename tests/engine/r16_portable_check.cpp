// tests/engine/test_int16_activations.py: R16 products, quantization and (un)packing of random blocks, printed;
// compiled with and without AVX-512 VNNI (engine/r16_matmul.h's scalar fallback), the outputs must agree.
#include <cstdio>
#include <random>
#include <vector>
#include <algorithm>
#include "r16_matmul.h"
using namespace voxlane;
static void put_half(uint8_t* p, float f) {
  // round-to-nearest fp16 via the scalar formula for normal values in range
  uint32_t b; std::memcpy(&b, &f, 4);
  uint16_t s = (b >> 16) & 0x8000; int e = ((b >> 23) & 0xff) - 127 + 15; uint32_t m = (b >> 13) & 0x3ff;
  uint16_t h = e <= 0 ? s : static_cast<uint16_t>(s | (e << 10) | m);
  std::memcpy(p, &h, 2);
}
int main() {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t N = 48, K = 576;
  for (int64_t format : {gguf::Q4_1, gguf::Q4_0, gguf::Q8_0}) {
    int64_t qk, bytes;
    gguf::with_format(format, [&](auto b) { qk = decltype(b)::QK; bytes = decltype(b)::BYTES; });
    const int64_t row_bytes = K / qk * bytes;
    std::vector<uint8_t> w(N * row_bytes);
    for (auto& v : w) v = byte(rng);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t b = 0; b < K / qk; ++b) {
        uint8_t* p = w.data() + r * row_bytes + b * bytes;
        put_half(p, 0.01f * normal(rng));
        if (format == gguf::Q4_1) put_half(p + 2, 0.05f * normal(rng));
      }
    std::vector<uint8_t> packed(w.size()), back(w.size());
    r16::pack(format, w.data(), N, K, row_bytes, packed.data());
    const r16::Weight R = r16::view(format, packed.data(), N, K, row_bytes);
    r16::unpack_rows(R, 0, N, back.data());
    printf("roundtrip %d\n", back == w);
    r16::unpack_rows(R, 3, 21, back.data());  // partial groups: the scalar path on every build
    printf("partial %d\n", std::equal(back.begin(), back.begin() + 18 * row_bytes, w.begin() + 3 * row_bytes));
    std::vector<uint8_t> inplace = w;
    r16::pack_in_place(format, inplace.data(), N, K, row_bytes);
    printf("inplace %d\n", inplace == packed);
    for (int M : {1, 3, 8}) {
      std::vector<float> x(M * K);
      for (auto& v : x) v = normal(rng) + (M == 3 ? 1.f : 0.f);
      x[5] = 0.f;
      std::vector<int8_t> q(2 * M * K);
      std::vector<float> sc(3 * M * K / 32);
      const int64_t nb = K / 32;
      r16::I16Rows rows{q.data(), q.data() + M * K, sc.data(), sc.data() + M * nb,
                        reinterpret_cast<int32_t*>(sc.data() + 2 * M * nb), K};
      r16::quantize_rows(x.data(), M, K, rows);
      std::vector<float> y(M * N);
      r16::matvec(R, rows, M, y.data(), N, 0, N);
      for (int i = 0; i < 2 * M * K; ++i) printf("q %d\n", q[i]);
      for (int i = 0; i < M * nb; ++i) printf("s %.9g %.9g %d\n", rows.s[i], rows.sx[i], rows.sumq[i]);
      for (float v : y) printf("y %.9g\n", v);
    }
  }
}
