#include "runtime/mask_prefetcher.h"

namespace swiftlet {

MaskPrefetcher::~MaskPrefetcher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void MaskPrefetcher::submit(MaskJob job) {
  std::vector<MaskJob> jobs;
  jobs.push_back(std::move(job));
  submit(std::move(jobs));
}

void MaskPrefetcher::submit(std::vector<MaskJob> jobs) {
  std::erase_if(jobs, [](const MaskJob& j) { return !j.grammar; });
  {
    std::lock_guard lock(mu_);
    queue_.clear();
    for (MaskJob& j : jobs) queue_.push_back(std::move(j));
    if (queue_.empty()) return;
    if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
  }
  cv_.notify_one();
}

void MaskPrefetcher::drain() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

uint64_t MaskPrefetcher::jobs_done() const {
  std::lock_guard lock(mu_);
  return done_;
}

void MaskPrefetcher::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    MaskJob job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    job.run();
    job = {};  // its grammar is released outside the lock
    lock.lock();
    busy_ = false;
    ++done_;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace swiftlet
