// A small thread pool that runs a decode step as a sequence of phases (a phase's tasks run in any
// order on any thread; a phase starts when the one before it is complete), without barriers.
//
// Why not an OpenMP team with a barrier between phases: a decode step has ~200 phases, and a
// barrier waits for *every* thread to arrive. On a machine shared with other processes a thread is
// often paused by the OS for a time slice; measured with 2 threads under load ~20, one step took
// 1.8-2.8 s with barriers against 57-86 ms on one thread. Here threads take tasks by ticket from
// one counter: a thread that is paused while holding no task delays nobody, and one paused holding
// a task delays the others by that one task. The calling thread works too; helpers spin briefly
// between steps, then sleep (so they do not compete with torch's own threads between steps), unless
// the caller says a step follows soon (expect_step: the engine between two decode steps).
//
// Under contention even that costs more than a second thread brings: a helper paused mid-task
// holds up every phase after it for a time slice (measured at load 5-6 on the 2 cores: 17 tok/s on
// 2 threads against 42 on one). So the calling thread times its waits for others' tasks; a wait
// longer than kStallNs (1 ms) is a paused thread, not a slow task, and a step in which such stalls
// take more than a quarter of it starts a span of steps on the calling thread alone, then two are
// tried again (StallFallback). The span starts short (4 steps) and doubles, up to 128, while the
// retries keep stalling (or take longer than the span's one-thread steps of the same kind); 32 clean
// two-thread steps in a row set it back to 4. So a short disturbance (a neighbour's burst of a few ms)
// costs a few one-thread steps, where a fixed span of 64 cost half of a 128-token reply at one
// thread's speed, and sustained contention still runs alone for 128 steps of every 129 once the span
// has grown. A step that does the work of several (a prompt chunk: PhasedWork::weight) counts as that
// many in the spans and the clean steps, so a stall costs about 4 decode steps' time alone, not 4 whole
// prompts. Results do not depend on the thread count (each output is computed by one task).
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
#if defined(__linux__)
#include <pthread.h>
#endif

namespace voxlane {

// What a step runs: phases() phases of size(p) units; run(p, u0, u1, worker, descending) does units
// [u0, u1) of phase p, a task (worker in [0, threads): for per-thread scratch; descending: the task
// was taken from the phase's back end, see StepPool, and may walk its memory downwards). A task is at
// most max_chunk(p) units. halves(p): on several threads the phase is split in two halves that the two
// ends each walk upwards (see StepPool). With has_tail(p) (a phase with units), tail(p, worker) runs
// once, on the thread that completes the phase's last unit, before the phase counts as complete (a row
// norm that needs the whole phase's output, without a phase and a hand-off of its own). prefetch(p, u0, u1,
// descending): a task's first memory, asked for when its thread has to wait for the phase before.
struct PhasedWork {
  virtual ~PhasedWork() = default;
  virtual int64_t phases() const = 0;
  virtual int64_t size(int64_t phase) const = 0;
  virtual int64_t max_chunk(int64_t) const { return 1; }
  virtual bool has_tail(int64_t) const { return false; }
  virtual void run(int64_t phase, int64_t u0, int64_t u1, int worker, bool descending) = 0;
  virtual void tail(int64_t, int) {}
  virtual void prefetch(int64_t, int64_t, int64_t, bool) {}
  // How many steps this one counts as in the stall fallback's spans and clean steps (StallFallback): 1,
  // or for work of several decode steps' time (a prompt chunk) about that many.
  virtual int64_t weight() const { return 1; }
  virtual bool halves(int64_t) const { return false; }
};

// The stall fallback's policy (see the header): whether a step asked for on several threads runs on
// the calling thread alone, from the verdicts of the several-thread steps before it (stalled: waits
// longer than kStallNs took more than a quarter of the step). A stalled step starts a span of span_
// solo steps and doubles the next span (up to kMaxSolo): when the retry after the span stalls again
// (or any step before kCleanSteps clean ones in a row), the contention goes on and the next span is
// longer; kCleanSteps clean steps in a row were a disturbance that passed, and the span is back to
// kMinSolo. One stall costs kMinSolo solo steps; sustained contention (every retry stalls) runs
// kMinSolo, 2 kMinSolo, ... then kMaxSolo solo steps per several-thread step. Steps are counted by their
// weight (PhasedWork::weight): a solo step of weight w uses w of the span (and runs whole however little
// of the span was left), a clean one counts as w clean steps in a row. Why: in the TTFT benchmark a
// stalled 43-token prompt (weight 6) sent the next 4 prompts to one thread (~37 instead of ~24 ms each);
// now the next one, about the 4 decode steps' time a stall costs between decode steps.
// The retry also counts as stalled when it took longer than the span's fastest solo step of the same
// shape (the work's phases and units): contention that slows two threads without a wait over
// kStallNs on the calling thread (it is the one paused, or the pauses are short) still keeps the
// steps on one thread while one is faster.
class StallFallback {
 public:
  static constexpr int kMinSolo = 4, kMaxSolo = 128, kCleanSteps = 32;

