// A small thread pool that runs a decode step as a sequence of phases (a phase's tasks run in any
// order on any thread; a phase starts when the one before it is complete), without barriers.
//
// Why not an OpenMP team with a barrier between phases: a decode step has ~200 phases, and a
// barrier waits for *every* thread to arrive. On a machine shared with other processes a thread is
// often paused by the OS for a time slice; measured with 2 threads under load ~20, one step took
// 1.8-2.8 s with barriers against 57-86 ms on one thread. Here threads take tasks by ticket from
// one counter: a thread that is paused while holding no task delays nobody, and one paused holding
// a task delays the others by that one task. The calling thread works too; helpers spin briefly
// between steps, then sleep (so they do not compete with torch's own threads between steps).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define VOXLANE_PAUSE() _mm_pause()
#else
#define VOXLANE_PAUSE() ((void)0)
#endif
#include <sched.h>

namespace voxlane {

// What a step runs: phases() phases of size(p) tasks; run(p, i, worker) does task i of phase p
// (worker in [0, threads): for per-thread scratch).
struct PhasedWork {
  virtual ~PhasedWork() = default;
  virtual int64_t phases() const = 0;
  virtual int64_t size(int64_t phase) const = 0;
  virtual void run(int64_t phase, int64_t task, int worker) = 0;
};

class StepPool {
 public:
  // 64-bit ticket word: generation (16 bits) | task count (24) | next task index (24).
  static constexpr int kIndexBits = 24;
  static constexpr uint64_t kIndexMask = (1ull << kIndexBits) - 1;
  static constexpr int64_t kMaxTasks = int64_t(kIndexMask);

  ~StepPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : helpers_) t.join();
  }

  // Runs all of work's phases with `threads` threads (this one included); returns when all are done.
  void run(PhasedWork& work, int threads) {
    threads = std::max(threads, 1);
    const int64_t phases = work.phases();
    bounds_.assign(phases + 1, 0);
    for (int64_t p = 0; p < phases; ++p) bounds_[p + 1] = bounds_[p] + work.size(p);
    const int64_t total = bounds_[phases];
    if (total == 0) return;
    if (total > kMaxTasks) throw std::runtime_error("StepPool: too many tasks in one step");
    if (done_size_ < phases) {
      done_ = std::make_unique<std::atomic<int64_t>[]>(phases);
      done_size_ = phases;
    }
    for (int64_t p = 0; p < phases; ++p) done_[p].store(0, std::memory_order_relaxed);
    completed_.store(0, std::memory_order_relaxed);
    work_ = &work;
    ensure_helpers(threads - 1);
    active_helpers_.store(threads - 1, std::memory_order_relaxed);
    generation_ = (generation_ + 1) & 0xffff;
    // Publishing the ticket word publishes everything above to helpers that take a ticket; seq_cst
    // with the load of sleeping_ below, so a helper going to sleep either sees it or is woken.
    ticket_.store((uint64_t(generation_) << 48) | (uint64_t(total) << kIndexBits), std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    participate(0);
    int64_t spins = 0;
    while (completed_.load(std::memory_order_acquire) < total) backoff(spins);
  }

 private:
  std::vector<std::thread> helpers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<int> sleeping_{0};
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int64_t> completed_{0};
  std::unique_ptr<std::atomic<int64_t>[]> done_;
  int64_t done_size_ = 0;
  std::vector<int64_t> bounds_;  // phase p's tasks are tickets [bounds_[p], bounds_[p + 1])
  PhasedWork* work_ = nullptr;
  uint32_t generation_ = 0;
  std::atomic<int> active_helpers_{0};  // helpers 1..active_helpers_ take part in the current step

  static void backoff(int64_t& spins) {
    if (++spins < 4096) VOXLANE_PAUSE();
    else sched_yield();  // under load: let a paused thread (maybe the one holding our input) run
  }

  void ensure_helpers(int count) {
    while (static_cast<int>(helpers_.size()) < count) {
      const int worker = static_cast<int>(helpers_.size()) + 1;
      helpers_.emplace_back([this, worker] { helper_main(worker); });
    }
  }

  // Take tickets until the step has none left. Tickets of a finished generation carry an index
  // past their task count, so a late thread does nothing with them.
  void participate(int worker) {
    int64_t phase = 0, spins = 0;
    for (;;) {
      const uint64_t ticket = ticket_.fetch_add(1, std::memory_order_acq_rel);
      const int64_t total = int64_t((ticket >> kIndexBits) & kIndexMask), index = int64_t(ticket & kIndexMask);
      if (index >= total) return;
      while (bounds_[phase + 1] <= index) ++phase;  // tickets rise, so the phase only moves forward
      if (phase > 0) {
        const int64_t needed = bounds_[phase] - bounds_[phase - 1];
        spins = 0;
        while (done_[phase - 1].load(std::memory_order_acquire) < needed) backoff(spins);
      }
      work_->run(phase, index - bounds_[phase], worker);
      done_[phase].fetch_add(1, std::memory_order_acq_rel);
      completed_.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  void helper_main(int worker) {
    uint64_t seen = 0;  // the generation of the last step this helper took part in
    for (;;) {
      // Spin ~50 us for the next step (decode steps come back to back), then sleep.
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
      uint64_t gen = ticket_.load(std::memory_order_acquire) >> 48;
      while (gen == seen && std::chrono::steady_clock::now() < until) {
        for (int i = 0; i < 64; ++i) VOXLANE_PAUSE();
        gen = ticket_.load(std::memory_order_acquire) >> 48;
      }
      if (gen == seen) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] { return stop_ || (ticket_.load(std::memory_order_seq_cst) >> 48) != seen; });
        sleeping_.fetch_sub(1, std::memory_order_seq_cst);
        if (stop_) return;
        gen = ticket_.load(std::memory_order_acquire) >> 48;
      }
      seen = gen;
      if (worker <= active_helpers_.load(std::memory_order_relaxed)) participate(worker);
    }
  }
};

}  // namespace voxlane
