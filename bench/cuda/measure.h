// Measurements of what the decode's chain of kernels costs, below any arithmetic (for
// swiftlet_bench_cuda and docs/log/gpu-performance.md): a dependent step across the GPU
// (sync_cost.cu) and a layer's phases streaming their bytes (stream_chain.cu). Plain C++ callers;
// the kernels live in this directory, outside the product library.
#pragma once

#include <cstdint>
#include <vector>

namespace swiftlet::cuda::bench {

// Microseconds a step of `steps` dependent steps (even), each reading a hidden-size vector its
// predecessor wrote and writing its share of the next, one block of 512 threads an SM, best of
// `reps` runs of a CUDA graph: as kernels chained with PDL (sm_90), as kernels without it, and as
// grid barriers inside one persistent kernel (the one the removed moe_decode used; one by
// acquire/release atomics with a busy spin; one on a count that only grows). ok: every variant's
// result matched the host's.
struct SyncCost {
  double boundary_pdl_us, boundary_us, barrier_us, barrier_ar_us, barrier_count_us;
  bool ok;
};
SyncCost measure_sync_cost(int steps = 256, int reps = 10);
// `layers` layers of phases of phase_bytes[p] weight bytes each (multiples of 16 after rounding
// up), every phase reading the vector its predecessor wrote, the bytes streamed through 192 KB of shared memory a block in 16 KB
// bulk copies and only summed. Microseconds a layer, best of `reps` graph runs: the bytes alone (no
// chain), a kernel a phase with PDL (the decode's present shape), and one persistent kernel whose
// copies run ahead of its chain. layer_bytes: the bytes a layer reads. ok: the chain's result and
// the sum of every word matched the host's. All zero (ok false) below sm_90.
struct StreamChain {
  double layer_bytes, stream_us, kernels_us, persistent_us;
  bool ok;
};
StreamChain measure_stream_chain(const std::vector<int64_t>& phase_bytes, int layers, int reps = 5);

}  // namespace swiftlet::cuda::bench