  // Whether the next step (of `weight`) runs alone; true counts it as `weight` of the span's.
  bool take_solo(int64_t weight = 1) {
    if (solo_left_ == 0) return false;
    solo_left_ = std::max<int64_t>(0, solo_left_ - weight);
    ++solo_steps_;
    return true;
  }
  bool solo_next() const { return solo_left_ > 0; }
  // A step of the span ran alone: its shape (a key of its phases' units) and ns.
  void solo_step(uint64_t shape, int64_t ns) {
    if (!have_solo_ || shape != solo_shape_) solo_ns_ = ns;
    else solo_ns_ = std::min(solo_ns_, ns);
    solo_shape_ = shape;
    have_solo_ = true;
  }
  // A step that ran on several threads: whether it stalled, its shape, ns and weight.
  void several_threads_step(bool stalled, uint64_t shape, int64_t ns, int64_t weight = 1) {
    if (retry_) {  // the first after a span: lost against one thread?
      retry_ = false;
      if (have_solo_ && shape == solo_shape_ && ns > solo_ns_) stalled = true;
    }
    if (!stalled) {
      clean_ = std::min<int64_t>(clean_ + weight, kCleanSteps);
      if (clean_ == kCleanSteps) span_ = kMinSolo;
      return;
    }
    solo_left_ = span_;
    span_ = std::min<int64_t>(2 * span_, kMaxSolo);
    clean_ = 0;
    retry_ = true;
    have_solo_ = false;
  }
  void reset() {
    solo_left_ = clean_ = 0;
    span_ = kMinSolo;
    retry_ = have_solo_ = false;
  }
  int64_t solo_steps() const { return solo_steps_; }

