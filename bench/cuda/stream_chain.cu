// What a decode step could take if each SM streamed its weights ahead of the chain
// (measure_stream_chain, for swiftlet_bench_cuda). A decode layer is a chain of phases (the 80B's
// DeltaNet layer: projections, the step, out_proj, router, the experts' act, down), each reading the
// vector its predecessor wrote and a fixed set of weight bytes that depends on nothing. Here each
// phase is that skeleton: every block reads the 8 KB vector, takes its grid-stride share of the
// phase's bytes in 16 KB tiles through a ring of shared memory (bulk copies by one thread, consumed
// by the other 15 warps, which only add the words up), and writes its share of the next vector.
// Three ways to run the same phases:
//   - stream only: no chain at all (no vector; the tiles as fast as the copy engines bring them);
//   - a kernel a phase with PDL: the present decode's shape (each kernel issues its first tiles
//     before its PDL wait, once its block is on an SM);
//   - one persistent kernel: the phases linked by a count that only grows, the copies running
//     ahead across phases as far as the ring allows.
// The consumers do almost no arithmetic, so the figures bound from below what real products (the
// tensor-core tiles) would take. The chain's result and the sum of every word are checked against
// the host.
#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "bench/cuda/measure.cuh"
#include "bench/cuda/measure.h"
#include "kernels/cuda/product_device.cuh"

namespace swiftlet::cuda::bench {
namespace {
using namespace detail;

constexpr int kChainThreads = 512;  // warp 0: lane 0 issues the copies; warps 1-15 consume
constexpr int kChainConsumers = kChainThreads - 32;
constexpr int kChainN = 2048;                  // the vector a phase reads and writes (a hidden size)
constexpr uint32_t kChainTile = 16 * 1024;     // bytes a copy
constexpr int kChainStages = 12;               // 192 KB of ring a block
constexpr size_t kChainSmem = size_t(kChainStages) * kChainTile;

enum ChainMode : int { kStreamOnly = 0, kPersistent = 1, kKernelPerPhase = 2 };

struct ChainArgs {
  const unsigned char* w;  // every phase's bytes, back to back
  const int64_t* off;      // phase q's bytes are [off[q], off[q + 1]) (device memory; multiples of 16)
  int q0, q1;              // the phases this launch runs
  int mode;                // ChainMode
  float* vec;              // two vectors of kChainN: phase q reads vec[q % 2] and writes the other
  unsigned* count;         // kPersistent: blocks done with a phase, since the launch began
  unsigned* sum;           // += the sum of every 32-bit word consumed (mod 2^32)
};

// The word at index i of the weights (fill_words), which the host sums on its own.
__host__ __device__ __forceinline__ uint32_t chain_word(uint64_t i) {
  uint32_t x = uint32_t(i) * 2654435761u ^ uint32_t(i >> 29);
  x ^= x >> 15;
  return x * 2246822519u;
}

__global__ void fill_words(uint32_t* w, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    w[i] = chain_word(uint64_t(i));
}

// The consumer warps only (named barrier 1; warp 0 is busy issuing copies).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kChainConsumers) : "memory");
}
template <typename T>
__device__ __forceinline__ T consumers_sum(T v, T* red) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) - 1;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  consumers_sync();  // red may still be read by an earlier call
  if (lane == 0) red[w] = v;
  consumers_sync();
  T s = T(0);
  for (int i = 0; i < kChainConsumers / 32; ++i) s += red[i];
  return s;
}

// Thread 0: the stages' mbarriers, `full` completed by the copies (one arrival and their bytes),
// `empty` by the consumer warps' lane 0s.
__device__ __forceinline__ void chain_init(uint64_t* full, uint64_t* empty) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int s = 0; s < kChainStages; ++s) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(full + s)) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(empty + s)), "n"(kChainConsumers / 32)
                 : "memory");
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void empty_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
#endif
}

