// What a dependency across the whole GPU costs (measure_sync_cost, for swiftlet_bench_cuda): a
// decode step is ~290 kernels in a chain, each reading what its predecessor wrote, so the price of
// one link bounds the step from below whatever the kernels do. Each of `steps` dependent steps here
// is the smallest such work (every block reads a hidden-size vector, sums it, and writes its share
// of the next one), linked by kernel boundaries with PDL, boundaries without, or grid barriers of
// three kinds inside one persistent launch. Every variant's result is checked against the host.
#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda/launch.cuh"
#include "bench/cuda/measure.cuh"
#include "bench/cuda/measure.h"
#include "kernels/cuda/cuda_common.cuh"

namespace swiftlet::cuda::bench {
namespace {
using namespace detail;

constexpr int kSyncThreads = 512;
constexpr int kSyncN = 2048;  // a hidden size

// Three grid barriers. The first is the one the MoE half in one launch used (moe_decode, removed in
// session 9: slower than its three kernels, 280-297 against 366-394 tok/s).

// A barrier across the grid (every block resident: grid <= SMs, one block each). bar[0] counts
// arrivals, bar[1] is the generation; both persist across launches (the count returns to 0).
// Writes before the barrier are visible to every block after it (fences around the atomics; read
// such data with __ldcg, not the non-coherent path).
__device__ __forceinline__ void grid_barrier(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned gen;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(bar + 1) : "memory");
    __threadfence();
    if (atomicAdd(bar, 1u) == gridDim.x - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      unsigned g = gen;
      while (g == gen) {
        __nanosleep(32);
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(g) : "l"(bar + 1) : "memory");
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// grid_barrier by acquire/release atomics (no separate fences) and a busy spin (no sleep).
__device__ __forceinline__ void grid_barrier_ar(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned gen, old;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(bar + 1) : "memory");
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(bar) : "memory");
    if (old == gridDim.x - 1) {
      asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(bar) : "memory");
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(bar + 1), "r"(gen + 1) : "memory");
    } else {
      unsigned g;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(g) : "l"(bar + 1) : "memory");
      } while (g == gen);
    }
  }
  __syncthreads();
}

// A grid barrier on a counter that only grows: every block adds 1 (a release reduction, no
// returned value) and spins until the count reaches `target` (grid x barriers so far, this one
// included). The counter starts at 0 for the launch.
__device__ __forceinline__ void grid_barrier_count(unsigned* count, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    count_arrive(count);
    count_wait(count, target);
  }
  __syncthreads();
}

// out[i] = (in[i] + mean(in)) / 2 + 1 for this block's share of i; every block reads all of in
// (L2-coherent loads: in was written in this launch where a grid barrier came before). A block that
// read a stale in would be off by ~1 (the mean grows by 1 a step).
__device__ __forceinline__ void sync_step(const float* in, float* out, int n, float* red) {
  float s = 0.0f;
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) s += __ldcg(in + i);
  const float mean = block_sum(s, red) / float(n);
  const int share = (n + int(gridDim.x) - 1) / int(gridDim.x), i0 = int(blockIdx.x) * share;
  for (int i = i0 + int(threadIdx.x); i < min(n, i0 + share); i += int(blockDim.x))
    out[i] = 0.5f * (__ldcg(in + i) + mean) + 1.0f;
}

__global__ void __launch_bounds__(kSyncThreads) chained_step_kernel(const float* in, float* out, int n) {
  __shared__ float red[32];
  pdl_wait_and_release();
  sync_step(in, out, n, red);
}

template <int KIND>  // 0: grid_barrier, 1: grid_barrier_ar, 2: grid_barrier_count
__global__ void __launch_bounds__(kSyncThreads) persistent_steps_kernel(float* a, float* b, int n, int steps,
                                                                         unsigned* bar) {
  __shared__ float red[32];
  for (int i = 0; i < steps; ++i) {
    sync_step(i % 2 ? b : a, i % 2 ? a : b, n, red);
    if (KIND == 2)
      grid_barrier_count(bar + 2, unsigned(i + 1) * gridDim.x);
    else if (KIND == 1)
      grid_barrier_ar(bar);
    else
      grid_barrier(bar);
  }
}

}  // namespace