 private:
  int64_t span_ = kMinSolo;  // the next span's steps
  int64_t solo_left_ = 0;    // steps of the current span still to run alone
  int64_t clean_ = 0;        // clean several-thread steps in a row since the last stall (at most kCleanSteps)
  bool retry_ = false;   // the next several-thread step is the first after a span
  bool have_solo_ = false;
  uint64_t solo_shape_ = 0;  // the span's last solo step's shape
  int64_t solo_ns_ = 0;      // the span's fastest solo step of that shape
  int64_t solo_steps_ = 0;
};

class StepPool {
 public:
  // 64-bit ticket word: generation (16 bits) | phase (12) | mode (2) | a (17) | b (17). Even workers are
  // the phase's front end, odd ones its back end. Mode kOne: the units not yet taken are [a, b), the
  // front end takes tasks from a (upwards), the back end from b (downwards), so with two threads each
  // walks its own end of a matrix and they meet where the work splits evenly; kOneReversed: the same
  // with the ends swapped. A task is the units left / (2 x threads), at least 1 and at most
  // max_chunk(p): large while much is left, single units where the two ends meet, so a thread waits at
  // a phase's end for at most about one unit of the other's work. Taking a phase's last units moves the
  // word to the next phase with units (or to phase = kDone: the step's tasks are all taken).
  // Mode kHalves (a phase with halves(p), on several threads): the units left are [a, mid) and [b,
  // size) (mid_[p]: half the phase), the front end takes tasks from a, the back end from b, both
  // upwards; once one half is all taken the other's rest is one range (kOne or kOneReversed) whose far
  // end the idle thread takes from. Why: a back end walking down takes each task below its last, so
  // the memory it streams (a matrix's weight groups, read upwards in a task) starts cold at every task:
  // its tasks of a 43-token prompt's gate/up took 10.1-11.0 us a unit against the front end's 9.0-9.7
  // (docs/engine.md, fourteenth session), and one half-phase task for it took 0.95x its gate/up CPU.
  static constexpr int kUnitBits = 17, kPhaseBits = 12, kModeShift = 2 * kUnitBits, kPhaseShift = kModeShift + 2;
  static constexpr int64_t kOne = 0, kOneReversed = 1, kHalves = 2;
  static constexpr uint64_t kUnitMask = (1ull << kUnitBits) - 1, kPhaseMask = (1ull << kPhaseBits) - 1;
  static constexpr int64_t kMaxUnits = int64_t(kUnitMask);  // per phase
  static constexpr int64_t kDone = int64_t(kPhaseMask);     // the phase field once every task is taken

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
    const int64_t weight = std::max<int64_t>(1, work.weight());
    const bool solo = threads > 1 && stall_fallback_ && fallback_.take_solo(weight);
    if (solo) threads = 1;
    const auto start = std::chrono::steady_clock::now();
    stalled_ns_ = 0;
    const int64_t phases = work.phases();
    if (phases >= kDone) throw std::runtime_error("StepPool: too many phases in one step");
    if (capacity_ < phases) {  // grown only (a helper late from the last step may still read them)
      done_ = std::make_unique<Counter[]>(phases);
      size_ = std::make_unique<int64_t[]>(phases);
      needed_ = std::make_unique<int64_t[]>(phases);
      chunk_ = std::make_unique<int64_t[]>(phases);
      after_ = std::make_unique<int64_t[]>(phases);
      mid_ = std::make_unique<int64_t[]>(phases);
      next_ = std::make_unique<int64_t[]>(phases + 1);
      capacity_ = phases;
    }
    int64_t last = -1;  // the last phase with units so far
    uint64_t shape = uint64_t(phases);  // the stall fallback's key of the step's kind
    for (int64_t p = 0; p < phases; ++p) {
      size_[p] = work.size(p);
      shape = shape * 1000003u + uint64_t(size_[p]);
      if (size_[p] > kMaxUnits) throw std::runtime_error("StepPool: too many units in one phase");
      const bool tail = size_[p] > 0 && work.has_tail(p);
      needed_[p] = size_[p] + (tail ? 1 : 0);
      chunk_[p] = std::max<int64_t>(1, work.max_chunk(p));
      after_[p] = last;
      mid_[p] = threads > 1 && halves_ && size_[p] >= 2 && work.halves(p) ? size_[p] / 2 : 0;
      done_[p].n.store(0, std::memory_order_relaxed);
      if (size_[p] > 0) last = p;
    }
    if (last < 0) return;
    next_[phases] = -1;
    for (int64_t p = phases - 1; p >= 0; --p) next_[p] = size_[p] > 0 ? p : next_[p + 1];
    work_ = &work;
    threads_ = threads;
    ensure_helpers(threads - 1);
    active_helpers_.store(threads - 1, std::memory_order_relaxed);
    generation_ = (generation_ + 1) & 0xffff;
    step_profiled_.store(profiling_ && threads <= kProfiledWorkers, std::memory_order_relaxed);
    started_ = start;
    // Publishing the ticket word publishes everything above to helpers that take a ticket; seq_cst
    // with the load of sleeping_ below, so a helper going to sleep either sees it or is woken.
    ticket_.store(first_word(generation_, next_[0]), std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) wake_sleepers();
    const bool profiling = profiling_now();
    participate(0, generation_, profiling);
    const auto tail = profiling ? std::chrono::steady_clock::now() : start;
    // The step is done when its last phase with units is: each of its tasks waited for the phase
    // before it, and so on back to the first.
    wait_until([&] { return done_[last].n.load(std::memory_order_acquire) >= needed_[last]; }, true);
    if (profiling) {
      tail_ns_ += elapsed_ns(tail);
      run_ns_ += elapsed_ns(start);
      ++steps_;
    }
    if ((solo || threads > 1) && stall_fallback_) {
      // script_steps(): the verdicts and times given, not the ones measured
      const int64_t ns = scripted_ ? (solo ? script_solo_ns_ : script_ns_) : elapsed_ns(start);
      if (solo) {
        fallback_.solo_step(shape, ns);
      } else {
        bool stalled = stalled_ns_ * 4 > ns;
        if (scripted_) {
          stalled = !script_.empty() && script_.front() != 0;
          if (!script_.empty()) script_.erase(script_.begin());
        }
        fallback_.several_threads_step(stalled, shape, ns, weight);
      }
    }
  }

