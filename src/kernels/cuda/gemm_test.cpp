// The tensor-core products over tokens (gemm.cu) against the scalar reference: the quantised rows
// reconstruct their input within the stated bound, and every product is within the error that
// bound allows (computed per output from the weights and the inputs), for 4/8-bit weights, group
// sizes 32/64/128, the three scale types, ragged rows and token counts, and the experts' pairs
// (groups of 1 to more than a tile). Skips where no usable GPU is present (CI), saying why.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_test_support.h"

#include "kernels/cpu/ops_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace swiftlet {
namespace {

using cuda_test::DevBuf;
using cuda_test::HostMatrix;
using cuda_test::random_matrix;
using cuda_test::randn;

// Rows with features the quantiser must survive: outliers, an all-zero group, tiny values.
std::vector<float> spiky_rows(std::mt19937& rng, int64_t rows, int64_t cols, int gs) {
  std::vector<float> x = randn(rng, size_t(rows * cols));
  std::uniform_int_distribution<int64_t> any(0, rows * cols - 1);
  for (int i = 0; i < 5; ++i) x[size_t(any(rng))] *= 300.0f;
  if (cols >= 2 * gs) std::fill_n(x.begin() + gs, gs, 0.0f);  // row 0, group 1
  if (rows > 1) for (int64_t c = 0; c < cols; ++c) x[size_t(cols + c)] *= 1e-30f;  // row 1: tiny
  return x;
}

// What the products may differ from the reference by, per output: x's rounding, at most 2^-22 of
// its group's largest |x| (times sum |w| over the group), plus fp32 rounding of sum |w x|.
std::vector<float> error_bound(const QMatrix& w, const std::vector<float>& x, int64_t n, int gs) {
  const int64_t rows = w.rows, cols = w.cols, groups = cols / gs;
  std::vector<float> wr(static_cast<size_t>(cols)), bound(static_cast<size_t>(n * rows));
  for (int64_t r = 0; r < rows; ++r) {
    ref::dequant_row(w, r, wr.data());
    for (int64_t t = 0; t < n; ++t) {
      double b = 0.0, mag = 0.0;
      for (int64_t G = 0; G < groups; ++G) {
        double m = 0.0, sw = 0.0;
        for (int64_t c = G * gs; c < (G + 1) * gs; ++c) {
          m = std::max(m, double(std::fabs(x[size_t(t * cols + c)])));
          sw += std::fabs(wr[size_t(c)]);
          mag += std::fabs(double(wr[size_t(c)]) * x[size_t(t * cols + c)]);
        }
        b += m * std::ldexp(1.0, -22) * sw;
      }
      bound[size_t(t * rows + r)] = float(b + 1e-5 * mag + 1e-30);
    }
  }
  return bound;
}

void expect_within(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(double(got[i]) - want[i]), bound[i]) << what << " at " << i << ": got " << got[i]
                                                              << ", want " << want[i];
}

TEST(CudaGemm, QuantisedRowsRebuildTheirInput) {
  REQUIRE_GPU();
  std::mt19937 rng(201);
  for (int gs : {32, 64, 128}) {
    const int64_t rows = 5, cols = 512, groups = cols / gs;
    const std::vector<float> x = spiky_rows(rng, rows, cols, gs);
    const size_t bytes = cuda::quantized_rows_bytes(rows, cols, gs);
    ASSERT_EQ(bytes % size_t(rows), 0u);
    const size_t rb = bytes / size_t(rows);
    ASSERT_EQ(rb % 16, 0u) << "rows must start 16-byte aligned";
    DevBuf<float> dx(x);
    DevBuf<uint8_t> dq(bytes);
    cuda::quantize_rows(dx.p, rows, cols, gs, dq.p);
    const std::vector<uint8_t> q = dq.get();
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = q.data() + size_t(r) * rb;
      for (int64_t G = 0; G < groups; ++G) {
        float info[2];
        std::memcpy(info, row + 3 * cols + 8 * G, 8);
        double m = 0.0, sum = 0.0;
        for (int64_t c = G * gs; c < (G + 1) * gs; ++c) {
          m = std::max(m, double(std::fabs(x[size_t(r * cols + c)])));
          sum += x[size_t(r * cols + c)];
        }
        EXPECT_NEAR(info[1], sum, 1e-5 * (1.0 + m * double(gs))) << "sum, gs " << gs << " row " << r << " group " << G;
        for (int64_t c = G * gs; c < (G + 1) * gs; ++c) {
          // Each 8 values' even ones first, then the odd ones.
          const int64_t at = (c & ~int64_t(7)) + ((c & 1) ? 4 + ((c & 7) >> 1) : ((c & 7) >> 1));
          const int d0 = int8_t(row[at]), d1 = int8_t(row[cols + at]), d2 = int8_t(row[2 * cols + at]);
          const double back = (double(d0) + 256.0 * d1 + 65536.0 * d2) * info[0];
          ASSERT_LE(std::fabs(back - x[size_t(r * cols + c)]), m * std::ldexp(1.0, -22) + 1e-38)
              << "gs " << gs << " row " << r << " col " << c;
        }
      }
    }
  }
}

