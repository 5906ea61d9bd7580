// Every fast kernel against the scalar reference on random shapes, formats and batch sizes.
//
// Error bounds, per output y[t, r]:
// - fp32 activations (cpu-f32, and dense weights on every backend): float rounding only,
//   1e-4 (1 + |y|) + 2e-4.
// - int8 activations (cpu, affine weights): q8_bound (support/random_weights.h).
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd_cpu.h"

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/ops_ref.h"
#include "support/random_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

// Counts operator new calls while g_count_news is set (Kernels.MatmulDoesNotAllocate). Not
// under AddressSanitizer, which supplies its own operator new (GCC says so with
// __SANITIZE_ADDRESS__, clang with __has_feature).
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SWIFTLET_ASAN 1
#endif
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(SWIFTLET_ASAN)
#define SWIFTLET_COUNT_NEWS 1
namespace {
std::atomic<bool> g_count_news{false};
std::atomic<int64_t> g_news{0};
}  // namespace
// GCC takes the free() of a replaced operator new's pointer for a mismatch.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  if (g_count_news.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif

namespace swiftlet {
namespace {

using namespace swiftlet::testing;

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i])) + 2e-4f) << what << " at " << i;
}

constexpr int64_t kBatches[] = {1, 2, 3, 5, 8, 17, 64};

// The instruction sets this CPU runs; every int8-activation test runs each of them (AVX2 and, where
// the CPU has it, AVX-512 VNNI; NEON and, where the CPU has them, dotprod and i8mm), so every
// kernel the CPU can run is checked in the same run.
std::vector<Isa> isas() {
  std::vector<Isa> out = available_isas();
  for (Isa i : out) ::testing::Test::RecordProperty(std::string("isa_") + isa_name(i), "tested");
  return out;
}

// int8 activations (cpu backend): 4 and 8 bits, groups of 64 and 128, bf16 / f16 / f32 scales,
// row counts that do not fill the row tiles (1, 7, 130), block counts below, at and past a
// multiple of 8 (the kernels take factors 8 blocks at a time), every tile shape of tokens.
TEST(Kernels, Int8ActivationsWithinRoundingBound) {
  for (Isa isa : isas()) {
    std::mt19937 rng(11);
    const Kernels& fast = kernels_for(Backend::Cpu, isa);
    for (int bits : {4, 8})
      for (int group : {64, 128})
        for (DType sdt : {DType::BF16, DType::F16, DType::F32})
          for (auto [rows, groups] : {std::pair<int64_t, int64_t>{1, 1}, {7, 5}, {130, 9}, {33, 8}}) {
            const int64_t cols = groups * group;
            OwnedMatrix w = random_matrix(rng, WeightFormat::Affine, rows, cols, bits, sdt, group);
            for (int64_t n : kBatches) {
              const std::vector<float> x = random_x(rng, n, cols);
              std::vector<float> want(size_t(n * rows)), got(size_t(n * rows));
              ref::matmul(w.m, x.data(), n, want.data());
              fast.matmul(w.m, x.data(), n, got.data());
              const Fit f = fit_q8(got, want, q8_bound(w.m, x, n));
              const std::string what = fmt::format("{} q{} g{} scales {} {}x{} n={}", isa_name(isa), bits, group,
                                                   dtype_name(sdt), rows, cols, n);
              ASSERT_LE(f.worst, 1.0) << what << " at t=" << f.at / size_t(rows) << " r=" << f.at % size_t(rows)
                                      << ": got " << got[f.at] << " want " << want[f.at];
              // Rounding errors add up like a random walk: well inside the worst case on average.
              EXPECT_LT(f.mean_share, 0.25) << what;
            }
          }
  }
}

