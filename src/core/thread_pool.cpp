#include "core/thread_pool.h"

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
    stop_ = true;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_tasks() {
  for (;;) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_tasks_) break;
    (*job_)(i);
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little for the next job before sleeping: decode issues thousands of small jobs.
    uint64_t g = generation_.load(std::memory_order_acquire);
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
    if (stop_) return;
    run_tasks();
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    n_tasks_ = n;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(int(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  run_tasks();
  while (pending_.load(std::memory_order_acquire) != 0) SWIFTLET_PAUSE();
}

ThreadPool& ThreadPool::global() {
  static std::unique_ptr<ThreadPool> pool = std::make_unique<ThreadPool>(
      g_threads > 0 ? g_threads : int(std::max(1u, std::thread::hardware_concurrency())));
  return *pool;
}

void ThreadPool::set_global_threads(int threads) { g_threads = threads; }

}  // namespace swiftlet
