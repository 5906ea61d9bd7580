// A persistent pool of worker threads for data-parallel kernels. The caller's thread takes
// part too, so a pool of N threads starts N - 1 workers. parallel_for does not allocate.
//
// Completion is counted in tasks, not workers: the caller returns as soon as every task has
// run, whoever ran it. On a shared, noisy machine a descheduled worker therefore never holds
// up a job; it finds nothing left to claim when it wakes. Tasks are claimed with a ticket that
// carries the job's generation, so a late worker cannot run a task of the next job.
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

  // The process-wide pool used by the CPU kernels (threads: default_thread_count(), core/cpu_count.h, unless set_global_threads was called).
  static ThreadPool& global();
  static void set_global_threads(int threads);

 private:
  void worker_loop();
  void run_tasks(uint32_t gen);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<const std::function<void(int64_t)>*> job_{nullptr};
  std::atomic<int64_t> n_tasks_{0};
  std::atomic<uint64_t> ticket_{0};  // generation << 32 | next task index
  std::atomic<int64_t> done_{0};     // tasks finished in the current job
  std::atomic<uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace swiftlet