// The same check fails on a kernel that is wrong by one weight: row 0 of a copy gets one
// nibble moved by 8 where x is large, and the copy's product is checked against the original.
TEST(Kernels, Int8BoundCatchesOneWrongWeight) {
  for (Isa isa : isas()) {
    std::mt19937 rng(5);
    const Kernels& fast = kernels_for(Backend::Cpu, isa);
    for (int64_t n : {1, 8}) {
      OwnedMatrix w = random_matrix(rng, WeightFormat::Affine, 4, 256, 4, DType::BF16, 64);
      put_scale(w.scales, DType::BF16, 0, 0.2f);  // row 0, group 0
      std::vector<float> x = random_x(rng, n, 256);
      for (int64_t t = 0; t < n; ++t) x[size_t(t * 256 + 5)] = 10.0f;
      std::vector<float> want(size_t(n * 4)), got(size_t(n * 4));
      ref::matmul(w.m, x.data(), n, want.data());
      fast.matmul(w.m, x.data(), n, got.data());
      const std::vector<float> bound = q8_bound(w.m, x, n);
      EXPECT_LE(fit_q8(got, want, bound).worst, 1.0);
      OwnedMatrix bad = w;
      bad.m.data = bad.data.data();
      bad.m.scales = bad.scales.data();
      bad.m.biases = bad.biases.data();
      bad.data[2] ^= 0x80;  // element 5 = byte 2, high nibble: q +- 8
      fast.matmul(bad.m, x.data(), n, got.data());
      EXPECT_GT(fit_q8(got, want, bound).worst, 1.0) << isa_name(isa) << " n=" << n;
    }
  }
}

// fp32 activations: dense weights on both fast backends, affine weights on cpu-f32.
TEST(Kernels, Fp32ActivationsMatchReference) {
  std::mt19937 rng(7);
  struct Case {
    WeightFormat f;
    int bits;
    DType sdt;
    int group;
  };
  const Case cases[] = {{WeightFormat::F32, 0, DType::BF16, 0},    {WeightFormat::BF16, 0, DType::BF16, 0},
                        {WeightFormat::F16, 0, DType::BF16, 0},    {WeightFormat::Affine, 4, DType::BF16, 64},
                        {WeightFormat::Affine, 8, DType::BF16, 64}, {WeightFormat::Affine, 4, DType::F16, 128},
                        {WeightFormat::Affine, 4, DType::F32, 64},  {WeightFormat::Affine, 8, DType::F32, 128}};
  for (Backend backend : {Backend::CpuF32, Backend::Cpu}) {
    const Kernels& fast = kernels_for(backend);
    for (const Case& c : cases) {
      if (backend == Backend::Cpu && c.f == WeightFormat::Affine) continue;  // int8 test above
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 128}, {7, 256}, {33, 384}, {130, 512}}) {
        if (c.f != WeightFormat::Affine) cols += rows % 5 + 3;  // ragged tails for dense formats
        OwnedMatrix w = random_matrix(rng, c.f, rows, cols, c.bits, c.sdt, c.group);
        for (int64_t n : kBatches) {
          const std::vector<float> x = random_x(rng, n, cols);
          std::vector<float> want(size_t(n * rows)), got(size_t(n * rows));
          ref::matmul(w.m, x.data(), n, want.data());
          fast.matmul(w.m, x.data(), n, got.data());
          expect_close(got, want,
                       fmt::format("{} format {} bits {} g{} {}x{} n={}", fast.name, int(c.f), c.bits, c.group, rows,
                                   cols, n));
        }
      }
    }
  }
}

// Large enough to be split over the thread pool, with prefill row chunks and every tile.
TEST(Kernels, LargeMatmulsMatchReference) {
  for (Isa isa : isas()) {
    std::mt19937 rng(9);
    for (auto [f, bits] : {std::pair<WeightFormat, int>{WeightFormat::Affine, 4}, {WeightFormat::Affine, 8},
                           {WeightFormat::BF16, 0}}) {
      OwnedMatrix w = random_matrix(rng, f, 515, 2048, bits);
      for (int64_t n : {1, 13}) {
        const std::vector<float> x = random_x(rng, n, 2048);
        std::vector<float> want(size_t(n * 515)), got(size_t(n * 515));
        ref::matmul(w.m, x.data(), n, want.data());
        kernels_for(Backend::Cpu, isa).matmul(w.m, x.data(), n, got.data());
        const std::string what = fmt::format("{} format {} bits {} n={}", isa_name(isa), int(f), bits, n);
        if (f == WeightFormat::Affine) {
          const Fit fit = fit_q8(got, want, q8_bound(w.m, x, n));
          ASSERT_LE(fit.worst, 1.0) << what;
          EXPECT_LT(fit.mean_share, 0.25) << what;
        } else {
          expect_close(got, want, what);
        }
      }
    }
  }
}