SyncCost measure_sync_cost(int steps, int reps) {
  SWIFTLET_CUDA_REQUIRE(steps >= 2 && steps % 2 == 0 && reps >= 2);
  cudaStream_t s;
  SWIFTLET_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *a, *b;
  unsigned* bar;  // grid_barrier's two words, grid_barrier_ar's two (the same), grid_barrier_count's
  SWIFTLET_CUDA_CHECK(cudaMalloc(&a, kSyncN * sizeof(float)));
  SWIFTLET_CUDA_CHECK(cudaMalloc(&b, kSyncN * sizeof(float)));
  SWIFTLET_CUDA_CHECK(cudaMalloc(&bar, 3 * sizeof(unsigned)));
  SWIFTLET_CUDA_CHECK(cudaMemset(bar, 0, 3 * sizeof(unsigned)));
  // The start vector and, on the host in double, where `steps` steps take it (back in a).
  std::vector<float> x0(kSyncN), got(kSyncN);
  for (int i = 0; i < kSyncN; ++i) x0[size_t(i)] = float(i % 97) * 0.25f;
  const std::vector<double> want = chain_reference(x0, steps);
  SyncCost c{};
  c.ok = true;
  // One variant: its graph run once from x0 and checked, then timed.
  auto measure = [&](cudaGraphExec_t g) {
    SWIFTLET_CUDA_CHECK(cudaMemcpyAsync(a, x0.data(), kSyncN * sizeof(float), cudaMemcpyHostToDevice, s));
    SWIFTLET_CUDA_CHECK(cudaGraphLaunch(g, s));
    SWIFTLET_CUDA_CHECK(cudaMemcpyAsync(got.data(), a, kSyncN * sizeof(float), cudaMemcpyDeviceToHost, s));
    SWIFTLET_CUDA_CHECK(cudaStreamSynchronize(s));
    if (!chain_matches(got, want)) c.ok = false;
    const double us = best_graph_us(g, s, reps) / steps;
    SWIFTLET_CUDA_CHECK(cudaGraphExecDestroy(g));
    return us;
  };
  const unsigned grid = unsigned(sm_count());  // one block an SM, as the decode kernels
  const bool pdl = tuning().pdl;
  for (int mode = 0; mode < 2; ++mode) {  // with PDL (where the device has it), without
    tuning().pdl = mode == 0 && pdl;
    (mode == 0 ? c.boundary_pdl_us : c.boundary_us) = measure(capture_graph(s, [&] {
      for (int i = 0; i < steps; ++i)
        launch(chained_step_kernel, grid, kSyncThreads, 0, s, i % 2 ? b : a, i % 2 ? a : b, kSyncN);
    }));
  }
  tuning().pdl = false;  // the persistent kernel has no predecessor to wait for
  for (int kind = 0; kind < 3; ++kind)
    (kind == 2 ? c.barrier_count_us : kind == 1 ? c.barrier_ar_us : c.barrier_us) = measure(capture_graph(s, [&] {
      SWIFTLET_CUDA_CHECK(cudaMemsetAsync(bar + 2, 0, sizeof(unsigned), s));  // grid_barrier_count's count
      launch(kind == 2   ? persistent_steps_kernel<2>
             : kind == 1 ? persistent_steps_kernel<1>
                         : persistent_steps_kernel<0>,
             grid, kSyncThreads, 0, s, a, b, kSyncN, steps, bar);
    }));
  tuning().pdl = pdl;
  SWIFTLET_CUDA_CHECK(cudaFree(a));
  SWIFTLET_CUDA_CHECK(cudaFree(b));
  SWIFTLET_CUDA_CHECK(cudaFree(bar));
  SWIFTLET_CUDA_CHECK(cudaStreamDestroy(s));
  return c;
}

}  // namespace swiftlet::cuda::bench
