// The machine's read bandwidth, measured the way a matvec must read its weights at least: every
// thread of the global pool sums its slice of a large array (SSE adds on x86-64, NEON on aarch64,
// so that the measure is not itself compute bound; no software prefetch: on Zen 4 it made this
// plain stream slower, 22 -> 15 GB/s). The bound the benchmarks' "share of bandwidth" divides by
// (swiftlet_bench_kernels, swiftlet_ops_test --perf).
#pragma once

#include <cstddef>
#include <vector>

namespace swiftlet {

class ReadBandwidth {
 public:
  explicit ReadBandwidth(size_t bytes) : a_(bytes / 4, 1.0f) {}
  // GB/s of one pass over the array.
  double pass();
  // The best of `reps` passes.
  double best(int reps);

 private:
  std::vector<float> a_;
  std::vector<double> sums_;
};

}  // namespace swiftlet
