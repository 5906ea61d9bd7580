// Cost of checking one streamed expert: the xxh3-64 of a 4-bit expert blob of the target models
// (1,769,472 bytes), which QpackExperts computes for every expert it reads from the disk. Compare
// with the disk's time for the same bytes (~0.8 ms at 2.2 GB/s).
//
//   ./build/bin/swiftlet_bench_checksum
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "format/qpack.h"

namespace {

void BM_Xxh3OneExpert(benchmark::State& state) {
  const size_t n = 1769472;
  std::vector<uint8_t> buf(n);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t r = rng();
    std::memcpy(buf.data() + i, &r, 8);
  }
  for (auto _ : state) benchmark::DoNotOptimize(swiftlet::xxh3_64(buf.data(), n));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
}
BENCHMARK(BM_Xxh3OneExpert)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
