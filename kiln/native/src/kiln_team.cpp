// The team of threads kiln's parallel regions use (include/kiln_team.h `kiln::team`): OpenMP's
// count, less the threads the cores cannot run now.
//
// What it reacts to is the kernel's own account of waiting: the share of its time the calling
// thread spent ready to run with no core free (the run delay, /proc/thread-self/schedstat's second
// field), read once per CHECK_NS. Measured on the 2-core Intel Xeon (a model of a decode step:
// regions of 40 us on 2 threads, 20-ms intervals): quiet, a median of 0.000, but 2 % of the
// intervals over 0.2 (a kernel thread's or another process's wake-up: kiln's llm suite narrowed a
// few times a run at 0.1 and two in a row); beside one busy process a median of 0.49 (89 % of the
// intervals over 0.2), each step 50-90x longer; at 1 thread beside it 0.000 (none over 0.2), as
// fast as 1 thread quiet. Three busy checks in a row take one thread off the team; a narrowed team
// tries one more after a hold, which doubles each time the try is busy, so that beside a process
// that stays the tries cost ~1 % (CHECK_NS of slow regions a LONGEST_HOLD_NS).
//
// The signal is the calling thread's own wait: on a machine of many cores, one busy process delays
// each of a full team's threads by ~1/(cores + 1) of the time, under BUSY, and is not seen (not
// measured: the development VMs have 2 cores).
//
// Nothing here changes OpenMP's settings for the process: the count is passed to kiln's own
// regions' `num_threads` clause, and the ATen calls kiln makes run under `Narrowed` (the calling
// thread's count, restored after the call); ATen's regions elsewhere and the process's other code
// see OpenMP as they did. The setting
// runtime.adaptive_team (kiln_set_adaptive_team) turns it off. Where schedstat cannot be read
// (no CONFIG_SCHED_INFO, not Linux) the count is OpenMP's.
#include <omp.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>

namespace kiln_team {

constexpr double BUSY = 0.25;                         // run delay over the interval, a share of it
constexpr int BUSY_CHECKS = 3;                        // in a row take a thread off (fewer: a daemon's blips)
constexpr int64_t CHECK_NS = 20'000'000;              // a few scheduler slices
constexpr int64_t HOLD_NS = 250'000'000;              // before a narrowed team tries one more thread
constexpr int64_t LONGEST_HOLD_NS = 4'000'000'000;    // the hold, doubled by each busy try, at most

// The decisions, apart from the clock and the kernel (the tests replay them: kiln_team_replay).
struct Policy {
  int cut = 0;           // threads taken off OpenMP's count
  int busy_run = 0;      // busy checks in a row
  bool trying = false;   // the last check gave a thread back: this one says whether it holds
  int64_t hold = HOLD_NS;
  int64_t retry_at = 0;

  // One check at `now` of an interval `busy` or not, OpenMP's count being `full`.
  void check(int64_t now, bool busy, int full) {
    cut = std::max(0, std::min(cut, full - 1));
    busy_run = busy ? busy_run + 1 : 0;
    if (trying) {
      trying = false;
      if (busy) {  // (one busy check suffices: the try is what it tests)
        hold = std::min(2 * hold, LONGEST_HOLD_NS);
        cut = std::min(cut + 1, std::max(0, full - 1));
        busy_run = 0;
      } else {
        hold = HOLD_NS;
      }
      retry_at = now + hold;
    } else if (busy_run >= BUSY_CHECKS) {
      cut = std::min(cut + 1, std::max(0, full - 1));
      busy_run = 0;
      retry_at = now + hold;
    } else if (!busy && cut > 0 && now >= retry_at) {
      --cut;
      trying = true;
    }
  }
};

static std::atomic<bool> enabled{true};
static std::atomic<int> cut_now{0};
static std::atomic<int64_t> next_check{0};
static std::atomic<bool> checking{false};
static std::atomic<int64_t> narrowings{0};
static std::atomic<int64_t> asks{0};  // (regions that asked: tests see the kernels' libraries find the runtime)
static Policy policy;  // (guarded by `checking`)

// f() with the policy to itself: waits for a check under way (a setting or a test changing it).
template <typename F> static void with_policy(F&& f) {
  while (checking.exchange(true, std::memory_order_acquire)) {
  }
  f();
  checking.store(false, std::memory_order_release);
}

static int64_t clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The calling thread's run delay in ns so far; -1 where the kernel does not say.
static int64_t run_delay_ns() {
  const int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[128];
  const ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return -1;
  text[n] = 0;
  char* after_run_time;
  std::strtoll(text, &after_run_time, 10);
  char* end;
  const long long delay = std::strtoll(after_run_time, &end, 10);
  return end == after_run_time ? -1 : delay;
}

// A check on this thread: the share of the time since its last check spent waiting for a core.
static void check(int64_t now, int full) {
  thread_local int64_t last_now = 0, last_delay = -1;
  const int64_t delay = run_delay_ns();
  if (delay < 0) {  // no schedstat: never narrow
    enabled.store(false);
    return;
  }
  if (last_delay >= 0 && now > last_now) {
    const bool busy = double(delay - last_delay) > BUSY * double(now - last_now);
    const int before = policy.cut;
    policy.check(now, busy, full);
    if (policy.cut > before) narrowings.fetch_add(1);
    cut_now.store(policy.cut);
  }
  last_now = now;
  last_delay = delay;
}

}  // namespace kiln_team