// A group of products (a layer's routed experts) gives each job what matmul gives it alone, bit
// for bit, and so stays within the int8 bound of the scalar reference: jobs of 4 and 8 bits, of
// 1 to 5 tokens, large enough to be split into several tasks and small enough for one, on every
// backend (the reference and cpu-f32 run the jobs one at a time) and instruction set.
TEST(Kernels, GroupOfProductsMatchesEachProductAlone) {
  for (Isa isa : isas()) {
    for (Backend backend : {Backend::Cpu, Backend::CpuF32, Backend::Reference}) {
      std::mt19937 rng(21);
      const Kernels& k = kernels_for(backend, isa);
      struct Shape {
        int64_t rows, cols;
        int bits;
        int64_t n;
      };
      const Shape shapes[] = {{512, 1024, 4, 1}, {512, 1024, 4, 2}, {1024, 512, 4, 1},
                              {7, 256, 8, 3},    {300, 512, 8, 1},  {130, 576, 4, 5}};
      std::vector<OwnedMatrix> ws;
      std::vector<std::vector<float>> xs, got, alone;
      for (const Shape& sh : shapes) {
        ws.push_back(random_matrix(rng, WeightFormat::Affine, sh.rows, sh.cols, sh.bits, DType::BF16, 64));
        xs.push_back(random_x(rng, sh.n, sh.cols));
        got.emplace_back(size_t(sh.n * sh.rows), -1.0f);
        alone.emplace_back(size_t(sh.n * sh.rows), -2.0f);
      }
      std::vector<MatmulJob> jobs;
      for (size_t i = 0; i < ws.size(); ++i)
        jobs.push_back({&ws[i].m, xs[i].data(), shapes[i].n, got[i].data()});
      k.matmul_group(jobs);
      for (size_t i = 0; i < ws.size(); ++i) {
        const Shape& sh = shapes[i];
        k.matmul(ws[i].m, xs[i].data(), sh.n, alone[i].data());
        const std::string what =
            fmt::format("{} {} job {}: q{} {}x{} n={}", k.name, isa_name(isa), i, sh.bits, sh.rows, sh.cols, sh.n);
        for (size_t e = 0; e < got[i].size(); ++e)
          ASSERT_EQ(got[i][e], alone[i][e]) << what << " at t=" << e / size_t(sh.rows) << " r=" << e % size_t(sh.rows);
        std::vector<float> want(size_t(sh.n * sh.rows));
        ref::matmul(ws[i].m, xs[i].data(), sh.n, want.data());
        if (backend == Backend::Cpu) {
          EXPECT_LE(fit_q8(got[i], want, q8_bound(ws[i].m, xs[i], sh.n)).worst, 1.0) << what;
        } else {
          expect_close(got[i], want, what);
        }
      }
    }
  }
}

// A token's output does not depend on the batch it is in: prefix reuse prefills a suffix and
// must continue exactly like a fresh run that prefilled everything at once.
TEST(Kernels, BatchGivesDecodeResultsBitForBit) {
  std::mt19937 rng(13);
  struct Case {
    WeightFormat f;
    int bits;
    int group;
  };
  const Case cases[] = {{WeightFormat::Affine, 4, 64}, {WeightFormat::Affine, 8, 64}, {WeightFormat::Affine, 4, 128},
                        {WeightFormat::BF16, 0, 0},    {WeightFormat::F32, 0, 0},     {WeightFormat::F16, 0, 0}};
  for (Isa isa : isas()) {
    for (Backend backend : {Backend::Cpu, Backend::CpuF32}) {
      const Kernels& k = kernels_for(backend, isa);
      for (const Case& c : cases) {
        const int64_t rows = 37, cols = c.f == WeightFormat::Affine ? 9 * 128 : 1000;
        OwnedMatrix w = random_matrix(rng, c.f, rows, cols, c.bits, DType::BF16, c.group);
        for (int64_t n : {2, 3, 7, 64}) {
          const std::vector<float> x = random_x(rng, n, cols);
          std::vector<float> batch(size_t(n * rows)), one(static_cast<size_t>(rows));
          k.matmul(w.m, x.data(), n, batch.data());
          for (int64_t t = 0; t < n; ++t) {
            k.matmul(w.m, x.data() + t * cols, 1, one.data());
            for (int64_t r = 0; r < rows; ++r)
              ASSERT_EQ(batch[size_t(t * rows + r)], one[size_t(r)])
                  << k.name << " " << isa_name(isa) << " format " << int(c.f) << " bits " << c.bits << " n=" << n
                  << " t=" << t << " r=" << r;
          }
        }
      }
    }
  }
}

