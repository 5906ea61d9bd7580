// A persistent pool of worker threads for data-parallel kernels. The caller's thread takes
// part too, so a pool of N threads starts N - 1 workers. parallel_for does not allocate;
// workers spin briefly before sleeping, so back-to-back small jobs (decode) stay cheap.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace swiftlet {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Runs fn(task) for task in [0, n), spread over the threads; returns when all are done.
  // fn must not throw. Not reentrant: one parallel_for at a time per pool.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

  // The process-wide pool used by the CPU kernels (threads = cores unless set_threads was called).
  static ThreadPool& global();
  static void set_global_threads(int threads);

 private:
  void worker_loop();
  void run_tasks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int> pending_{0};       // workers still inside the current job
  std::atomic<uint64_t> generation_{0};
  bool stop_ = false;
};

}  // namespace swiftlet
