// Runs one CPU product a few times, for tools/insn_count/count.sh, which counts under qemu-aarch64
// the instructions the kernel executes (speed cannot be measured under emulation).
//   kernel_driver ISA FORMAT ROWS COLS TOKENS REPEAT     FORMAT: q4 | q8 | bf16 (g64, bf16 scales)
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kernels.h"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using namespace swiftlet;
  if (argc != 7) {
    std::fprintf(stderr, "usage: kernel_driver ISA q4|q8|bf16 ROWS COLS TOKENS REPEAT\n");
    return 2;
  }
  try {
    const Isa isa = parse_isa(argv[1]);
    const std::string format = argv[2];
    const int64_t rows = std::atoll(argv[3]), cols = std::atoll(argv[4]), n = std::atoll(argv[5]);
    const int repeat = std::atoi(argv[6]);
    if (format != "q4" && format != "q8" && format != "bf16") fail("format must be q4, q8 or bf16, not '{}'", format);
    if (rows <= 0 || cols <= 0 || cols % 64 != 0 || n <= 0 || repeat <= 0)
      fail("ROWS, COLS (a multiple of 64), TOKENS and REPEAT must be positive");
    ThreadPool::set_global_threads(1);  // one thread: no pool in the count
    std::mt19937 rng(1);
    QMatrix w;
    w.rows = rows;
    w.cols = cols;
    const int bits = format == "q4" ? 4 : format == "q8" ? 8 : 16;
    std::vector<uint8_t> data(size_t(rows * cols * bits / 8));
    for (uint8_t& b : data) b = uint8_t(rng());
    std::vector<uint16_t> scales(size_t(rows * cols / 64), 0x3c00),
        biases(scales.size(), 0xbc00);  // bf16 0.0078, -0.0078
    w.data = data.data();
    if (bits == 16) {
      w.format = WeightFormat::BF16;
      for (size_t i = 1; i < data.size(); i += 2) data[i] = 0x3c;  // small finite bf16 values
    } else {
      w.format = WeightFormat::Affine;
      w.bits = bits;
      w.group_size = 64;
      w.scales = scales.data();
      w.biases = biases.data();
    }
    std::vector<float> x(size_t(n * cols)), y(size_t(n * rows));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& v : x) v = nd(rng);
    const Kernels& k = kernels_for(Backend::Cpu, isa);
    for (int i = 0; i < repeat; ++i) k.matmul(w, x.data(), n, y.data());
    std::printf("%s %s %lldx%lld n=%lld: y[0] = %g\n", argv[1], argv[2], (long long)rows, (long long)cols, (long long)n,
                double(y[0]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_driver: %s\n", e.what());
    return 1;
  }
  return 0;
}