// Decode and batches reuse their buffers: once warm, a matmul allocates nothing (also the
// thread pool's job, split over every thread).
TEST(Kernels, MatmulDoesNotAllocate) {
#ifndef SWIFTLET_COUNT_NEWS
  GTEST_SKIP() << "operator new is AddressSanitizer's";
#else
  std::mt19937 rng(3);
  for (Backend backend : {Backend::Cpu, Backend::CpuF32}) {
    for (auto [f, bits] : {std::pair<WeightFormat, int>{WeightFormat::Affine, 4}, {WeightFormat::BF16, 0}}) {
      OwnedMatrix w = random_matrix(rng, f, 1024, 1024, bits);
      for (int64_t n : {1, 8}) {
        const std::vector<float> x = random_x(rng, n, 1024);
        std::vector<float> y(size_t(n * 1024));
        const Kernels& k = kernels_for(backend);
        k.matmul(w.m, x.data(), n, y.data());  // warm: buffers grow to size
        g_news = 0;
        g_count_news = true;
        for (int i = 0; i < 10; ++i) k.matmul(w.m, x.data(), n, y.data());
        g_count_news = false;
        EXPECT_EQ(g_news.load(), 0) << k.name << " format " << int(f) << " n=" << n;
      }
    }
  }
#endif
}

