// GpuProfile and HostTiming (gpu_profile.h).
#include "model/gpu_profile.h"

#if SWIFTLET_HAVE_CUDA

#include <fmt/format.h>

#include <algorithm>

namespace swiftlet {

namespace cu = swiftlet::cuda;

GpuProfile::~GpuProfile() {
  for (cu::GpuEvent e : marks_) cu::event_destroy(e);
}

void GpuProfile::begin(cu::GpuStream s) {
  n_marks_ = 0;
  in_step_ = true;
  mark("start", s);
}

void GpuProfile::record(const char* part, cu::GpuStream s) {
  if (n_marks_ == marks_.size()) {
    marks_.push_back(cu::event_create_timed());
    names_.push_back(nullptr);
  }
  names_[n_marks_] = part;
  cu::event_record(marks_[n_marks_++], s);
}

void GpuProfile::end(Parts& p, int64_t tokens) {
  const bool was = in_step_;
  in_step_ = false;
  if (!on_ || !was || n_marks_ < 2) return;
  cu::event_sync(marks_[n_marks_ - 1]);
  for (size_t i = 1; i < n_marks_; ++i) {
    const double us = 1e3 * cu::event_elapsed_ms(marks_[i - 1], marks_[i]);
    auto it = std::find_if(p.us.begin(), p.us.end(), [&](auto& e) { return e.first == names_[i]; });
    if (it == p.us.end())
      p.us.emplace_back(names_[i], us);
    else
      it->second += us;
  }
  p.tokens += tokens;
  n_marks_ = 0;
}

std::string GpuProfile::report() const {
  std::string out;
  for (const Parts* p : {&decode_, &prefill_}) {
    if (p->tokens == 0) continue;
    double total = 0;
    for (auto& [name, us] : p->us) total += us;
    out += p == &decode_ ? "decode steps:\n" : "batched prompts (per prompt token):\n";
    for (auto& [name, us] : p->us)
      out += fmt::format("  {:<40} {:9.2f} us/token {:5.1f}%\n", name, us / double(p->tokens), 100.0 * us / total);
    out += fmt::format("  {:<40} {:9.2f} us/token over {} tokens\n", "total", total / double(p->tokens), p->tokens);
  }
  return out;
}

std::string HostTiming::report() const {
  if (steps == 0) return "";
  const double n = double(steps);
  return fmt::format(
      "host per decode step ({} steps): enqueue {:.1f} us (the graph launch; without every expert resident the "
      "layers with their uploads), wait for the GPU + logits {:.1f} us, between steps (the caller) {:.1f} us\n",
      steps, 1e6 * enqueue_s / n, 1e6 * wait_s / n, 1e6 * between_s / n);
}

}  // namespace swiftlet

#endif