extern "C" int kiln_team_threads(void);
// MKL's count for the calling thread only (0: its global one again), where libtorch has MKL.
extern "C" __attribute__((weak)) int MKL_Set_Num_Threads_Local(int threads);

namespace kiln_team {

// The calling thread's OpenMP count (and MKL's) at kiln's team while the team is narrowed, for the
// ATen calls kiln's operators and wrappers make (an `aten` product, ATen attention): their regions
// take the calling thread's count, and MKL its own. Restored when it ends; nothing changes while
// the team is whole. Beside one busy process (2-core Intel Xeon with AMX), a 1x896 @ 896x4864
// float32 product through ATen: 2.5-2.8 ms at 2 threads, 0.48 at MKL's and OpenMP's 1, 0.31 quiet.
class Narrowed {
 public:
  Narrowed() {
    if (cut_now.load(std::memory_order_relaxed) == 0 || omp_in_parallel()) return;
    const int team = kiln_team_threads();
    openmp_ = omp_get_max_threads();
    if (team >= openmp_) return;
    omp_set_num_threads(team);
    if (MKL_Set_Num_Threads_Local) mkl_ = MKL_Set_Num_Threads_Local(team);
    narrowed_ = true;
  }
  ~Narrowed() {
    if (!narrowed_) return;
    omp_set_num_threads(openmp_);
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(mkl_);
  }
  Narrowed(const Narrowed&) = delete;
  Narrowed& operator=(const Narrowed&) = delete;

 private:
  bool narrowed_ = false;
  int openmp_ = 0, mkl_ = 0;
};

}  // namespace kiln_team

extern "C" {

KILN_API int kiln_team_threads(void) {
  using namespace kiln_team;
  const int full = omp_get_max_threads();
  asks.fetch_add(1, std::memory_order_relaxed);
  if (!enabled.load(std::memory_order_relaxed) || omp_in_parallel()) return full;
  const int64_t now = clock_ns();
  if (now >= next_check.load(std::memory_order_relaxed) && !checking.exchange(true, std::memory_order_acquire)) {
    next_check.store(now + CHECK_NS, std::memory_order_relaxed);
    check(now, full);
    checking.store(false, std::memory_order_release);
  }
  return std::max(1, full - cut_now.load(std::memory_order_relaxed));
}

// The setting runtime.adaptive_team: off, every region takes OpenMP's count (the cut forgotten).
KILN_API void kiln_set_adaptive_team(int on) {
  using namespace kiln_team;
  const bool wanted = on != 0 && run_delay_ns() >= 0;
  if (wanted == enabled.load()) return;  // (each frozen program hands its settings over)
  with_policy([&] {
    policy = Policy();
    cut_now.store(0);
    enabled.store(wanted);
  });
}

// Threads taken off OpenMP's count now; how many times one was taken, and how many regions asked
// for the team, since the process began.
KILN_API int kiln_team_cut(void) { return kiln_team::cut_now.load(); }
KILN_API int64_t kiln_team_narrowings(void) { return kiln_team::narrowings.load(); }
KILN_API int64_t kiln_team_asks(void) { return kiln_team::asks.load(); }

// (tests) `cut` threads taken off as busy checks would, the next try a hold away.
KILN_API void kiln_team_force_cut(int cut) {
  using namespace kiln_team;
  with_policy([&] {
    policy.cut = cut;
    policy.retry_at = clock_ns() + policy.hold;
    cut_now.store(cut);
  });
}

// (tests) The policy's cut after each of `n` checks at times `now` (ns), busy or not, of a
// fresh policy under OpenMP's count `full`.
KILN_API void kiln_team_replay(int64_t n, const int64_t* now, const int32_t* busy, int32_t full, int32_t* cuts) {
  kiln_team::Policy replayed;
  for (int64_t i = 0; i < n; ++i) {
    replayed.check(now[i], busy[i] != 0, full);
    cuts[i] = replayed.cut;
  }
}

}  // extern "C"