  // A step follows within about `us` microseconds (the engine between two decode steps, whose Python
  // is longer than a helper's spin): helpers keep spinning until the next step starts or the time
  // passes, and one asleep is woken now, so the step does not wait for a sleeping helper to wake (and
  // its first phases do not run on one thread meanwhile). us <= 0: helpers sleep after their usual
  // spin (the engine has no step to run). Nothing when the next step runs on one thread (the stall
  // fallback) or there are no helpers.
  void expect_step(int64_t us) {
    if (us <= 0 || helpers_.empty() || (stall_fallback_ && fallback_.solo_next())) {
      linger_until_.store(0, std::memory_order_relaxed);
      return;
    }
    linger_until_.store(now_ns() + us * 1000, std::memory_order_seq_cst);
    // seq_cst with a helper's increment of sleeping_ before it checks linger_until_ (helper_main)
    if (sleeping_.load(std::memory_order_seq_cst) > 0) wake_sleepers();
  }

  // Sleeping helpers woken off the waking thread's CPU (on: the default), or wherever the OS puts them.
  void set_steer(bool on) { steer_ = on; }
  bool steer() const { return steer_; }
  // Wakes so far that steered the helpers (tests).
  int64_t steers() {
#if defined(__linux__)
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(steers_);
#else
    return 0;
#endif
  }

  // Phases with halves(p) split in two halves walked upwards by both ends (on: the default), or taken as
  // one range from its two ends (A/B measurements, tests).
  void set_halves(bool on) { halves_ = on; }
  bool halves() const { return halves_; }

  // Steps run on the calling thread alone because helpers stalled (see the header).
  int64_t solo_steps() const { return fallback_.solo_steps(); }
  // Off: always the threads asked for (A/B measurements of the fallback itself). Either way the
  // fallback starts over (no span, the next one kMinSolo steps).
  void set_stall_fallback(bool on) {
    stall_fallback_ = on;
    fallback_.reset();
  }
  // Tests: from now on the several-thread steps take their verdicts (nonzero: stalled) from
  // `verdicts` in order instead of their measured waits (clean once it is used up), and the stall
  // fallback sees every solo step take solo_ns and every several-thread step ns, not their clock's.
  void script_steps(std::vector<int64_t> verdicts, int64_t solo_ns, int64_t ns) {
    scripted_ = true;
    script_ = std::move(verdicts);
    script_solo_ns_ = solo_ns;
    script_ns_ = ns;
  }