TEST(CudaGemm, ProductsMatchReference) {
  REQUIRE_GPU();
  if (!cuda::tensor_core_gemm()) GTEST_SKIP() << "the tensor-core products need sm_80 or later";
  std::mt19937 rng(202);
  struct Case {
    int bits, gs;
    DType sdt;
  };
  const Case cases[] = {{4, 64, DType::BF16}, {8, 64, DType::BF16}, {4, 32, DType::F16}, {8, 128, DType::F32},
                        {4, 128, DType::F32}, {8, 32, DType::F16}};
  for (const Case& c : cases) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{257, 128}, {300, 384}, {515, 2048}, {1030, 256}}) {
      HostMatrix w = random_matrix(rng, WeightFormat::Affine, rows, cols, c.bits, c.gs, c.sdt);
      void* owner = nullptr;
      const cuda::GpuMatrix g = cuda::upload_matrix(w.m, &owner);
      ASSERT_TRUE(cuda::gemm_takes(g, c.gs));
      EXPECT_FALSE(cuda::gemm_takes(g, c.gs == 64 ? 32 : 64)) << "rows quantised for another group size";
      for (int64_t n : {1, 5, 32, 33, 100}) {
        const std::vector<float> x = spiky_rows(rng, n, cols, c.gs);
        std::vector<float> want(size_t(n * rows));
        ref::matmul(w.m, x.data(), n, want.data());
        const std::vector<float> bound = error_bound(w.m, x, n, c.gs);
        DevBuf<float> dx(x), dy(size_t(n * rows));
        DevBuf<uint8_t> dq(cuda::quantized_rows_bytes(n, cols, c.gs));
        const cuda::RowsIn in = cuda::prepare_rows(dx.p, n, cols, c.gs, dq.p);
        ASSERT_EQ(in.q, static_cast<const void*>(dq.p));
        cuda::matmul_rows(g, in, n, dy.p, false);
        const std::string what = "bits " + std::to_string(c.bits) + " gs " + std::to_string(c.gs) + " " +
                                 std::to_string(rows) + "x" + std::to_string(cols) + " n=" + std::to_string(n);
        expect_within(dy.get(), want, bound, what);
        // Y += W X (an output projection into its residual rows).
        const std::vector<float> y0 = randn(rng, size_t(n * rows));
        DevBuf<float> dacc(y0);
        cuda::matmul_rows(g, in, n, dacc.p, true);
        std::vector<float> want_add = want, bound_add = bound;
        for (size_t i = 0; i < want.size(); ++i) {
          want_add[i] += y0[i];
          bound_add[i] += 1e-6f * std::fabs(y0[i]);
        }
        expect_within(dacc.get(), want_add, bound_add, what + " (add)");
      }
      cuda::gpu_free(owner);
    }
  }
}

// Matrices of at most 256 rows go through the fp32 tiles even from quantised rows: the results are
// those of matmul bit for bit.
TEST(CudaGemm, FewRowsStayOnTheFp32Tiles) {
  REQUIRE_GPU();
  std::mt19937 rng(205);
  for (int64_t rows : {1, 32, 256}) {
    const int64_t cols = 512, n = 40;
    HostMatrix w = random_matrix(rng, WeightFormat::Affine, rows, cols, 4, 64, DType::BF16);
    void* owner = nullptr;
    const cuda::GpuMatrix g = cuda::upload_matrix(w.m, &owner);
    const std::vector<float> x = randn(rng, size_t(n * cols));
    DevBuf<float> dx(x), dy(size_t(n * rows)), dref(size_t(n * rows));
    DevBuf<uint8_t> dq(cuda::quantized_rows_bytes(n, cols, 64));
    cuda::matmul_rows(g, cuda::prepare_rows(dx.p, n, cols, 64, dq.p), n, dy.p, false);
    cuda::matmul(g, dx.p, n, dref.p);
    EXPECT_EQ(dy.get(), dref.get()) << rows << " rows";
    cuda::gpu_free(owner);
  }
}