TEST(Kernels, ReferenceDequantFollowsMlxPacking) {
  // One 4-bit row of 64: word k holds elements 8k..8k+7, lowest index in the lowest nibble.
  std::vector<uint32_t> packed(8);
  for (int i = 0; i < 64; ++i) packed[size_t(i / 8)] |= uint32_t(i % 16) << (4 * (i % 8));
  uint16_t scale = f32_to_bf16(0.5f), bias = f32_to_bf16(-1.0f);
  QMatrix m;
  m.format = WeightFormat::Affine;
  m.rows = 1;
  m.cols = 64;
  m.bits = 4;
  m.group_size = 64;
  m.data = packed.data();
  m.scales = &scale;
  m.biases = &bias;
  std::vector<float> row(64);
  ref::dequant_row(m, 0, row.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(row[size_t(i)], 0.5f * float(i % 16) - 1.0f) << i;
}

constexpr Isa kEveryIsa[] = {Isa::Avx2, Isa::Avx512Vnni, Isa::Neon, Isa::NeonDotprod, Isa::NeonI8mm};

bool runs(const std::vector<Isa>& have, Isa isa) { return std::find(have.begin(), have.end(), isa) != have.end(); }

// The default kernels use the best instruction set this CPU has; one it lacks is refused.
TEST(Kernels, DefaultIsTheBestInstructionSet) {
  const std::vector<Isa> have = available_isas();
  if (have.empty()) GTEST_SKIP() << "no AVX2 or NEON: scalar code only";
  EXPECT_EQ(&kernels_for(Backend::Cpu), &kernels_for(Backend::Cpu, have.back()));
  for (Isa isa : kEveryIsa)
    if (!runs(have, isa)) {
      EXPECT_THROW(kernels_for(Backend::Cpu, isa), Error) << isa_name(isa);
    }
}

// On Arm every NEON form gives the same bits: each forms the exact integer block dots its own way
// (widening multiplies, sdot, smmla) and the float work in one order (matmul_q8_neon.h).
TEST(Kernels, NeonFormsGiveTheSameBits) {
  std::vector<Isa> neon;
  for (Isa isa : available_isas())
    if (isa == Isa::Neon || isa == Isa::NeonDotprod || isa == Isa::NeonI8mm) neon.push_back(isa);
  if (neon.size() < 2) GTEST_SKIP() << "fewer than two NEON forms on this CPU";
  std::mt19937 rng(17);
  for (int bits : {4, 8})
    for (int group : {64, 128}) {
      OwnedMatrix w = random_matrix(rng, WeightFormat::Affine, 67, 11 * 64 * (group / 64), bits, DType::BF16, group);
      for (int64_t n : {1, 2, 5, 8}) {
        const std::vector<float> x = random_x(rng, n, w.m.cols);
        std::vector<float> first(size_t(n * w.m.rows)), got(first.size());
        kernels_for(Backend::Cpu, neon.front()).matmul(w.m, x.data(), n, first.data());
        for (size_t i = 1; i < neon.size(); ++i) {
          kernels_for(Backend::Cpu, neon[i]).matmul(w.m, x.data(), n, got.data());
          for (size_t e = 0; e < got.size(); ++e)
            ASSERT_EQ(got[e], first[e]) << isa_name(neon[i]) << " vs " << isa_name(neon.front()) << " q" << bits << " g"
                                        << group << " n=" << n << " at " << e;
        }
      }
    }
}

// The token mixers' and the activations' fast forms (mixers.h) run their 8-lane kernels on every
// CPU that has a vector form of the products: AVX2 on x86-64, NEON on every aarch64 CPU.
TEST(Kernels, MixersRunTheVectorFormWhereTheProductsDo) {
#if defined(__aarch64__)
  EXPECT_STREQ(simd::f8_isa(), "neon");
  EXPECT_TRUE(simd::cpu_runs_f8());
#elif defined(__x86_64__)
  const bool avx2 = runs(available_isas(), Isa::Avx2);
  EXPECT_STREQ(simd::f8_isa(), avx2 ? "avx2" : "scalar");
  EXPECT_EQ(simd::cpu_runs_f8(), avx2);
#else
  EXPECT_STREQ(simd::f8_isa(), "scalar");
#endif
}

// set_cpu_isa chooses what kernels_for(b) gives; an instruction set the CPU lacks is refused and
// changes nothing.
TEST(Kernels, SetCpuIsaChoosesTheDefaultKernels) {
  const std::vector<Isa> have = available_isas();
  if (have.empty()) GTEST_SKIP() << "no AVX2 or NEON: scalar code only";
  const Isa best = cpu_isa();
  EXPECT_EQ(best, have.back());
  for (Isa isa : have) {
    set_cpu_isa(isa);
    EXPECT_EQ(cpu_isa(), isa);
    EXPECT_EQ(&kernels_for(Backend::Cpu), &kernels_for(Backend::Cpu, isa)) << isa_name(isa);
  }
  set_cpu_isa(have.front());
  for (Isa isa : kEveryIsa)
    if (!runs(have, isa)) {
      EXPECT_THROW(set_cpu_isa(isa), Error) << isa_name(isa);
      EXPECT_EQ(cpu_isa(), have.front());
    }
  set_cpu_isa(best);
}

TEST(Kernels, ParseIsa) {
  EXPECT_EQ(parse_isa("avx2"), Isa::Avx2);
  EXPECT_EQ(parse_isa("avx512-vnni"), Isa::Avx512Vnni);
  EXPECT_EQ(parse_isa("neon"), Isa::Neon);
  EXPECT_EQ(parse_isa("neon-dotprod"), Isa::NeonDotprod);
  EXPECT_EQ(parse_isa("neon-i8mm"), Isa::NeonI8mm);
  for (Isa isa : kEveryIsa) EXPECT_EQ(parse_isa(isa_name(isa)), isa);
  EXPECT_THROW(parse_isa("avx512"), Error);
  EXPECT_THROW(parse_isa("sve"), Error);
  EXPECT_THROW(parse_isa(""), Error);
}

TEST(Kernels, ParseBackend) {
  EXPECT_EQ(parse_backend("reference"), Backend::Reference);
  EXPECT_THROW(parse_backend("gpu9"), Error);
}

}  // namespace
}  // namespace swiftlet