// The copies, the bulk-copy barriers and the PDL wait are sm_90's (no-ops below it, where
// measure_stream_chain does not launch this).
__global__ void __launch_bounds__(kChainThreads, 1) stream_chain_kernel(const __grid_constant__ ChainArgs a) {
  extern __shared__ float4 smem4[];
  unsigned char* ring = reinterpret_cast<unsigned char*>(smem4);
  __shared__ uint64_t full[kChainStages], empty[kChainStages];
  __shared__ float red[32];
  __shared__ unsigned ured[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = int(gridDim.x), b = int(blockIdx.x);
  auto tiles = [&](int q) {  // phase q's tiles this block takes (b, b + G, ...)
    const int64_t n = (a.off[q + 1] - a.off[q] + kChainTile - 1) / kChainTile;
    return b < n ? int((n - 1 - b) / G + 1) : 0;
  };
  if (threadIdx.x == 0) chain_init(full, empty);
  __syncthreads();
  // Lane 0 of warp 0: the copies, in the order the consumers take them; copy j goes to stage
  // j % S once the consumers have released that stage's use j / S - 1.
  int issued = 0, q_at = a.q0, i_at = 0;
  auto issue = [&](int upto) {
    for (; q_at < a.q1 && issued < upto; ++q_at, i_at = 0) {
      const int n = tiles(q_at);
      const int64_t base = a.off[q_at], bytes = a.off[q_at + 1] - base;
      for (; i_at < n && issued < upto; ++i_at, ++issued) {
        const int s = issued % kChainStages;
        if (issued >= kChainStages) stage_wait(empty + s, issued / kChainStages - 1);
        const int64_t t0 = int64_t(b + i_at * G) * kChainTile;
        const uint32_t tb = uint32_t(min(int64_t(kChainTile), bytes - t0));
        expect_bytes(full + s, tb);
        bulk_copy(ring + size_t(s) * kChainTile, a.w + base + t0, tb, full + s);
      }
      if (i_at < n) return;  // stopped inside the phase
    }
  };
  if (a.mode == kKernelPerPhase) {  // the present kernels: their first tiles before the wait
    if (threadIdx.x == 0) issue(kChainStages);
    pdl_wait_and_release();
  }
  if (warp == 0) {
    if (lane == 0) issue(1 << 30);
    return;
  }
  const int c = int(threadIdx.x) - 32;
  unsigned acc = 0;
  int j = 0;  // tiles consumed
  for (int q = a.q0; q < a.q1; ++q) {
    const float* in = a.vec + (q % 2) * kChainN;
    float* out = a.vec + ((q + 1) % 2) * kChainN;
    float mean = 0.0f;
    if (a.mode != kStreamOnly) {
      if (a.mode == kPersistent && q > a.q0) {  // every block is done with phase q - 1
        if (c == 0) count_wait(a.count, unsigned(q - a.q0) * unsigned(G));
        consumers_sync();
      }
      float s = 0.0f;
      for (int i = c; i < kChainN; i += kChainConsumers) s += __ldcg(in + i);
      mean = consumers_sum(s, red) / float(kChainN);
    }
    const int n = tiles(q);
    const int64_t bytes = a.off[q + 1] - a.off[q];
    for (int i = 0; i < n; ++i, ++j) {
      const int s = j % kChainStages;
      stage_wait(full + s, j / kChainStages);
      const int64_t t0 = int64_t(b + i * G) * kChainTile;
      const int words4 = int(min(int64_t(kChainTile), bytes - t0) / 16);
      const uint4* st = reinterpret_cast<const uint4*>(ring + size_t(s) * kChainTile);
      for (int k = c; k < words4; k += kChainConsumers) {
        const uint4 v = st[k];
        acc += v.x + v.y + v.z + v.w;
      }
      __syncwarp();
      if (lane == 0) empty_arrive(empty + s);
    }
    if (a.mode != kStreamOnly) {
      const int share = (kChainN + G - 1) / G, i0 = b * share;
      for (int i = i0 + c; i < min(kChainN, i0 + share); i += kChainConsumers)
        out[i] = 0.5f * (__ldcg(in + i) + mean) + 1.0f;
      if (a.mode == kPersistent) {
        consumers_sync();  // the block's share is written
        if (c == 0) count_arrive(a.count);
      }
    }
  }
  acc = consumers_sum(acc, ured);
  if (c == 0) atomicAdd(a.sum, acc);
}

}  // namespace

