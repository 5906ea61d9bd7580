#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace swiftlet {
namespace {

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 3, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      for (int round = 0; round < 50; ++round)
        pool.parallel_for(n, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
      for (auto& h : hits) ASSERT_EQ(h.load(), 50) << threads << " threads, n " << n;
    }
  }
}

// Jobs of alternating sizes, back to back, more threads than cores: a worker late from one job
// must neither run a task of the next (it once could, when the next job had more tasks: it took
// the finished job's exhausted ticket against the new job's count, ran a task twice and left the
// caller spinning forever on a count past the end). Every job's tasks run exactly once, before
// parallel_for returns.
TEST(ThreadPool, ALateWorkerNeverRunsATaskOfTheNextJob) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(64);
  for (int job = 0; job < 20000; ++job) {
    const int64_t n = job % 2 ? 2 : 37;
    for (int64_t i = 0; i < n; ++i) hits[size_t(i)].store(0, std::memory_order_relaxed);
    pool.parallel_for(n, [&](int64_t i) { hits[size_t(i)].fetch_add(1, std::memory_order_relaxed); });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "job " << job << " task " << i;
  }
}

TEST(ThreadPool, ResultsVisibleAfterReturn) {
  ThreadPool pool(3);
  std::vector<int64_t> out(10000);
  pool.parallel_for(int64_t(out.size()), [&](int64_t i) { out[size_t(i)] = i * i; });
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], int64_t(i * i));
}

}  // namespace
}  // namespace swiftlet
