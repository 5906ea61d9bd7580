// The fused decode products against the scalar reference (kernels/cpu/ops_ref.h) in every product
// mode (tensor cores, streamed with 16 and 8 warps, the kernels they replace): several matrices
// over one input, the routed and shared experts through a slot table, and the rows forms (T tokens
// in one launch) against T one-token calls bit for bit. Skips where no usable GPU is present.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_test_support.h"

#include "core/dtype.h"
#include "kernels/cpu/ops_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace swiftlet {
namespace {

using namespace cuda_test;  // DevBuf, HostMatrix, random_matrix, randn, expect_close

// The product variants the fused tests run: the streamed products on the tensor cores, streamed
// with 16 and with 8 warps, and the kernels they replace. Sets the mode; returns its label.
constexpr int kProductModes = 4;
std::string set_product_mode(int mode) {
  cuda::set_streamed_products(mode < 3, mode == 2 ? 8 : 16);
  cuda::set_tensor_core_products(mode == 0);
  if (cuda::tensor_core_products()) return " tensor cores";
  return cuda::streamed_products() ? " streamed, warps " + std::to_string(mode == 2 ? 8 : 16) : "";
}
void restore_product_mode(bool streamed, bool tc) {
  cuda::set_streamed_products(streamed);
  cuda::set_tensor_core_products(tc);
}

// x with a few large values (x300, ~1e3) and many small ones (x1e-4) among normal ones: the
// tensor cores' digits scale per group of 64 to its largest value.
std::vector<float> spiky(std::mt19937& rng, size_t n) {
  std::vector<float> x = randn(rng, n, 2.0f);
  for (size_t i = 0; i < n; ++i) {
    if (i % 61 == 5) x[i] *= 300.0f;
    else if (i % 7 == 3) x[i] *= 1e-4f;
  }
  return x;
}

// fused_matvec: several matrices over one input in one launch, optionally RMSNorm'd first and
// added into the outputs, against ref::rms_norm + ref::matmul. Row counts cover every rows-per-warp
// variant (1, 2, 4) and ragged block edges; a BF16 segment takes the unfused path.
TEST(CudaKernels, FusedMatvecMatchesReference) {
  REQUIRE_GPU();
  std::mt19937 rng(41);
  struct Case {
    int bits, gs;
    DType sdt;
    int64_t cols;
    std::vector<int64_t> rows;
    bool mixed;  // one segment BF16 (the unfused path)
  };
  const Case cases[] = {
      {4, 64, DType::BF16, 2048, {515, 33, 1}, false},     {8, 64, DType::BF16, 512, {130, 7}, false},
      {4, 32, DType::F16, 256, {9}, false},               {8, 32, DType::F32, 4096, {300, 1, 64, 2}, false},
      {4, 128, DType::BF16, 2048, {4300, 70}, false},     {4, 64, DType::BF16, 1024, {8700, 5, 513}, false},
      {8, 64, DType::BF16, 768, {8500}, false},           {4, 64, DType::BF16, 2048, {512, 1}, true},
  };
  const bool streamed_default = cuda::streamed_products(), tc_default = cuda::tensor_core_products();
  for (int mode = 0; mode < kProductModes; ++mode) {
    const std::string how = set_product_mode(mode);
    for (const Case& c : cases) {
      for (bool norm : {false, true}) {
        for (bool add : {false, true}) {
          const int64_t cols = c.cols;
          // Outliers where nothing normalises them (the norm takes them to the same scale).
          const std::vector<float> x = norm ? randn(rng, size_t(cols), 2.0f) : spiky(rng, size_t(cols));
          const std::vector<float> nw = randn(rng, size_t(cols));
          std::vector<float> xn = x;
          if (norm) ref::rms_norm(x.data(), nw.data(), cols, 1e-6f, xn.data());
          std::vector<HostMatrix> ws;
          std::vector<void*> owners;
          std::vector<std::unique_ptr<DevBuf<float>>> ys;
          std::vector<std::vector<float>> want;
          std::vector<cuda::MatvecSegment> segs;
          for (size_t i = 0; i < c.rows.size(); ++i) {
            const bool dense = c.mixed && i == 1;
            ws.push_back(random_matrix(rng, dense ? WeightFormat::BF16 : WeightFormat::Affine, c.rows[i], cols, c.bits,
                                       c.gs, c.sdt));
            void* owner = nullptr;
            const cuda::GpuMatrix g = cuda::upload_matrix(ws.back().m, &owner);
            owners.push_back(owner);
            const std::vector<float> y0 = randn(rng, size_t(c.rows[i]));
            std::vector<float> w(static_cast<size_t>(c.rows[i]));
            ref::matmul(ws.back().m, xn.data(), 1, w.data());
            if (add)
              for (size_t j = 0; j < w.size(); ++j) w[j] += y0[j];
            want.push_back(w);
            ys.push_back(std::make_unique<DevBuf<float>>(y0));
            segs.push_back({g, ys.back()->p, add});
          }
          DevBuf<float> dx(x), dnw(nw), dxo(static_cast<size_t>(cols));
          cuda::fused_matvec(segs.data(), int(segs.size()), dx.p, norm ? dnw.p : nullptr, 1e-6f, dxo.p);
          const std::string what = "bits " + std::to_string(c.bits) + " gs " + std::to_string(c.gs) + " cols " +
                                   std::to_string(cols) + (norm ? " norm" : "") + (add ? " add" : "") +
                                   (c.mixed ? " mixed" : "") + how;
          float big = 0.0f;  // products of the outliers that cancel: the tolerance scales with the largest
          for (const auto& w : want)
            for (float v : w) big = std::max(big, std::fabs(v));
          for (size_t i = 0; i < segs.size(); ++i)
            expect_close(ys[i]->get(), want[i], 1e-4f, 2e-3f + 1e-6f * big, what + " segment " + std::to_string(i));
          if (norm) expect_close(dxo.get(), xn, 1e-5f, 1e-5f, what + " normed x");
          for (void* o : owners) cuda::gpu_free(o);
        }
      }
    }
  }
  restore_product_mode(streamed_default, tc_default);
}

// expert_act + expert_down_add (routed experts through a slot table, plus the shared expert as one
// more) against per-expert reference products; both rows-per-warp variants.
TEST(CudaKernels, FusedExpertsMatchReference) {
  REQUIRE_GPU();
  std::mt19937 rng(43);
  struct Shape {
    int64_t H, I;
    std::vector<int32_t> ids;
  };
  const bool streamed_default = cuda::streamed_products(), tc_default = cuda::tensor_core_products();
  for (int bits : {4, 8}) {
    for (int mode = 0; mode < kProductModes; ++mode) {
      const std::string how = set_product_mode(mode);
      for (const Shape& shp : {Shape{256, 192, {4, 1, 5, 0}}, Shape{4352, 512, {3, 9, 0, 7, 1, 8, 2, 6, 5, 4}},
                               Shape{2048, 512, {7, 2, 9, 4, 0, 3, 8, 1, 6, 5}}}) {
        const int64_t H = shp.H, I = shp.I;
        const int E = int(shp.ids.size()) + 2;
        std::vector<HostMatrix> gate, up, down;
        for (int e = 0; e <= E; ++e) {  // expert E: the shared one
          gate.push_back(random_matrix(rng, WeightFormat::Affine, I, H, bits, 64, DType::BF16));
          up.push_back(random_matrix(rng, WeightFormat::Affine, I, H, bits, 64, DType::BF16));
          down.push_back(random_matrix(rng, WeightFormat::Affine, H, I, bits, 64, DType::BF16));
        }
        const size_t gb = cuda::matrix_device_bytes(gate[0].m), ub = cuda::matrix_device_bytes(up[0].m);
        const size_t slot = gb + ub + cuda::matrix_device_bytes(down[0].m);
        auto* arena = static_cast<uint8_t*>(cuda::gpu_alloc(slot * size_t(E)));
        std::vector<const void*> table(static_cast<size_t>(E));
        cuda::ExpertLayout lay;
        for (int e = 0; e < E; ++e) {
          uint8_t* base = arena + size_t((e * 5) % E) * slot;
          table[size_t(e)] = base;
          lay = cuda::upload_expert_to(gate[size_t(e)].m, up[size_t(e)].m, down[size_t(e)].m, base);
        }
        void *og = nullptr, *ou = nullptr, *od = nullptr;
        const float gate_logit = 0.7f;
        DevBuf<float> dgl(std::vector<float>{gate_logit});
        const cuda::SharedExpert shared{cuda::upload_matrix(gate[size_t(E)].m, &og),
                                        cuda::upload_matrix(up[size_t(E)].m, &ou),
                                        cuda::upload_matrix(down[size_t(E)].m, &od), dgl.p};
        auto* d_table = static_cast<const void**>(cuda::gpu_alloc(size_t(E) * sizeof(void*)));
        cuda::gpu_upload(d_table, table.data(), size_t(E) * sizeof(void*));
        const std::vector<float> x = randn(rng, size_t(H)), h0 = randn(rng, size_t(H));
        std::vector<float> w(shp.ids.size());
        for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f + 0.1f * float(i % 4);
        // expert e's contribution down_e(SiLU(gate_e x) * up_e x)
        auto expert_out = [&](int e) {
          std::vector<float> g(static_cast<size_t>(I)), u(static_cast<size_t>(I)), y(static_cast<size_t>(H));
          ref::matmul(gate[size_t(e)].m, x.data(), 1, g.data());
          ref::matmul(up[size_t(e)].m, x.data(), 1, u.data());
          for (int64_t j = 0; j < I; ++j) g[size_t(j)] = ref::silu(g[size_t(j)]) * u[size_t(j)];
          ref::matmul(down[size_t(e)].m, g.data(), 1, y.data());
          return y;
        };
        const std::vector<float> ysh = expert_out(E);
        for (int n : {int(shp.ids.size()), 2, 0}) {
          for (bool with_shared : {true, false}) {
            if (n == 0 && !with_shared) continue;
            std::vector<float> want = h0;
            for (int i = 0; i < n; ++i) {
              const std::vector<float> y = expert_out(shp.ids[size_t(i)]);
              for (int64_t d = 0; d < H; ++d) want[size_t(d)] += w[size_t(i)] * y[size_t(d)];
            }
            if (with_shared)
              for (int64_t d = 0; d < H; ++d) want[size_t(d)] += ref::sigmoid(gate_logit) * ysh[size_t(d)];
            const cuda::SharedExpert* sh = with_shared ? &shared : nullptr;
            ASSERT_TRUE(cuda::experts_fusable(lay, n, sh));
            DevBuf<int32_t> d_ids(shp.ids);
            DevBuf<float> dx(x), dw(w), dh(h0), dact(static_cast<size_t>((n + 1) * I));
            cuda::expert_act(lay, d_table, d_ids.p, n, sh, dx.p, dact.p);
            cuda::expert_down_add(lay, d_table, d_ids.p, dw.p, n, sh, dact.p, dh.p);
            // Products of ~1e5 that cancel to ~10: the tolerance scales with the largest output.
            float big = 0.0f;
            for (float v : want) big = std::max(big, std::fabs(v));
            expect_close(dh.get(), want, 1e-4f, 2e-3f + 1e-6f * big,
                         "fused experts bits " + std::to_string(bits) + " H " + std::to_string(H) + " n " +
                             std::to_string(n) + (with_shared ? " +shared" : "") +
                             how);
            if (n == 0) continue;
            // The routing folded into expert_act: the ids and weights router_topk gives for random
            // logits, and the same h as router_topk + expert_act + expert_down_add.
            const std::vector<float> logits = randn(rng, size_t(E), 2.0f);
            DevBuf<float> dl(logits), tw(static_cast<size_t>(n)), rw(static_cast<size_t>(n)), th(h0), rh(h0), ta(dact.n), ra(dact.n);
            DevBuf<int32_t> tids(static_cast<size_t>(n)), rids(static_cast<size_t>(n));
            cuda::router_topk(dl.p, 1, E, n, true, tids.p, tw.p);
            cuda::expert_act(lay, d_table, tids.p, n, sh, dx.p, ta.p);
            cuda::expert_down_add(lay, d_table, tids.p, tw.p, n, sh, ta.p, th.p);
            ASSERT_TRUE(cuda::expert_act_routes(E, n));
            cuda::expert_act_routed(lay, d_table, dl.p, E, n, true, sh, dx.p, rids.p, rw.p, ra.p);
            cuda::expert_down_add(lay, d_table, rids.p, rw.p, n, sh, ra.p, rh.p, nullptr, /*ids_early=*/false);
            EXPECT_EQ(rids.get(), tids.get()) << "routed ids, n " << n;
            expect_close(rw.get(), tw.get(), 1e-6f, 1e-7f, "routed weights");  // the softmax sums in another order
            expect_close(ra.get(), ta.get(), 0.0f, 0.0f, "routed act");
            expect_close(rh.get(), th.get(), 1e-5f, 1e-5f + 1e-6f * big, "routed h");
          }
        }
        cuda::gpu_free(d_table);
        cuda::gpu_free(arena);
        for (void* p : {og, ou, od}) cuda::gpu_free(p);
      }
    }
  }
  restore_product_mode(streamed_default, tc_default);
}

// fused_matvec_rows: T tokens in one launch (a grid row each) equal T fused_matvec calls bit for bit
// (the same kernel per token), with strided inputs and outputs, the norm and the add, in every
// product mode; a mixed segment takes the token-by-token fallback.
TEST(CudaKernels, FusedMatvecRowsEqualOneTokenCalls) {
  REQUIRE_GPU();
  std::mt19937 rng(47);
  struct Case {
    int bits;
    int64_t cols;
    std::vector<int64_t> rows;
    bool mixed;
  };
  const Case cases[] = {{4, 2048, {515, 1, 70}, false}, {8, 4096, {2048}, false}, {4, 1024, {300, 9}, true}};
  const bool streamed_default = cuda::streamed_products(), tc_default = cuda::tensor_core_products();
  for (int mode = 0; mode < kProductModes; ++mode) {
    const std::string how = set_product_mode(mode);
    for (const Case& c : cases) {
      std::vector<HostMatrix> ws;
      std::vector<cuda::GpuMatrix> gs;
      std::vector<void*> owners;
      for (size_t i = 0; i < c.rows.size(); ++i) {
        const bool dense = c.mixed && i == 1;
        ws.push_back(random_matrix(rng, dense ? WeightFormat::BF16 : WeightFormat::Affine, c.rows[i], c.cols, c.bits,
                                   64, DType::BF16));
        void* owner = nullptr;
        gs.push_back(cuda::upload_matrix(ws.back().m, &owner));
        owners.push_back(owner);
      }
      const std::vector<float> nw = randn(rng, size_t(c.cols));
      DevBuf<float> dnw(nw);
      for (int T : {1, 2, 3, 5, 8}) {
        for (bool norm : {false, true}) {
          const bool add = norm;  // both forms of each
          const int64_t xs = c.cols + 64;
          const std::vector<float> x = spiky(rng, size_t(T * xs));
          DevBuf<float> dx(x), xo_rows(size_t(T * xs)), xo_one(size_t(T * xs));
          std::vector<std::unique_ptr<DevBuf<float>>> y_rows, y_one;
          std::vector<cuda::MatvecSegment> segs;
          for (size_t i = 0; i < gs.size(); ++i) {
            const int64_t ys = c.rows[i] + 3;
            const std::vector<float> y0 = randn(rng, size_t(T * ys));
            y_rows.push_back(std::make_unique<DevBuf<float>>(y0));
            y_one.push_back(std::make_unique<DevBuf<float>>(y0));
            segs.push_back({gs[i], y_rows.back()->p, add, ys});
          }
          cuda::fused_matvec_rows(segs.data(), int(segs.size()), T, dx.p, xs, norm ? dnw.p : nullptr, 1e-6f,
                                  xo_rows.p);
          for (int t = 0; t < T; ++t) {
            std::vector<cuda::MatvecSegment> one;
            for (size_t i = 0; i < gs.size(); ++i) one.push_back({gs[i], y_one[i]->p + t * segs[i].y_stride, add});
            cuda::fused_matvec(one.data(), int(one.size()), dx.p + t * xs, norm ? dnw.p : nullptr, 1e-6f,
                               xo_one.p + t * xs);
          }
          const std::string what = "bits " + std::to_string(c.bits) + " cols " + std::to_string(c.cols) + " T " +
                                   std::to_string(T) + (norm ? " norm+add" : "") + (c.mixed ? " mixed" : "") + how;
          for (size_t i = 0; i < segs.size(); ++i)
            EXPECT_EQ(y_rows[i]->get(), y_one[i]->get()) << what << " segment " << i;
          if (norm) {
            EXPECT_EQ(xo_rows.get(), xo_one.get()) << what << " normed x";
          }
        }
      }
      for (void* o : owners) cuda::gpu_free(o);
    }
  }
  restore_product_mode(streamed_default, tc_default);
}

// expert_act_routed_rows + expert_down_add_rows (and the dispatch's rows forms): T tokens in one
// launch each equal T one-token calls bit for bit: ids, weights, activations and h.
TEST(CudaKernels, ExpertRowsEqualOneTokenCalls) {
  REQUIRE_GPU();
  std::mt19937 rng(53);
  const bool streamed_default = cuda::streamed_products(), tc_default = cuda::tensor_core_products();
  for (int bits : {4, 8}) {
    const int64_t H = 2048, I = 512;
    const int E = 40, k = 6;
    std::vector<HostMatrix> gate, up, down;
    for (int e = 0; e <= E; ++e) {  // expert E: the shared one
      gate.push_back(random_matrix(rng, WeightFormat::Affine, I, H, bits, 64, DType::BF16));
      up.push_back(random_matrix(rng, WeightFormat::Affine, I, H, bits, 64, DType::BF16));
      down.push_back(random_matrix(rng, WeightFormat::Affine, H, I, bits, 64, DType::BF16));
    }
    const size_t slot = cuda::matrix_device_bytes(gate[0].m) + cuda::matrix_device_bytes(up[0].m) +
                        cuda::matrix_device_bytes(down[0].m);
    auto* arena = static_cast<uint8_t*>(cuda::gpu_alloc(slot * size_t(E)));
    std::vector<const void*> table(static_cast<size_t>(E));
    cuda::ExpertLayout lay;
    for (int e = 0; e < E; ++e) {
      table[size_t(e)] = arena + size_t(e) * slot;
      lay = cuda::upload_expert_to(gate[size_t(e)].m, up[size_t(e)].m, down[size_t(e)].m, arena + size_t(e) * slot);
    }
    auto* d_table = static_cast<const void**>(cuda::gpu_alloc(size_t(E) * sizeof(void*)));
    cuda::gpu_upload(d_table, table.data(), size_t(E) * sizeof(void*));
    void *og = nullptr, *ou = nullptr, *od = nullptr;
    const cuda::GpuMatrix sg = cuda::upload_matrix(gate[size_t(E)].m, &og), su = cuda::upload_matrix(up[size_t(E)].m, &ou),
                          sd = cuda::upload_matrix(down[size_t(E)].m, &od);
    for (int mode = 0; mode < kProductModes; ++mode) {
      const std::string how = set_product_mode(mode);
      for (int T : {1, 3, 8}) {
        const std::vector<float> x = randn(rng, size_t(T * H)), h0 = randn(rng, size_t(T * H));
        const std::vector<float> logits = randn(rng, size_t(T * E), 2.0f), gl = randn(rng, size_t(T));
        DevBuf<float> dx(x), dl(logits), dgl(gl), h_rows(h0), h_one(h0);
        const size_t act = size_t(T) * size_t(k + 1) * size_t(I);
        DevBuf<float> a_rows(act), a_one(act), w_rows(size_t(T * k)), w_one(size_t(T * k));
        DevBuf<int32_t> i_rows(size_t(T * k)), i_one(size_t(T * k));
        const cuda::SharedExpert sh{sg, su, sd, dgl.p};
        const cuda::RoutedExperts ex{lay, d_table, E, k, true};
        ASSERT_TRUE(cuda::routes_in_act(ex, &sh));
        const cuda::ExpertScratch scratch{a_rows.p, nullptr, nullptr};
        cuda::route_experts_act(ex, dl.p, &sh, dx.p, T, i_rows.p, w_rows.p, scratch);
        cuda::routed_experts_down_add(ex, i_rows.p, w_rows.p, &sh, scratch, T, h_rows.p);
        for (int t = 0; t < T; ++t) {
          const cuda::SharedExpert st{sg, su, sd, dgl.p + t};
          float* at = a_one.p + size_t(t) * size_t(k + 1) * size_t(I);
          cuda::expert_act_routed(lay, d_table, dl.p + t * E, E, k, true, &st, dx.p + t * H, i_one.p + t * k,
                                  w_one.p + t * k, at);
          cuda::expert_down_add(lay, d_table, i_one.p + t * k, w_one.p + t * k, k, &st, at, h_one.p + t * H, nullptr,
                                /*ids_early=*/false);
        }
        const std::string what = "bits " + std::to_string(bits) + " T " + std::to_string(T) + how;
        EXPECT_EQ(i_rows.get(), i_one.get()) << what << " ids";
        EXPECT_EQ(w_rows.get(), w_one.get()) << what << " weights";
        EXPECT_EQ(a_rows.get(), a_one.get()) << what << " act";
        EXPECT_EQ(h_rows.get(), h_one.get()) << what << " h";
      }
    }
    cuda::gpu_free(d_table);
    cuda::gpu_free(arena);
    for (void* p : {og, ou, od}) cuda::gpu_free(p);
  }
  restore_product_mode(streamed_default, tc_default);
}

}  // namespace
}  // namespace swiftlet
