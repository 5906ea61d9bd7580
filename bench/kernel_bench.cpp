// Matmul kernel throughput against this machine's memory bandwidth, measured in the same run.
//   build/bin/swiftlet_bench_kernels [--threads N] [--mb 256] [--backend cpu|cpu-f32|reference]
//                                    [--quick] [--only decode|batch]
// --quick skips n = 512 on the 2048x2048 matrices.
// 1. Decode (n = 1) on many 512 x 2048 matrices cycled through --mb MiB, so nothing stays
//    cached: GB/s of weight bytes (data + scales + biases) and that as a share of the read
//    bandwidth (every thread summing its slice of a --mb array); "hot" repeats one matrix that
//    stays in cache, the compute ceiling.
// 2. Y = W X for n tokens on 2048x2048, 512x2048 and 2048x512 (expert-shaped) matrices, copies
//    cycled through --mb MiB: GFLOP/s = 2 rows cols n / time, and the weight bytes
//    per call / time as GB/s and share of the bandwidth (100% = memory bound at n = 1).
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/read_bandwidth.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace swiftlet;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

struct Mat {
  QMatrix m;
  std::vector<uint8_t> data, scales, biases;
};

struct Format {
  const char* name;
  WeightFormat f;
  int bits;
  int group;
};

Mat make(const Format& fmt, int64_t rows, int64_t cols, uint64_t seed) {
  Mat o;
  o.m.format = fmt.f;
  o.m.rows = rows;
  o.m.cols = cols;
  std::mt19937_64 rng(seed);
  if (fmt.f == WeightFormat::Affine) {
    o.m.bits = fmt.bits;
    o.m.group_size = fmt.group;
    o.m.scale_dtype = DType::BF16;
    o.data.resize(size_t(rows * cols * fmt.bits / 8));
    o.scales.resize(size_t(rows * cols / fmt.group * 2));
    o.biases.resize(o.scales.size());
    for (size_t i = 0; i + 8 <= o.data.size(); i += 8) {
      uint64_t r = rng();
      std::memcpy(&o.data[i], &r, 8);
    }
    for (size_t i = 0; i < o.scales.size() / 2; ++i) {
      uint16_t s = f32_to_bf16(0.01f), b = f32_to_bf16(-0.05f);
      std::memcpy(&o.scales[2 * i], &s, 2);
      std::memcpy(&o.biases[2 * i], &b, 2);
    }
    o.m.scales = o.scales.data();
    o.m.biases = o.biases.data();
  } else {
    o.data.resize(size_t(rows * cols * 2));
    for (size_t i = 0; i < o.data.size() / 2; ++i) {
      uint16_t h = f32_to_bf16(float(int(rng() % 200) - 100) * 1e-3f);
      std::memcpy(&o.data[2 * i], &h, 2);
    }
  }
  o.m.data = o.data.data();
  return o;
}

struct Result {
  double gbs;     // weight bytes per call / time
  double gflops;  // 2 rows cols n / time
};

// Best of `reps` passes; each pass makes `calls` matmuls on the copies in turn.
Result time_matmul(const Kernels& k, std::vector<Mat>& mats, int64_t n, int calls, int reps) {
  const QMatrix& m0 = mats[0].m;
  std::vector<float> x(size_t(n * m0.cols)), y(size_t(n * m0.rows));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  k.matmul(m0, x.data(), n, y.data());  // warm up (buffers, threads)
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) k.matmul(mats[size_t(i) % mats.size()].m, x.data(), n, y.data());
    best = std::min(best, seconds(t0) / calls);
  }
  return {double(m0.total_bytes()) / best / 1e9, 2.0 * double(m0.rows * m0.cols * n) / best / 1e9};
}

const Format kFormats[] = {{"q4 g64", WeightFormat::Affine, 4, 64},
                           {"q4 g128", WeightFormat::Affine, 4, 128},
                           {"q8 g64", WeightFormat::Affine, 8, 64},
                           {"bf16", WeightFormat::BF16, 0, 0}};