  // Profiling of the hand-offs (off by default: three clock reads per task). Per worker (0: the
  // calling thread), since the last reset: ns in tasks, ns waiting for the phase before a task's to
  // complete, ns in the rest of the loop (taking tickets, counting tasks done), tasks run, waits
  // (a task whose phase before was not complete when its ticket was taken); and for the calling
  // thread the ns from its last task to the step's end (waiting for the others' last tasks), and
  // the steps' ns inside run().
  // Helpers also: ns from the step's start to their first ticket, and the steps they slept before.
  struct WorkerStats {
    int64_t task_ns = 0, wait_ns = 0, other_ns = 0, tasks = 0, waits = 0, join_ns = 0, sleeps = 0;
  };
  static constexpr int kProfiledWorkers = 8;  // workers beyond these are not profiled
  void set_profiling(bool on) {
    profiling_ = on;
    stats_.fill(WorkerStats{});
    tail_ns_ = run_ns_ = steps_ = 0;
  }
  // [steps, run ns, tail ns, then per worker: task ns, wait ns, other ns, tasks, waits, join ns, sleeps]
  std::vector<int64_t> profile() const {
    std::vector<int64_t> out{steps_, run_ns_, tail_ns_};
    for (const WorkerStats& w : stats_)
      out.insert(out.end(), {w.task_ns, w.wait_ns, w.other_ns, w.tasks, w.waits, w.join_ns, w.sleeps});
    return out;
  }

 private:
  std::vector<std::thread> helpers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<int> sleeping_{0};
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int64_t> linger_until_{0};  // expect_step(): helpers spin until then (steady clock ns)
  // Tasks done per phase, a cache line each (a thread finishing tasks of one phase does not take the
  // line that another spins on for the phase before).
  struct alignas(64) Counter {
    std::atomic<int64_t> n{0};
  };
  // Per phase (capacity_ of each, never shrunk): units done (+ 1 once its tail ran), units, units done
  // (+ tail) when complete, the most units per task, the phase it waits for (the last one before it
  // with units; -1: none); next_[p]: the first phase >= p with units (-1: none).
  std::unique_ptr<Counter[]> done_;
  std::unique_ptr<int64_t[]> size_, needed_, chunk_, after_, next_, mid_;  // mid_: 0 (no halves) or kHalves' split
  int64_t capacity_ = 0;
  int threads_ = 1;  // this step's
  PhasedWork* work_ = nullptr;
  uint32_t generation_ = 0;
  std::atomic<int> active_helpers_{0};  // helpers 1..active_helpers_ take part in the current step
  // 1 ms: about a scheduler time slice (EEVDF: 0.75 ms x (1 + log2 CPUs)); a task of a 256-token
  // prefill chunk takes ~0.4 ms on one core, and a stall counts only past a quarter of the step.
  static constexpr int64_t kStallNs = 1000000;
  bool stall_fallback_ = true;
  bool halves_ = true;  // set_halves
  bool steer_ = true;   // set_steer
#if defined(__linux__)
  cpu_set_t wake_mask_;   // the last steering waker's CPUs, which a steered helper takes back once awake
  uint64_t steers_ = 0;   // wakes that steered the helpers (both under mutex_)
#endif
  StallFallback fallback_;
  bool scripted_ = false;          // script_steps()
  std::vector<int64_t> script_;    // its verdicts still to use
  int64_t script_solo_ns_ = 0, script_ns_ = 0;
  int64_t stalled_ns_ = 0;         // this step: the calling thread's waits longer than kStallNs
  bool profiling_ = false;
  std::atomic<bool> step_profiled_{false};  // this step's (written before the ticket word is published)
  std::array<WorkerStats, kProfiledWorkers> stats_{};  // per worker, each written by its own thread
  int64_t tail_ns_ = 0, run_ns_ = 0, steps_ = 0;
  std::chrono::steady_clock::time_point started_;  // this step's start (published with the ticket word)

  // Whether this step is profiled (read by helpers after they saw the step's generation).
  bool profiling_now() const { return step_profiled_.load(std::memory_order_relaxed); }

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

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

  static uint64_t word(uint64_t generation, int64_t phase, int64_t mode, int64_t a, int64_t b) {
    return (generation << 48) | (uint64_t(phase) << kPhaseShift) | (uint64_t(mode) << kModeShift) |
           (uint64_t(a) << kUnitBits) | uint64_t(b);
  }
  // The word of phase p's start (p = -1: the step's tasks are all taken).
  uint64_t first_word(uint64_t generation, int64_t p) const {
    if (p < 0) return word(generation, kDone, kOne, 0, 0);
    return mid_[p] > 0 ? word(generation, p, kHalves, 0, mid_[p]) : word(generation, p, kOne, 0, size_[p]);
  }

