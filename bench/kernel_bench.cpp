// Decode kernel throughput against this machine's memory bandwidth, measured in the same run.
// Prints, per format: GB/s of weight bytes streamed by y = W x on a matrix far larger than the
// caches, and that as a share of the measured read bandwidth (sum over a large float array).
//   build/bin/swiftlet_bench_kernels [--threads N] [--mb 256]
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kernels.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace swiftlet;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

// Read bandwidth: every thread sums its slice of a large array (what a matvec must do at least).
double measure_read_bandwidth(size_t bytes) {
  std::vector<float> a(bytes / 4, 1.0f);
  ThreadPool& pool = ThreadPool::global();
  const int64_t tasks = pool.size();
  std::vector<double> sums(static_cast<size_t>(tasks));
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    pool.parallel_for(tasks, [&](int64_t i) {
      const size_t n = a.size() / size_t(tasks);
      const float* p = a.data() + size_t(i) * n;
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
      for (size_t j = 0; j + 8 <= n; j += 8) {
        s0 += p[j]; s1 += p[j + 1]; s2 += p[j + 2]; s3 += p[j + 3];
        s4 += p[j + 4]; s5 += p[j + 5]; s6 += p[j + 6]; s7 += p[j + 7];
      }
      sums[size_t(i)] = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    });
    best = std::max(best, double(bytes) / seconds(t0) / 1e9);
  }
  return best;
}

struct Mat {
  QMatrix m;
  std::vector<uint8_t> data, scales, biases;
};

Mat make(WeightFormat f, int bits, int64_t rows, int64_t cols) {
  Mat o;
  o.m.format = f;
  o.m.rows = rows;
  o.m.cols = cols;
  std::mt19937_64 rng(1);
  if (f == WeightFormat::Affine) {
    o.m.bits = bits;
    o.m.group_size = 64;
    o.m.scale_dtype = DType::BF16;
    o.data.resize(size_t(rows * cols * bits / 8));
    o.scales.resize(size_t(rows * cols / 64 * 2));
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

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  int64_t mb = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--threads") threads = std::stoi(argv[i + 1]);
    else if (a == "--mb") mb = std::stoll(argv[i + 1]);
  }
  if (threads > 0) ThreadPool::set_global_threads(threads);
  const double bw = measure_read_bandwidth(size_t(mb) << 20);
  fmt::print("threads {}  measured read bandwidth {:.1f} GB/s ({} MiB array)\n", ThreadPool::global().size(), bw, mb);
  fmt::print("{:<10} {:>12} {:>10} {:>10} {:>9}\n", "format", "matrix", "GB/s", "of bw", "Gw/s");
  const Kernels& k = kernels_for(Backend::Cpu);
  struct C {
    const char* name;
    WeightFormat f;
    int bits;
  };
  for (C c : {C{"q4 g64", WeightFormat::Affine, 4}, C{"q8 g64", WeightFormat::Affine, 8}, C{"bf16", WeightFormat::BF16, 0}}) {
    // Many 512 x 2048 matrices, like one layer's experts, cycled so nothing stays cached.
    const int64_t rows = 512, cols = 2048;
    Mat one = make(c.f, c.bits, rows, cols);
    const size_t per = one.m.total_bytes();
    const int count = int(std::max<int64_t>(2, (mb << 20) / int64_t(per)));
    std::vector<Mat> mats;
    for (int i = 0; i < count; ++i) mats.push_back(make(c.f, c.bits, rows, cols));
    std::vector<float> x(static_cast<size_t>(cols), 0.5f), y(static_cast<size_t>(rows));
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = Clock::now();
      for (auto& m : mats) k.matmul(m.m, x.data(), 1, y.data());
      best = std::max(best, double(per) * count / seconds(t0) / 1e9);
    }
    const double gw = best / (double(per) / double(rows * cols));
    fmt::print("{:<10} {:>12} {:>10.1f} {:>9.0f}% {:>9.1f}\n", c.name, fmt::format("{}x{}x{}", count, rows, cols), best,
               100 * best / bw, gw);
  }
  return 0;
}