// Section 1; raises `bw` to the best bandwidth pass seen.
void bench_decode(const Kernels& k, ReadBandwidth& bwm, double& bw, int64_t mb) {
  fmt::print("decode y = W x, 512x2048 matrices cycled through {} MiB\n", mb);
  fmt::print("{:<8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>10}\n", "format", "count", "GB/s", "of bw", "paired", "Gw/s",
             "hot Gw/s");
  for (const Format& f : kFormats) {
    const int64_t rows = 512, cols = 2048;
    std::vector<Mat> mats;
    mats.push_back(make(f, rows, cols, 1));
    const size_t per = mats[0].m.total_bytes();
    const int count = int(std::max<int64_t>(2, (mb << 20) / int64_t(per)));
    for (int i = 1; i < count; ++i) mats.push_back(make(f, rows, cols, uint64_t(i) + 1));
    // Bandwidth and kernel passes alternate, so the shares are robust to other load on the
    // machine: "of bw" = best kernel pass / best bandwidth pass; "paired" = the median of the
    // ratios of each kernel pass to the bandwidth pass just before it.
    std::vector<double> ratios;
    double best = 0;
    for (int rep = 0; rep < 7; ++rep) {
      const double b = bwm.pass();
      const Result r = time_matmul(k, mats, 1, count, 1);
      best = std::max(best, r.gbs);
      bw = std::max(bw, b);
      ratios.push_back(r.gbs / b);
    }
    std::sort(ratios.begin(), ratios.end());
    std::vector<Mat> one;
    one.push_back(make(f, rows, cols, 1));
    const Result hot = time_matmul(k, one, 1, 200, 5);
    const double wpb = double(rows * cols) / double(per);  // weights per byte
    fmt::print("{:<8} {:>6} {:>8.1f} {:>7.0f}% {:>7.0f}% {:>8.1f} {:>10.1f}\n", f.name, count, best, 100 * best / bw,
               100 * ratios[ratios.size() / 2], best * wpb, hot.gbs * wpb);
  }
  fmt::print("read bandwidth, best pass of the run: {:.1f} GB/s\n", bw);
}

// Section 2.
void bench_batch(const Kernels& k, double bw, int64_t mb, bool quick) {
  fmt::print("\nY = W X for n tokens, copies cycled through {} MiB\n", mb);
  fmt::print("{:<8} {:>10} {:>5} {:>10} {:>9} {:>8} {:>7}\n", "format", "matrix", "n", "ms/call", "GFLOP/s", "GB/s",
             "of bw");
  const std::pair<int64_t, int64_t> shapes[] = {{2048, 2048}, {512, 2048}, {2048, 512}};
  const int64_t ns[] = {1, 2, 4, 8, 64, 512};  // 2 and 4: decode batches (docs/log/batching.md)
  for (const Format& f : kFormats) {
    if (f.group == 128) continue;  // as g64 here
    for (auto [rows, cols] : shapes) {
      std::vector<Mat> mats;
      mats.push_back(make(f, rows, cols, 1));
      const size_t per = mats[0].m.total_bytes();
      const int count = int(std::max<int64_t>(2, (mb << 20) / int64_t(per)));
      for (int i = 1; i < count; ++i) mats.push_back(make(f, rows, cols, uint64_t(i) + 1));
      for (int64_t n : ns) {
        if (quick && n == 512 && rows * cols > 2048 * 512) continue;
        // About 0.5 GFLOP per pass, at least one call and one pass over the copies for n = 1.
        const double flop = 2.0 * double(rows * cols * n);
        int calls = int(std::max(1.0, 0.5e9 / flop));
        if (n == 1) calls = std::max(calls, count);
        const Result r = time_matmul(k, mats, n, calls, 3);
        fmt::print("{:<8} {:>10} {:>5} {:>10.3f} {:>9.1f} {:>8.1f} {:>6.0f}%\n", f.name,
                   fmt::format("{}x{}", rows, cols), n, flop / r.gflops / 1e6, r.gflops, r.gbs, 100 * r.gbs / bw);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  int64_t mb = 256;
  bool quick = false;
  std::string only;
  Backend backend = Backend::Cpu;
  std::string isa_arg;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (i + 1 < argc && a == "--threads") threads = std::stoi(argv[++i]);
    else if (i + 1 < argc && a == "--mb") mb = std::stoll(argv[++i]);
    else if (i + 1 < argc && a == "--only") only = argv[++i];
    else if (i + 1 < argc && a == "--backend") backend = parse_backend(argv[++i]);
    else if (i + 1 < argc && a == "--isa") isa_arg = argv[++i];
  }
  if (threads > 0) ThreadPool::set_global_threads(threads);
  const std::vector<Isa> isas = available_isas();
  Isa isa = isas.empty() ? Isa::Avx2 : isas.back();
  if (!isa_arg.empty()) {
    auto it = std::find_if(isas.begin(), isas.end(), [&](Isa i) { return isa_arg == isa_name(i); });
    if (it == isas.end()) {
      fmt::print(stderr, "--isa {}: this CPU runs {}\n", isa_arg, isas.empty() ? "none" : isa_name(isas.back()));
      return 2;
    }
    isa = *it;
  }
  const Kernels& k = isas.empty() ? kernels_for(backend) : kernels_for(backend, isa);
  ReadBandwidth bwm(size_t(mb) << 20);
  double bw = bwm.best(5);
  fmt::print("backend {} ({})  threads {}  measured read bandwidth {:.1f} GB/s ({} MiB array)\n\n", k.name,
             isas.empty() ? "scalar" : isa_name(isa), ThreadPool::global().size(), bw, mb);
  if (only.empty() || only == "decode") bench_decode(k, bwm, bw, mb);
  if (only.empty() || only == "batch") bench_batch(k, bw, mb, quick);
  return 0;
}