  // Wakes the sleeping helpers, steered off this thread's CPU first. Why: woken by the thread that is about
  // to run a step, a helper at times joined it 2-4 ms late (a 43-token prompt after idling: 8 of 15 prompts
  // in docs/engine.md's A/B; none with the threads pinned to two CPUs), presumably queued on the waker's own
  // CPU (the kernel's wake-affine choice) until the scheduler moved it; allowed only the other CPUs it starts
  // there (0 of 15 late), and once awake it takes the waker's CPUs back (helper_main), so the scheduler may
  // move it later as usual. Nothing where this thread may run on one CPU only, or without Linux's affinity
  // calls, or while a helper is awake (each steered helper is asleep, so it takes the CPUs back when it wakes).
  void wake_sleepers() {
    std::lock_guard<std::mutex> lock(mutex_);
#if defined(__linux__)
    const int cpu = sched_getcpu();
    if (steer_ && sleeping_.load(std::memory_order_relaxed) == static_cast<int>(helpers_.size()) && cpu >= 0 &&
        pthread_getaffinity_np(pthread_self(), sizeof wake_mask_, &wake_mask_) == 0 &&
        CPU_ISSET(cpu, &wake_mask_) && CPU_COUNT(&wake_mask_) > 1) {
      cpu_set_t others = wake_mask_;
      CPU_CLR(cpu, &others);
      for (auto& helper : helpers_) pthread_setaffinity_np(helper.native_handle(), sizeof others, &others);
      ++steers_;
    }
#endif
    wake_.notify_all();
  }

  void ensure_helpers(int count) {
    while (static_cast<int>(helpers_.size()) < count) {
      const int worker = static_cast<int>(helpers_.size()) + 1;
      helpers_.emplace_back([this, worker] { helper_main(worker); });
    }
  }

