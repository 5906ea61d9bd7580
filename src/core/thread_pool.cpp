#include "core/thread_pool.h"

#include "core/cpu_count.h"

#include <sched.h>

#include <memory>

#if defined(__x86_64__)
#include <immintrin.h>
#define SWIFTLET_PAUSE() _mm_pause()
#else
#define SWIFTLET_PAUSE() std::this_thread::yield()
#endif

namespace swiftlet {

namespace {
int g_threads = 0;  // 0: hardware concurrency
}

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) threads = 1;
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_tasks(uint32_t gen) {
  const auto* fn = job_.load(std::memory_order_acquire);
  const int64_t n = n_tasks_.load(std::memory_order_acquire);
  uint64_t t = ticket_.load(std::memory_order_acquire);
  for (;;) {
    if (uint32_t(t >> 32) != gen || int64_t(t & 0xffffffffu) >= n) return;
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) continue;
    (*fn)(int64_t(t & 0xffffffffu));
    done_.fetch_add(1, std::memory_order_release);
    t = ticket_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    // Spin a little for the next job before sleeping: decode issues thousands of small jobs.
    uint32_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < 20000; ++spin) {
      SWIFTLET_PAUSE();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load() != seen; });
      g = generation_.load();
    }
    seen = g;
    if (stop_.load()) return;
    run_tasks(g);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  uint32_t gen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gen = generation_.load() + 1;
    // The finished job's ticket is closed first. A worker late from it may read this job's
    // function and count below; it must then find no index of its own job left to claim (it
    // once took the finished job's exhausted ticket as within the new, larger count, ran a task
    // twice and left this loop waiting for a count it had passed).
    ticket_.store(uint64_t(gen) << 32 | 0xffffffffu, std::memory_order_relaxed);
    job_.store(&fn, std::memory_order_release);
    n_tasks_.store(n, std::memory_order_release);
    done_.store(0, std::memory_order_relaxed);
    ticket_.store(uint64_t(gen) << 32, std::memory_order_release);
    generation_.store(gen, std::memory_order_release);
  }
  cv_.notify_all();
  run_tasks(gen);
  for (int spin = 0; done_.load(std::memory_order_acquire) != n; ++spin) {
    if (spin < 4000) SWIFTLET_PAUSE();
    else sched_yield();  // a claimed task's thread was descheduled: let it run
  }
}

ThreadPool& ThreadPool::global() {
  static std::unique_ptr<ThreadPool> pool = std::make_unique<ThreadPool>(
      g_threads > 0 ? g_threads : default_thread_count());
  return *pool;
}

void ThreadPool::set_global_threads(int threads) { g_threads = threads; }

}  // namespace swiftlet
