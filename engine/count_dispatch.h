// A count known only at run time, handed to code as a compile-time constant: by_count<N>(n, f) calls
// f(std::integral_constant<int, n>) for n in 1..N (nothing for any other n), so f's loops over n unroll and
// an array of n accumulators stays in registers. The R16 tiles' row blocks (r16_tiles.h) and prompt
// attention's last keys (decode_ops.h) use it.
#pragma once

#include <cstdint>
#include <type_traits>

namespace voxlane {

template <int N, class F>
__attribute__((always_inline)) inline void by_count(int64_t n, F&& f) {
  if constexpr (N >= 1) {
    if (n == N) return f(std::integral_constant<int, N>{});
    by_count<N - 1>(n, f);
  }
}

}  // namespace voxlane