StreamChain measure_stream_chain(const std::vector<int64_t>& phase_bytes, int layers, int reps) {
  SWIFTLET_CUDA_REQUIRE(!phase_bytes.empty() && layers >= 1 && reps >= 1);
  StreamChain r{};
  if (!tuning().capable) return r;  // bulk copies and mbarriers: sm_90
  const int P = int(phase_bytes.size()), Q = P * layers;
  std::vector<int64_t> off(size_t(Q) + 1, 0);
  for (int q = 0; q < Q; ++q) {
    SWIFTLET_CUDA_REQUIRE(phase_bytes[size_t(q % P)] > 0);
    off[size_t(q) + 1] = off[size_t(q)] + (phase_bytes[size_t(q % P)] + 15) / 16 * 16;
  }
  const int64_t total = off.back(), words = total / 4;
  r.layer_bytes = double(total) / layers;
  cudaStream_t s;
  SWIFTLET_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned char* w;
  int64_t* d_off;
  float* vec;
  unsigned* counters;  // the count, the sum
  SWIFTLET_CUDA_CHECK(cudaMalloc(&w, size_t(total)));
  SWIFTLET_CUDA_CHECK(cudaMalloc(&d_off, off.size() * sizeof(int64_t)));
  SWIFTLET_CUDA_CHECK(cudaMalloc(&vec, 2 * kChainN * sizeof(float)));
  SWIFTLET_CUDA_CHECK(cudaMalloc(&counters, 2 * sizeof(unsigned)));
  SWIFTLET_CUDA_CHECK(cudaMemcpy(d_off, off.data(), off.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  fill_words<<<1024, 256, 0, s>>>(reinterpret_cast<uint32_t*>(w), words);
  SWIFTLET_CUDA_CHECK(cudaGetLastError());
  SWIFTLET_CUDA_CHECK(cudaFuncSetAttribute(stream_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(kChainSmem)));
  // What the host expects: the words' sum, and where Q steps take the start vector.
  uint32_t want_sum = 0;
  for (int64_t i = 0; i < words; ++i) want_sum += chain_word(uint64_t(i));
  std::vector<float> x0(kChainN), got(kChainN);
  for (int i = 0; i < kChainN; ++i) x0[size_t(i)] = float(i % 89) * 0.5f;
  const std::vector<double> want = chain_reference(x0, Q);
  r.ok = true;
  const unsigned grid = unsigned(sm_count());
  // One variant: captured, run once from x0 and checked, then timed.
  auto measure = [&](int mode) {
    const bool pdl = tuning().pdl;
    tuning().pdl = pdl && mode == kKernelPerPhase;
    const cudaGraphExec_t exec = capture_graph(s, [&] {
      SWIFTLET_CUDA_CHECK(cudaMemsetAsync(counters, 0, 2 * sizeof(unsigned), s));
      if (mode == kKernelPerPhase) {
        for (int q = 0; q < Q; ++q)
          launch(stream_chain_kernel, grid, kChainThreads, kChainSmem, s,
                 ChainArgs{w, d_off, q, q + 1, mode, vec, counters, counters + 1});
      } else {
        launch(stream_chain_kernel, grid, kChainThreads, kChainSmem, s,
               ChainArgs{w, d_off, 0, Q, mode, vec, counters, counters + 1});
      }
    });
    tuning().pdl = pdl;
    SWIFTLET_CUDA_CHECK(cudaMemcpyAsync(vec, x0.data(), kChainN * sizeof(float), cudaMemcpyHostToDevice, s));
    SWIFTLET_CUDA_CHECK(cudaGraphLaunch(exec, s));
    uint32_t sum = 0;
    SWIFTLET_CUDA_CHECK(cudaMemcpyAsync(&sum, counters + 1, sizeof(unsigned), cudaMemcpyDeviceToHost, s));
    SWIFTLET_CUDA_CHECK(
        cudaMemcpyAsync(got.data(), vec + (Q % 2) * kChainN, kChainN * sizeof(float), cudaMemcpyDeviceToHost, s));
    SWIFTLET_CUDA_CHECK(cudaStreamSynchronize(s));
    if (sum != want_sum) r.ok = false;
    if (mode != kStreamOnly && !chain_matches(got, want)) r.ok = false;
    const double us = best_graph_us(exec, s, reps) / layers;
    SWIFTLET_CUDA_CHECK(cudaGraphExecDestroy(exec));
    return us;
  };
  r.stream_us = measure(kStreamOnly);
  r.kernels_us = measure(kKernelPerPhase);
  r.persistent_us = measure(kPersistent);
  SWIFTLET_CUDA_CHECK(cudaFree(w));
  SWIFTLET_CUDA_CHECK(cudaFree(d_off));
  SWIFTLET_CUDA_CHECK(cudaFree(vec));
  SWIFTLET_CUDA_CHECK(cudaFree(counters));
  SWIFTLET_CUDA_CHECK(cudaStreamDestroy(s));
  return r;
}

}  // namespace swiftlet::cuda::bench
