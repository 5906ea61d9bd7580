// The measurement kernels' shared helpers (sync_cost.cu, stream_chain.cu): graph capture and
// timing, the dependent step both chains compute with its host reference, and a grid-wide count.
// Bench code only: nothing of the product includes it.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

#include <algorithm>
#include <cmath>
#include <vector>

namespace swiftlet::cuda::bench {

// The launches `launches` makes on s,
// captured and instantiated as a graph; and the fastest of `reps` runs of one, in microseconds.
template <typename F>
cudaGraphExec_t capture_graph(cudaStream_t s, F&& launches) {
  cudaGraph_t g;
  cudaGraphExec_t exec;
  SWIFTLET_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  launches();
  SWIFTLET_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  SWIFTLET_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  SWIFTLET_CUDA_CHECK(cudaGraphDestroy(g));
  return exec;
}
inline double best_graph_us(cudaGraphExec_t g, cudaStream_t s, int reps) {
  cudaEvent_t t0, t1;
  SWIFTLET_CUDA_CHECK(cudaEventCreate(&t0));
  SWIFTLET_CUDA_CHECK(cudaEventCreate(&t1));
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    SWIFTLET_CUDA_CHECK(cudaEventRecord(t0, s));
    SWIFTLET_CUDA_CHECK(cudaGraphLaunch(g, s));
    SWIFTLET_CUDA_CHECK(cudaEventRecord(t1, s));
    SWIFTLET_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0.0f;
    SWIFTLET_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    best = std::min(best, double(ms) * 1e3);
  }
  SWIFTLET_CUDA_CHECK(cudaEventDestroy(t0));
  SWIFTLET_CUDA_CHECK(cudaEventDestroy(t1));
  return best;
}
// Their dependent step, out[i] = (in[i] + mean(in)) / 2 + 1 (a stale input is off by ~1: the mean
// grows by ~1 a step): where `steps` of it take x0, in double on the host; and whether the
// device's result matches that within 1e-3 (relative).
inline std::vector<double> chain_reference(const std::vector<float>& x0, int steps) {
  std::vector<double> v(x0.begin(), x0.end());
  for (int t = 0; t < steps; ++t) {
    double mean = 0.0;
    for (double e : v) mean += e;
    mean /= double(v.size());
    for (double& e : v) e = 0.5 * (e + mean) + 1.0;
  }
  return v;
}
inline bool chain_matches(const std::vector<float>& got, const std::vector<double>& want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= 1e-3 * (1.0 + std::fabs(want[i])))) return false;
  return true;
}
// A grid-wide count that only grows.
// count_arrive adds 1 as a release (the thread's writes, and its block's ordered before it by a
// block barrier, are visible to whoever then sees the count); count_wait spins until the count is
// at least `target` (acquire).
__device__ __forceinline__ void count_arrive(unsigned* count) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
}
__device__ __forceinline__ void count_wait(const unsigned* count, unsigned target) {
  unsigned c;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(c) : "l"(count) : "memory");
  } while (c < target);
}

}  // namespace swiftlet::cuda::bench
