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

TEST(ThreadPool, ResultsVisibleAfterReturn) {
  ThreadPool pool(3);
  std::vector<int64_t> out(10000);
  pool.parallel_for(int64_t(out.size()), [&](int64_t i) { out[size_t(i)] = i * i; });
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], int64_t(i * i));
}

}  // namespace
}  // namespace swiftlet
