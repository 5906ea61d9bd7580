// The router's top-k for any number of tokens (router_topk, model-math.md 6): softmax over the
// E logits, then a bitonic sort of (probability, index) in shared memory, a block per token. The
// decode with every expert resident takes its top-k inside the experts' act kernel instead
// (warp_topk in expert_device.cuh).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"

#include <cmath>

namespace swiftlet::cuda {

using namespace detail;

namespace {

constexpr int kTopkThreads = 1024;
constexpr int kTopkMaxE = 4096;

__device__ __forceinline__ bool beats(float av, int ai, float bv, int bi) { return av > bv || (av == bv && ai < bi); }

// One token's top k of E logits lr, by the whole block (any size): softmax over all E, a bitonic
// sort of N (E rounded up to a power of two) (probability, index) pairs in pv/pi (shared, N
// long), ties to the lower index; thread 0 writes ids[i], weights[i] (renormalised over the k
// when asked). Ends with the block synchronised only where the caller syncs.
__device__ __forceinline__ void block_topk(const float* __restrict__ lr, int E, int N, int k, bool renormalise,
                                           float* pv, int* pi, float* red, int32_t* ids, float* weights) {
  float m = -INFINITY;
  for (int i = threadIdx.x; i < E; i += blockDim.x) m = fmaxf(m, lr[i]);
  m = detail::block_max(m, red);
  float s = 0.0f;
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    const float e = expf(lr[i] - m);
    pv[i] = e;
    s += e;
  }
  s = block_sum(s, red);
  const float inv = 1.0f / s;
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    pv[i] = i < E ? pv[i] * inv : -1.0f;
    pi[i] = i;
  }
  // Descending: the best first.
  for (int size = 2; size <= N; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int t = threadIdx.x; t < N / 2; t += blockDim.x) {
        const int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
        const bool desc = (lo & size) == 0;
        const float av = pv[lo], bv = pv[hi];
        const int ai = pi[lo], bi = pi[hi];
        if (beats(bv, bi, av, ai) == desc) {
          pv[lo] = bv;
          pv[hi] = av;
          pi[lo] = bi;
          pi[hi] = ai;
        }
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += pv[i];
    for (int i = 0; i < k; ++i) {
      ids[i] = pi[i];
      weights[i] = renormalise ? pv[i] / sum : pv[i];
    }
  }
}

__global__ void __launch_bounds__(kTopkThreads) router_sort_kernel(const float* __restrict__ logits, int E, int N,
                                                                   int k, bool renormalise, int32_t* ids,
                                                                   float* weights) {
  __shared__ float pv[kTopkMaxE];
  __shared__ int pi[kTopkMaxE];
  __shared__ float red[32];
  pdl_wait_and_release();
  block_topk(logits + int64_t(blockIdx.x) * E, E, N, k, renormalise, pv, pi, red, ids + int64_t(blockIdx.x) * k,
             weights + int64_t(blockIdx.x) * k);
}

}  // namespace

void router_topk(const float* d_logits, int64_t n_tok, int E, int k, bool renormalise, int32_t* d_ids,
                 float* d_weights, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(E >= 1 && E <= kTopkMaxE);
  SWIFTLET_CUDA_REQUIRE(k >= 1 && k <= 16 && k <= E);
  if (n_tok == 0) return;
  int N = 2;
  while (N < E) N <<= 1;
  const int threads = N / 2 < kTopkThreads ? (N / 2 + 31) / 32 * 32 : kTopkThreads;
  launch(router_sort_kernel, unsigned(n_tok), unsigned(threads), 0, s, d_logits, E, N, k, renormalise, d_ids,
         d_weights);
  SWIFTLET_CUDA_LAUNCHED();
}


}  // namespace swiftlet::cuda