TEST(CudaGemm, ShapesItCannotTakeRunInFp32) {
  REQUIRE_GPU();
  std::mt19937 rng(203);
  // cols not a multiple of 128; an 8-bit matrix with group size 64 given rows quantised for 32.
  for (auto [cols, gs_w, gs_q] : {std::tuple<int64_t, int, int>{192, 64, 64}, {256, 64, 32}}) {
    const int64_t rows = 40, n = 9;
    HostMatrix w = random_matrix(rng, WeightFormat::Affine, rows, cols, 8, gs_w, DType::BF16);
    void* owner = nullptr;
    const cuda::GpuMatrix g = cuda::upload_matrix(w.m, &owner);
    EXPECT_FALSE(cuda::gemm_takes(g, gs_q));
    const std::vector<float> x = randn(rng, size_t(n * cols));
    std::vector<float> want(size_t(n * rows));
    ref::matmul(w.m, x.data(), n, want.data());
    DevBuf<float> dx(x), dy(size_t(n * rows));
    DevBuf<uint8_t> dq(cuda::quantized_rows_bytes(n, cols, gs_q));
    cuda::matmul_rows(g, cuda::prepare_rows(dx.p, n, cols, gs_q, dq.p), n, dy.p, false);
    cuda_test::expect_close(dy.get(), want, 1e-4f, 1e-3f, "cols " + std::to_string(cols));
    cuda::gpu_free(owner);
  }
  // Turned off: prepare_rows quantises nothing and the products run in fp32.
  cuda::set_tensor_core_gemm(false);
  DevBuf<float> dx(size_t(64 * 4));
  DevBuf<uint8_t> dq(cuda::quantized_rows_bytes(4, 64, 64));
  EXPECT_EQ(cuda::prepare_rows(dx.p, 4, 64, 64, dq.p).q, nullptr);
  cuda::set_tensor_core_gemm(true);
}

TEST(CudaGemm, ExpertPairsMatchReference) {
  REQUIRE_GPU();
  if (!cuda::tensor_core_gemm()) GTEST_SKIP() << "the tensor-core products need sm_80 or later";
  std::mt19937 rng(204);
  for (int bits : {4, 8}) {
    const int64_t H = 384, I = 256, T = 50;
    const int E = 5, k = 2, gs = 64;
    std::vector<HostMatrix> gate, up, down;
    for (int e = 0; e < E; ++e) {
      gate.push_back(random_matrix(rng, WeightFormat::Affine, I, H, bits, gs, DType::BF16));
      up.push_back(random_matrix(rng, WeightFormat::Affine, I, H, bits, gs, DType::BF16));
      down.push_back(random_matrix(rng, WeightFormat::Affine, H, I, bits, gs, DType::BF16));
    }
    const cuda_test::DevExperts ex(gate, up, down, 3);
    // Expert 0 takes every token's first choice (50 pairs: two tiles), expert 4 one pair, expert
    // 3 none; the second choice spreads over 1 and 2.
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < T; ++t) {
      ids.push_back(0);
      ids.push_back(t == 17 ? 4 : int32_t(1 + t % 2));
    }
    const cuda_test::DevWorkList wl(ids, E, k);

    const std::vector<float> x = spiky_rows(rng, T, H, gs), act = randn(rng, size_t(T * k * I));
    DevBuf<float> dx(x), dact(act), dg(size_t(T * k * I)), du(size_t(T * k * I)), dy(size_t(T * k * H));
    DevBuf<uint8_t> dqx(cuda::quantized_rows_bytes(T, H, gs)), dqa(cuda::quantized_rows_bytes(T * k, I, gs));
    cuda::expert_gate_up_pairs(ex.lay, ex.d_table, wl.batch, cuda::prepare_rows(dx.p, T, H, gs, dqx.p), dg.p, du.p);
    cuda::expert_down_pairs(ex.lay, ex.d_table, wl.batch, cuda::prepare_rows(dact.p, T * k, I, gs, dqa.p), dy.p);
    const std::vector<float> g = dg.get(), u = du.get(), y = dy.get();
    for (int64_t p = 0; p < T * k; ++p) {
      const size_t e = size_t(ids[size_t(p)]);
      const std::vector<float> xt(x.begin() + (p / k) * H, x.begin() + (p / k + 1) * H);
      const std::vector<float> at(act.begin() + p * I, act.begin() + (p + 1) * I);
      const std::string what = "bits " + std::to_string(bits) + " pair " + std::to_string(p);
      for (auto [m, in, out, rows] : {std::tuple{&gate[e].m, &xt, &g, I}, std::tuple{&up[e].m, &xt, &u, I},
                                      std::tuple{&down[e].m, &at, &y, H}}) {
        std::vector<float> want(static_cast<size_t>(rows));
        ref::matmul(*m, in->data(), 1, want.data());
        const std::vector<float> got(out->begin() + p * rows, out->begin() + (p + 1) * rows);
        expect_within(got, want, error_bound(*m, *in, 1, gs), what);
      }
    }
  }
}

}  // namespace
}  // namespace swiftlet
