// engine/step_pool.h's tickets, recorded (tests/engine/test_step_pool_halves.py): a step of phases with and without
// halves(p) runs on `threads` threads; every task prints "step phase worker u0 u1 descending". Each task spins a
// little, so that both threads take tasks of every phase. Usage: step_pool_halves_check THREADS HALVES STEPS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "step_pool.h"

struct Task {
  int64_t step, phase, worker, u0, u1;
  bool descending;
};

// Phases of 96, 7, 1, 42 and 37 units (most units per task 4, 1, 1, 8, 3); phases 0, 3 and 4 ask for halves.
struct Recorder : voxlane::PhasedWork {
  int64_t step = 0;
  std::vector<std::vector<Task>> tasks{8};  // per worker (each written by its own thread)
  static constexpr int64_t kSizes[5] = {96, 7, 1, 42, 37}, kChunks[5] = {4, 1, 1, 8, 3};
  int64_t phases() const override { return 5; }
  int64_t size(int64_t p) const override { return kSizes[p]; }
  int64_t max_chunk(int64_t p) const override { return kChunks[p]; }
  bool halves(int64_t p) const override { return p == 0 || p == 3 || p == 4; }
  void run(int64_t p, int64_t u0, int64_t u1, int worker, bool descending) override {
    tasks[worker].push_back({step, p, worker, u0, u1, descending});
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(2 * (u1 - u0));
    while (std::chrono::steady_clock::now() < until) {}
  }
};

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const int threads = std::atoi(argv[1]);
  const bool halves = std::atoi(argv[2]) != 0;
  const int steps = std::atoi(argv[3]);
  voxlane::StepPool pool;
  pool.set_stall_fallback(false);
  pool.set_halves(halves);
  Recorder work;
  for (int s = 0; s < steps; ++s) {
    work.step = s;
    pool.expect_step(1000);
    pool.run(work, threads);
  }
  for (const auto& per : work.tasks)
    for (const Task& t : per)
      std::printf("%lld %lld %lld %lld %lld %d\n", (long long)t.step, (long long)t.phase, (long long)t.worker,
                  (long long)t.u0, (long long)t.u1, t.descending ? 1 : 0);
  return 0;
}
