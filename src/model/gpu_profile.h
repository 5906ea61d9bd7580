// Where the GPU time of decode steps and batched prompts goes (a pass made with profiling on):
// a timing event after each part, summed per part name; and the host's share of decode steps.
// Internal to model/ (CUDA builds only).
#pragma once

#include "kernels/cuda/cuda_kernels.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace swiftlet {

class GpuProfile {
 public:
  struct Parts {
    std::vector<std::pair<std::string, double>> us;  // per part, forward order
    int64_t tokens = 0;
  };

  explicit GpuProfile(bool on) : on_(on) {}
  ~GpuProfile();
  GpuProfile(const GpuProfile&) = delete;
  GpuProfile& operator=(const GpuProfile&) = delete;

  bool on() const { return on_; }
  // A decode step or a batched prompt begins: marks count from here ("start" is recorded on s).
  void begin(cuda::GpuStream s);
  // A timing event on s after the part named `part` (a string literal); nothing when off or
  // outside a step.
  void mark(const char* part, cuda::GpuStream s) {
    if (on_ && in_step_) record(part, s);
  }
  // The step or prompt ends: its parts' times are added to `p` (decode() or prefill()).
  void end(Parts& p, int64_t tokens);
  Parts& decode() { return decode_; }
  Parts& prefill() { return prefill_; }
  // Lines "part us/token share", a table for decode steps and one for batched prompts.
  std::string report() const;

 private:
  void record(const char* part, cuda::GpuStream s);

  bool on_;
  bool in_step_ = false;
  std::vector<cuda::GpuEvent> marks_;
  std::vector<const char*> names_;
  size_t n_marks_ = 0;
  Parts decode_, prefill_;
};

// Host time of one-token runs (decode steps): enqueueing the step (the graph launch), waiting for
// the GPU and the logits, and the time between runs (the caller's).
struct HostTiming {
  using Clock = std::chrono::steady_clock;
  double enqueue_s = 0, wait_s = 0, between_s = 0;
  int64_t steps = 0;
  Clock::time_point last_return{};
  std::string report() const;  // empty before two such runs
};

}  // namespace swiftlet
