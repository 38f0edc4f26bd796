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
//
// Under contention even that costs more than a second thread brings: a helper paused mid-task
// holds up every phase after it for a time slice (measured at load 5-6 on the 2 cores: 17 tok/s on
// 2 threads against 42 on one). So the calling thread times its waits for others' tasks; a wait
// longer than kStallNs (1 ms) is a paused thread, not a slow task, and when such stalls take more than a
// quarter of a step the next kSoloSteps steps run on the calling thread alone, then two are tried
// again. Results do not depend on the thread count (each output is computed by one task).
#pragma once

#include <algorithm>
#include <array>
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
    if (threads > 1 && solo_left_ > 0 && stall_fallback_) {
      --solo_left_;
      ++solo_steps_;
      threads = 1;
    }
    const auto start = std::chrono::steady_clock::now();
    stalled_ns_ = 0;
    const int64_t phases = work.phases();
    bounds_.assign(phases + 1, 0);
    after_.assign(phases, -1);
    int64_t last = -1;  // the last phase with tasks so far
    for (int64_t p = 0; p < phases; ++p) {
      bounds_[p + 1] = bounds_[p] + work.size(p);
      after_[p] = last;
      if (bounds_[p + 1] > bounds_[p]) last = p;
    }
    const int64_t total = bounds_[phases];
    if (total == 0) return;
    if (total > kMaxTasks) throw std::runtime_error("StepPool: too many tasks in one step");
    if (done_size_ < phases) {
      done_ = std::make_unique<Counter[]>(phases);
      done_size_ = phases;
    }
    for (int64_t p = 0; p < phases; ++p) done_[p].n.store(0, std::memory_order_relaxed);
    work_ = &work;
    ensure_helpers(threads - 1);
    active_helpers_.store(threads - 1, std::memory_order_relaxed);
    generation_ = (generation_ + 1) & 0xffff;
    step_profiled_.store(profiling_ && threads <= kProfiledWorkers, std::memory_order_relaxed);
    // Publishing the ticket word publishes everything above to helpers that take a ticket; seq_cst
    // with the load of sleeping_ below, so a helper going to sleep either sees it or is woken.
    ticket_.store((uint64_t(generation_) << 48) | (uint64_t(total) << kIndexBits), std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    const bool profiling = profiling_now();
    participate(0, generation_, profiling);
    const auto tail = profiling ? std::chrono::steady_clock::now() : start;
    // The step is done when its last phase with tasks is: each of its tasks waited for the phase
    // before it, and so on back to the first.
    const int64_t needed = bounds_[last + 1] - bounds_[last];
    wait_until([&] { return done_[last].n.load(std::memory_order_acquire) >= needed; }, true);
    if (profiling) {
      tail_ns_ += elapsed_ns(tail);
      run_ns_ += elapsed_ns(start);
      ++steps_;
    }
    if (threads > 1 && stalled_ns_ * 4 > elapsed_ns(start)) solo_left_ = kSoloSteps;
  }

  // Steps run on the calling thread alone because helpers stalled (see the header).
  int64_t solo_steps() const { return solo_steps_; }
  // Off: always the threads asked for (A/B measurements of the fallback itself).
  void set_stall_fallback(bool on) {
    stall_fallback_ = on;
    solo_left_ = 0;
  }

  // Profiling of the hand-offs (off by default: three clock reads per task). Per worker (0: the
  // calling thread), since the last reset: ns in tasks, ns waiting for the phase before a task's to
  // complete, ns in the rest of the loop (taking tickets, counting tasks done), tasks run, waits
  // (a task whose phase before was not complete when its ticket was taken); and for the calling
  // thread the ns from its last task to the step's end (waiting for the others' last tasks), and
  // the steps' ns inside run().
  struct WorkerStats {
    int64_t task_ns = 0, wait_ns = 0, other_ns = 0, tasks = 0, waits = 0;
  };
  static constexpr int kProfiledWorkers = 8;  // workers beyond these are not profiled
  void set_profiling(bool on) {
    profiling_ = on;
    stats_.fill(WorkerStats{});
    tail_ns_ = run_ns_ = steps_ = 0;
  }
  // [steps, run ns, tail ns, then per worker: task ns, wait ns, other ns, tasks, waits]
  std::vector<int64_t> profile() const {
    std::vector<int64_t> out{steps_, run_ns_, tail_ns_};
    for (const WorkerStats& w : stats_) out.insert(out.end(), {w.task_ns, w.wait_ns, w.other_ns, w.tasks, w.waits});
    return out;
  }

 private:
  std::vector<std::thread> helpers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<int> sleeping_{0};
  std::atomic<uint64_t> ticket_{0};
  // Tasks done per phase, a cache line each (a thread finishing tasks of one phase does not take the
  // line that another spins on for the phase before).
  struct alignas(64) Counter {
    std::atomic<int64_t> n{0};
  };
  std::unique_ptr<Counter[]> done_;
  int64_t done_size_ = 0;
  std::vector<int64_t> bounds_;  // phase p's tasks are tickets [bounds_[p], bounds_[p + 1])
  std::vector<int64_t> after_;   // the phase p waits for: the last one before it with tasks (-1: none)
  PhasedWork* work_ = nullptr;
  uint32_t generation_ = 0;
  std::atomic<int> active_helpers_{0};  // helpers 1..active_helpers_ take part in the current step
  // 1 ms: about a scheduler time slice (EEVDF: 0.75 ms x (1 + log2 CPUs)); a task of a 256-token
  // prefill chunk takes ~0.4 ms on one core, and a stall counts only past a quarter of the step.
  static constexpr int64_t kStallNs = 1000000;
  static constexpr int kSoloSteps = 64;
  bool stall_fallback_ = true;
  int solo_left_ = 0;        // steps still to run alone
  int64_t solo_steps_ = 0;   // steps run alone so far
  int64_t stalled_ns_ = 0;   // this step: the calling thread's waits longer than kStallNs
  bool profiling_ = false;
  std::atomic<bool> step_profiled_{false};  // this step's (written before the ticket word is published)
  std::array<WorkerStats, kProfiledWorkers> stats_{};  // per worker, each written by its own thread
  int64_t tail_ns_ = 0, run_ns_ = 0, steps_ = 0;

  // Whether this step is profiled (read by helpers after they saw the step's generation).
  bool profiling_now() const { return step_profiled_.load(std::memory_order_relaxed); }

  static int64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since).count();
  }

  // Spins (then yields) until ready(); the calling thread (timed) adds a long wait to stalled_ns_.
  template <class Ready> void wait_until(Ready&& ready, bool timed) {
    if (ready()) return;
    const auto since = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    int64_t spins = 0;
    while (!ready()) backoff(spins);
    if (timed) {
      const int64_t ns = elapsed_ns(since);
      if (ns > kStallNs) stalled_ns_ += ns;
    }
  }

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

  // Take tickets of step `generation` until it has none left. A ticket is taken only while the
  // word still holds that generation: a helper that the OS paused after its last task of a step must
  // not take (and then mishandle, its phase being the old step's) a ticket of the next one. Tickets of
  // a finished generation carry an index past their task count.
  void participate(int worker, uint64_t generation, bool profiling) {
    int64_t phase = 0;
    using clock = std::chrono::steady_clock;
    WorkerStats* stats = profiling ? &stats_[worker] : nullptr;
    auto mark = stats ? clock::now() : clock::time_point{};
    auto lap = [&](int64_t& into) {  // adds the time since the last mark to `into`
      const auto now = clock::now();
      into += std::chrono::duration_cast<std::chrono::nanoseconds>(now - mark).count();
      mark = now;
    };
    for (;;) {
      uint64_t ticket = ticket_.load(std::memory_order_acquire);
      int64_t index;
      for (;;) {
        const int64_t total = int64_t((ticket >> kIndexBits) & kIndexMask);
        index = int64_t(ticket & kIndexMask);
        if ((ticket >> 48) != generation || index >= total) {
          if (stats) lap(stats->other_ns);
          return;
        }
        if (ticket_.compare_exchange_weak(ticket, ticket + 1, std::memory_order_acq_rel, std::memory_order_acquire)) break;
      }
      while (bounds_[phase + 1] <= index) ++phase;  // tickets rise, so the phase only moves forward
      if (const int64_t before = after_[phase]; before >= 0) {
        const int64_t needed = bounds_[before + 1] - bounds_[before];
        const auto* done = &done_[before].n;
        if (stats) {
          lap(stats->other_ns);
          if (done->load(std::memory_order_acquire) < needed) ++stats->waits;
        }
        wait_until([&] { return done->load(std::memory_order_acquire) >= needed; }, worker == 0);
        if (stats) lap(stats->wait_ns);
      } else if (stats) {
        lap(stats->other_ns);
      }
      work_->run(phase, index - bounds_[phase], worker);
      if (stats) {
        lap(stats->task_ns);
        ++stats->tasks;
      }
      done_[phase].n.fetch_add(1, std::memory_order_acq_rel);
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
      if (worker <= active_helpers_.load(std::memory_order_relaxed)) participate(worker, gen, profiling_now());
    }
  }
};

}  // namespace voxlane
