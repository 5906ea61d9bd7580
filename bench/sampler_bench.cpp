// Sampler cost per token on a Qwen3-Next-sized vocabulary (151936 logits): greedy (what the
// benchmarks and greedy decode pay between steps; GPU decode takes ~3 ms a step) and the default
// filtered sampling (temperature 0.7, top-k 20, top-p 0.8).
//
//   ./build/bin/swiftlet_bench_sampler
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "runtime/sampler.h"

namespace {

constexpr int kVocab = 151936;

std::vector<float> random_logits() {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> l(kVocab);
  for (float& x : l) x = nd(rng);
  return l;
}

void run(benchmark::State& state, swiftlet::SamplingParams p) {
  const std::vector<float> base = random_logits();
  std::vector<float> l = base;
  swiftlet::Sampler s(p, kVocab);
  for (auto _ : state) {
    state.PauseTiming();
    l = base;  // sample() rewrites NaNs and penalties in place
    state.ResumeTiming();
    benchmark::DoNotOptimize(s.sample(l, {}));
  }
  state.SetItemsProcessed(state.iterations() * kVocab);
}

void BM_Greedy(benchmark::State& state) {
  swiftlet::SamplingParams p;
  p.greedy = true;
  run(state, p);
}
BENCHMARK(BM_Greedy)->Unit(benchmark::kMicrosecond);

void BM_DefaultFiltered(benchmark::State& state) { run(state, swiftlet::SamplingParams{}); }
BENCHMARK(BM_DefaultFiltered)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
