// tests/engine/test_kv_fp16.py: kv_element.h's float -> fp16 rounding (kv::to_half) and widening
// (kv::to_float) for the fp32 bit patterns read from stdin (one unsigned integer a line), printed as
// "half_bits widened_float_bits". Compiled without F16C (-march=x86-64): the portable routines.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include "kv_element.h"
int main() {
  uint32_t bits;
  while (std::scanf("%" SCNu32, &bits) == 1) {
    float x;
    std::memcpy(&x, &bits, 4);
    const voxlane::kv::Half h = voxlane::kv::to_half(x);
    const float back = voxlane::kv::to_float(h);
    uint32_t back_bits;
    std::memcpy(&back_bits, &back, 4);
    std::printf("%u %" PRIu32 "\n", static_cast<unsigned>(h.bits), back_bits);
  }
}