  // Take tasks of step `generation` until it has none left. A task is taken only while the word still
  // holds that generation: a helper that the OS paused after its last task of a step must not take (and
  // then mishandle, its phase being the old step's) a task of the next one. A word of a live step
  // always has units left in its phase (taking the last ones moves it on), so the per-phase arrays read
  // before the compare-exchange are this step's whenever it succeeds; a finished step's word says
  // phase = kDone and nothing is read.
  void participate(int worker, uint64_t generation, bool profiling) {
    using clock = std::chrono::steady_clock;
    WorkerStats* stats = profiling ? &stats_[worker] : nullptr;
    auto mark = stats ? clock::now() : clock::time_point{};
    if (stats && worker > 0) stats->join_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(mark - started_).count();
    auto lap = [&](int64_t& into) {  // adds the time since the last mark to `into`
      const auto now = clock::now();
      into += std::chrono::duration_cast<std::chrono::nanoseconds>(now - mark).count();
      mark = now;
    };
    const bool back_end = worker % 2 == 1;
    for (;;) {
      uint64_t ticket = ticket_.load(std::memory_order_acquire);
      int64_t phase, u0, u1;
      bool descending;  // the task was taken from its range's upper end
      for (;;) {
        phase = int64_t((ticket >> kPhaseShift) & kPhaseMask);
        if ((ticket >> 48) != generation || phase == kDone) {
          if (stats) lap(stats->other_ns);
          return;
        }
        const int64_t mode = int64_t((ticket >> kModeShift) & 3);
        const int64_t a = int64_t((ticket >> kUnitBits) & kUnitMask), b = int64_t(ticket & kUnitMask);
        uint64_t next;
        if (mode == kHalves) {  // [a, mid) and [b, size), each end taking from its own half's start
          const int64_t mid = mid_[phase], size = size_[phase];
          const int64_t chunk = std::clamp<int64_t>((mid - a + size - b) / (2 * threads_), 1, chunk_[phase]);
          descending = false;
          if (!back_end) {
            u0 = a;
            u1 = std::min(mid, a + chunk);
            next = u1 < mid ? word(generation, phase, kHalves, u1, b) : word(generation, phase, kOneReversed, b, size);
          } else {
            u0 = b;
            u1 = std::min(size, b + chunk);
            next = u1 < size ? word(generation, phase, kHalves, a, u1) : word(generation, phase, kOne, a, mid);
          }
        } else {  // [a, b): kOne's front end takes from a, its back end from b; kOneReversed the other way
          const int64_t chunk = std::clamp<int64_t>((b - a) / (2 * threads_), 1, chunk_[phase]);
          descending = back_end == (mode == kOne);
          u0 = descending ? b - chunk : a;
          u1 = descending ? b : a + chunk;
          if (b - a > chunk) next = descending ? word(generation, phase, mode, a, u0) : word(generation, phase, mode, u1, b);
          else next = first_word(generation, next_[phase + 1]);
        }
        if (ticket_.compare_exchange_weak(ticket, next, std::memory_order_acq_rel, std::memory_order_acquire)) break;
      }
      if (const int64_t before = after_[phase]; before >= 0) {
        const auto* done = &done_[before].n;
        const int64_t needed = needed_[before];
        if (stats) lap(stats->other_ns);
        if (done->load(std::memory_order_acquire) < needed) {
          if (stats) ++stats->waits;
          work_->prefetch(phase, u0, u1, descending);  // while the other threads finish the phase before
          wait_until([&] { return done->load(std::memory_order_acquire) >= needed; }, worker == 0);
        }
        if (stats) lap(stats->wait_ns);
      } else if (stats) {
        lap(stats->other_ns);
      }
      work_->run(phase, u0, u1, worker, descending);
      if (stats) {
        lap(stats->task_ns);
        ++stats->tasks;
      }
      const int64_t units = u1 - u0;
      if (done_[phase].n.fetch_add(units, std::memory_order_acq_rel) + units == size_[phase] &&
          needed_[phase] > size_[phase]) {
        work_->tail(phase, worker);  // every unit of the phase is done and visible here
        if (stats) lap(stats->task_ns);
        done_[phase].n.fetch_add(1, std::memory_order_acq_rel);
      }
    }
  }

  void helper_main(int worker) {
    uint64_t seen = 0;  // the generation of the last step this helper took part in
    for (;;) {
      // Spin ~50 us for the next step (decode steps come back to back), or until expect_step's time,
      // then sleep.
      const int64_t until = now_ns() + 50000;
      uint64_t gen = ticket_.load(std::memory_order_acquire) >> 48;
      while (gen == seen && now_ns() < std::max(until, linger_until_.load(std::memory_order_relaxed))) {
        for (int i = 0; i < 64; ++i) VOXLANE_PAUSE();
        gen = ticket_.load(std::memory_order_acquire) >> 48;
      }
      bool slept = false;
      if (gen == seen) {
        slept = true;
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
#if defined(__linux__)
        const uint64_t steers = steers_;
#endif
        wake_.wait(lock, [&] {
          return stop_ || linger_until_.load(std::memory_order_seq_cst) > now_ns() ||
                 (ticket_.load(std::memory_order_seq_cst) >> 48) != seen;
        });
        sleeping_.fetch_sub(1, std::memory_order_seq_cst);
        if (stop_) return;
#if defined(__linux__)
        if (steers_ != steers) {  // woken off the waker's CPU (wake_sleepers): its CPUs back, now that it runs
          const cpu_set_t mask = wake_mask_;
          lock.unlock();
          pthread_setaffinity_np(pthread_self(), sizeof mask, &mask);
        }
#endif
        gen = ticket_.load(std::memory_order_acquire) >> 48;
        if (gen == seen) continue;  // woken by expect_step: spin for the step (awake when it starts)
      }
      seen = gen;
      if (worker <= active_helpers_.load(std::memory_order_relaxed)) {
        const bool profiling = profiling_now() && worker < kProfiledWorkers;
        if (profiling && slept) ++stats_[worker].sleeps;
        participate(worker, gen, profiling);
      }
    }
  }
};

}  // namespace voxlane
