// Token masks made ahead of need on a worker thread while the model runs (the GPU's decode
// step: the host thread only waits for it). Once a token is accepted, the state the next step
// samples from is known; its mask, if the grammar cache lacks it, is made during the forward
// pass, so a refused pick after it finds the mask ready (TokenConstraint::apply).
//
// The worker gets MaskJobs (a grammar, a state and bytes: no reference to a constraint), so the
// generation loop never waits for it and never shares a constraint with it; the grammar's
// matcher and the mask store are behind their own locks (grammar_cache.h). Prefetching only
// fills the cache: the tokens sampled are the same with it or without it.
//
// Not for the CPU backend: its forward pass already uses every core.
#pragma once

#include "runtime/token_constraint.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace swiftlet {

class MaskPrefetcher {
 public:
  MaskPrefetcher() = default;
  ~MaskPrefetcher();  // finishes the job under way, drops the rest, joins the worker
  MaskPrefetcher(const MaskPrefetcher&) = delete;
  MaskPrefetcher& operator=(const MaskPrefetcher&) = delete;

  // Queues the jobs with a grammar, in place of those not started yet (their states are past
  // now). The worker starts on the first call.
  void submit(std::vector<MaskJob> jobs);
  void submit(MaskJob job);
  // Waits until every queued job is done (tests and benchmarks).
  void drain();
  uint64_t jobs_done() const;

 private:
  void loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;       // work queued, or stop
  std::condition_variable idle_cv_;  // the queue ran dry
  std::deque<MaskJob> queue_;
  bool busy_ = false, stop_ = false;
  uint64_t done_ = 0;
  std::thread worker_;
};

}  // namespace swiftlet
