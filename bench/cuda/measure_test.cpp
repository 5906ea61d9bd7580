// The measurement kernels of swiftlet_bench_cuda compute what the host does, so the figures they
// print measure a correct chain. Skipped without a usable GPU.
#include "bench/cuda/measure.h"
#include "kernels/cuda/cuda_test_support.h"

#include <gtest/gtest.h>

namespace swiftlet {
namespace {

namespace mb = cuda::bench;

// measure_stream_chain with phases smaller than a tile, ragged, and of several tiles a block; an
// odd number in all (the result in the second vector). The words' sum says every byte was consumed
// once, the vector that every phase saw its predecessor's.
TEST(CudaMeasure, StreamChainConsumesEveryByteInOrder) {
  REQUIRE_GPU();
  const mb::StreamChain c = mb::measure_stream_chain({1000, 16 * 1024 * 300 + 48, 5 << 20}, 3, 1);
  if (c.layer_bytes == 0) GTEST_SKIP() << "bulk copies need sm_90";
  EXPECT_TRUE(c.ok);
  EXPECT_EQ(c.layer_bytes, double(1008 + 16 * 1024 * 300 + 48 + (5 << 20)));
  for (double us : {c.stream_us, c.kernels_us, c.persistent_us}) {
    EXPECT_GT(us, 0.0);
    EXPECT_LT(us, 1e5);
  }
}

// The dependent steps of measure_sync_cost (the benchmark of a kernel boundary against three grid
// barriers) compute what the host does: no block reads a stale vector.
TEST(CudaMeasure, SyncStepsSeeTheirPredecessors) {
  REQUIRE_GPU();
  const mb::SyncCost c = mb::measure_sync_cost(64, 2);
  EXPECT_TRUE(c.ok);
  for (double us : {c.boundary_pdl_us, c.boundary_us, c.barrier_us, c.barrier_ar_us, c.barrier_count_us}) {
    EXPECT_GT(us, 0.0);
    EXPECT_LT(us, 1e4);
  }
}

}  // namespace
}  // namespace swiftlet
