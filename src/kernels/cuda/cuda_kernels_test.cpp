// Every CUDA kernel against the scalar reference (kernels/cpu/ops_ref.h, or the loops of
// model/qwen3_hybrid.cpp restated here) on random shapes with ragged edges. Skips where no
// usable GPU is present (CI), saying why.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_test_support.h"

#include "core/dtype.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/delta_net.h"
#include "kernels/cpu/ops_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace swiftlet {
namespace {

using cuda_test::DevBuf;
using cuda_test::HostMatrix;
using cuda_test::random_matrix;
using cuda_test::expect_close;
using cuda_test::randn;

TEST(CudaKernels, DeviceIsUsable) {
  REQUIRE_GPU();
  const std::string d = cuda::device_description();
  EXPECT_FALSE(d.empty());
  std::printf("CUDA device: %s\n", d.c_str());
}

TEST(CudaKernels, MatmulMatchesReference) {
  REQUIRE_GPU();
  std::mt19937 rng(11);
  struct Case {
    WeightFormat f;
    int bits, gs;
    DType sdt;
  };
  const Case cases[] = {
      {WeightFormat::F32, 0, 0, DType::BF16},      {WeightFormat::BF16, 0, 0, DType::BF16},
      {WeightFormat::F16, 0, 0, DType::BF16},      {WeightFormat::Affine, 4, 64, DType::BF16},
      {WeightFormat::Affine, 8, 64, DType::BF16},  {WeightFormat::Affine, 4, 64, DType::F16},
      {WeightFormat::Affine, 4, 64, DType::F32},   {WeightFormat::Affine, 8, 64, DType::F32},
      {WeightFormat::Affine, 4, 128, DType::BF16}, {WeightFormat::Affine, 4, 32, DType::BF16},
      {WeightFormat::Affine, 8, 32, DType::BF16},
  };
  for (const Case& c : cases) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 128}, {7, 256}, {33, 384}, {130, 512}, {515, 2048},
                              {9, 4096}}) {
      if (c.f != WeightFormat::Affine) cols += rows % 5;  // ragged rows: the scalar (unaligned) path
      HostMatrix w = random_matrix(rng, c.f, rows, cols, c.bits, c.gs, c.sdt);
      void* owner = nullptr;
      const cuda::GpuMatrix g = cuda::upload_matrix(w.m, &owner);
      for (int64_t n : {1, 2, 3, 8, 11, 29}) {
        const std::vector<float> x = randn(rng, size_t(n * cols));
        std::vector<float> want(size_t(n * rows));
        ref::matmul(w.m, x.data(), n, want.data());
        DevBuf<float> dx(x), dy(size_t(n * rows));
        cuda::matmul(g, dx.p, n, dy.p);
        const std::string what = "format " + std::to_string(int(c.f)) + " bits " + std::to_string(c.bits) + " gs " +
                                 std::to_string(c.gs) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                                 " n=" + std::to_string(n);
        expect_close(dy.get(), want, 1e-4f, 1e-3f, what);
        // Y += W X over the same rows (a prompt's output projection into its residual rows).
        const std::vector<float> y0 = randn(rng, size_t(n * rows));
        for (size_t i = 0; i < want.size(); ++i) want[i] += y0[i];
        DevBuf<float> dacc(y0);
        cuda::matmul_add_rows(g, dx.p, n, dacc.p);
        expect_close(dacc.get(), want, 1e-4f, 1e-3f, what + " (add)");
      }
      cuda::gpu_free(owner);
    }
  }
}

TEST(CudaKernels, NormsMatchReference) {
  REQUIRE_GPU();
  std::mt19937 rng(3);
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {16, 256}, {5, 2048}, {2, 2049}}) {
    const std::vector<float> x = randn(rng, size_t(rows * n), 2.0f), w = randn(rng, size_t(n));
    std::vector<float> want(x.size());
    for (int64_t r = 0; r < rows; ++r) ref::rms_norm(x.data() + r * n, w.data(), n, 1e-6f, want.data() + r * n);
    DevBuf<float> dx(x), dw(w), dy(x.size());
    cuda::rms_norm(dx.p, dw.p, rows, n, 1e-6f, dy.p);
    expect_close(dy.get(), want, 1e-5f, 1e-5f, "rms_norm " + std::to_string(rows) + "x" + std::to_string(n));
    cuda::rms_norm(dx.p, dw.p, rows, n, 1e-6f, dx.p);  // in place
    expect_close(dx.get(), want, 1e-5f, 1e-5f, "rms_norm in place");

    std::vector<float> l2 = x;
    for (int64_t r = 0; r < rows; ++r) ref::l2_norm_scaled(l2.data() + r * n, n, 1e-6f, 0.25f);
    DevBuf<float> dl(x);
    cuda::l2_norm_rows(dl.p, rows, n, 1e-6f, 0.25f);
    expect_close(dl.get(), l2, 1e-5f, 1e-6f, "l2_norm_rows " + std::to_string(rows) + "x" + std::to_string(n));

    // Gated RMSNorm over heads (model-math.md 5.6).
    const std::vector<float> z = randn(rng, x.size());
    std::vector<float> gw = x;
    for (int64_t r = 0; r < rows; ++r) {
      float* o = gw.data() + r * n;
      ref::rms_norm(o, w.data(), n, 1e-6f, o);
      for (int64_t j = 0; j < n; ++j) o[j] *= ref::silu(z[size_t(r * n + j)]);
    }
    DevBuf<float> dg(x), dz(z);
    cuda::gated_rms_norm(dg.p, dz.p, dw.p, rows, n, 1e-6f);
    expect_close(dg.get(), gw, 1e-5f, 1e-5f, "gated_rms_norm");
  }
}

TEST(CudaKernels, ElementwiseMatchReference) {
  REQUIRE_GPU();
  std::mt19937 rng(5);
  for (int64_t n : {1, 255, 256, 1000, 70001}) {
    const std::vector<float> g = randn(rng, size_t(n), 3.0f), u = randn(rng, size_t(n)), y0 = randn(rng, size_t(n));
    std::vector<float> want(static_cast<size_t>(n)), want_axpy = y0, want_sig = y0;
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] = ref::silu(g[size_t(i)]) * u[size_t(i)];
    const float a = 0.37f, gate = -0.8f;
    for (int64_t i = 0; i < n; ++i) {
      want_axpy[size_t(i)] += a * u[size_t(i)];
      want_sig[size_t(i)] += ref::sigmoid(gate) * u[size_t(i)];
    }
    DevBuf<float> dg(g), du(u), dy(static_cast<size_t>(n)), da(y0), dd(y0), dgate(std::vector<float>{gate}), dw(std::vector<float>{a});
    cuda::silu_mul(dg.p, du.p, n, dy.p);
    expect_close(dy.get(), want, 1e-6f, 1e-6f, "silu_mul n=" + std::to_string(n));
    cuda::axpy(da.p, du.p, n, 0.0f, dw.p);
    expect_close(da.get(), want_axpy, 1e-6f, 1e-6f, "axpy (device scalar)");
    cuda::add_sigmoid_scaled(dd.p, du.p, dgate.p, n);
    expect_close(dd.get(), want_sig, 1e-6f, 1e-6f, "add_sigmoid_scaled");
  }
}

TEST(CudaKernels, RouterTopkMatchesReference) {
  REQUIRE_GPU();
  std::mt19937 rng(9);
  for (auto [E, k] : {std::pair<int, int>{8, 1}, {8, 8}, {64, 4}, {256, 8}, {300, 10}, {512, 10}, {512, 16},
                        {1, 1}, {3000, 16}, {4096, 10}}) {
    const int64_t T = 5;
    const std::vector<float> logits = randn(rng, size_t(T * E), 2.0f);
    std::vector<int32_t> want_ids;
    std::vector<float> want_w;
    for (int64_t t = 0; t < T; ++t) {
      // As Forward::sparse_moe: softmax over all E, top k by probability, renormalise.
      std::vector<float> p(logits.begin() + t * E, logits.begin() + (t + 1) * E);
      ref::softmax(p.data(), E);
      std::vector<int32_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
      double sum = 0;
      for (int i = 0; i < k; ++i) sum += p[size_t(order[size_t(i)])];
      for (int i = 0; i < k; ++i) {
        want_ids.push_back(order[size_t(i)]);
        want_w.push_back(float(p[size_t(order[size_t(i)])] / sum));
      }
    }
    DevBuf<float> dl(logits), dw(size_t(T * k));
    DevBuf<int32_t> di(size_t(T * k));
    cuda::router_topk(dl.p, T, E, k, true, di.p, dw.p);
    const std::string what = "router E=" + std::to_string(E) + " k=" + std::to_string(k);
    EXPECT_EQ(di.get(), want_ids) << what;
    expect_close(dw.get(), want_w, 1e-5f, 1e-6f, what);
  }
}

TEST(CudaKernels, RopeMatchesReference) {
  REQUIRE_GPU();
  std::mt19937 rng(13);
  const float theta = 1e7f;
  for (auto [heads, hd, rot] : {std::tuple<int, int, int>{16, 256, 64}, {2, 256, 64}, {4, 128, 128}, {3, 64, 16}}) {
    for (int64_t pos : {0, 1, 17, 1000}) {
      const int stride = 2 * hd;  // as q inside the gated q_proj output: [query | gate] per head
      const std::vector<float> x = randn(rng, size_t(heads * stride));
      std::vector<float> want = x, cs(size_t(rot / 2)), sn(size_t(rot / 2));
      for (int i = 0; i < rot / 2; ++i) {  // as Forward::rope_tables
        const float inv = 1.0f / std::pow(theta, float(2 * i) / float(rot));
        cs[size_t(i)] = std::cos(float(pos) * inv);
        sn[size_t(i)] = std::sin(float(pos) * inv);
      }
      for (int h = 0; h < heads; ++h) ref::rope_neox(want.data() + h * stride, rot, cs.data(), sn.data());
      DevBuf<float> dx(x);
      cuda::rope_neox(dx.p, heads, stride, rot, pos, theta);
      expect_close(dx.get(), want, 1e-4f, 2e-5f, "rope pos " + std::to_string(pos));
    }
  }
}

// Decode attention for the last query over a cache of n positions: the CPU reference
// (attn::attend_reference, then the output gate), as Backend::Reference runs it.
std::vector<float> attention_ref(const std::vector<float>& q, const std::vector<float>& kc, const std::vector<float>& vc,
                                 int64_t n, int nh, int nkv, int hd, const std::vector<float>* gate) {
  const int64_t kvd = int64_t(nkv) * hd;
  std::vector<float> out(static_cast<size_t>(nh * hd));
  attn::attend_reference({nh, nkv, hd}, {1, n - 1, q.data(), int64_t(nh) * hd, kc.data(), vc.data(), kvd,
                                         1.0f / std::sqrt(float(hd)), out.data(), int64_t(nh) * hd});
  if (gate) attn::sigmoid_gate_reference(out.data(), gate->data(), int64_t(out.size()));
  return out;
}

TEST(CudaKernels, AttentionDecodeMatchesReference) {
  REQUIRE_GPU();
  std::mt19937 rng(17);
  for (auto [nh, nkv, hd] :
       {std::tuple<int, int, int>{16, 2, 256}, {4, 4, 128}, {6, 2, 96}, {2, 1, 32}, {6, 2, 16}, {3, 1, 48}}) {
    for (int64_t n : {1, 5, 37, 300}) {
      for (bool gated : {false, true}) {
        const int64_t kvd = int64_t(nkv) * hd;
        const std::vector<float> q = randn(rng, size_t(nh * hd), 0.5f), kc = randn(rng, size_t(n * kvd)),
                                 vc = randn(rng, size_t(n * kvd)), gate = randn(rng, size_t(nh * hd));
        const std::vector<float> want = attention_ref(q, kc, vc, n, nh, nkv, hd, gated ? &gate : nullptr);
        DevBuf<float> dq(q), dk(kc), dv(vc), dg(gate), dout(size_t(nh * hd));
        cuda::attention_decode(dq.p, dk.p, dv.p, n, nh, nkv, hd, 1.0f / std::sqrt(float(hd)), gated ? dg.p : nullptr,
                               dout.p);
        expect_close(dout.get(), want, 1e-4f, 1e-5f,
                     "attention nh=" + std::to_string(nh) + " nkv=" + std::to_string(nkv) + " hd=" +
                         std::to_string(hd) + " n=" + std::to_string(n) + (gated ? " gated" : ""));
      }
    }
  }
}

struct DeltaShape {
  int hk, hv, dk, dv, K;
};

// Several decode steps of a Gated DeltaNet mixer core (conv + SiLU, L2 norms, delta rule, gated
// RMSNorm) against the CPU references of each part (kernels/cpu/delta_net.h), one token at a time.
TEST(CudaKernels, DeltaNetDecodeMatchesReference) {
  REQUIRE_GPU();
  std::mt19937 rng(23);
  for (const DeltaShape& sh : {DeltaShape{4, 8, 128, 128, 4}, DeltaShape{2, 6, 96, 80, 4}, DeltaShape{1, 1, 256, 40, 2},
                               DeltaShape{16, 32, 128, 128, 4}}) {
    const int64_t kd = int64_t(sh.hk) * sh.dk, vd = int64_t(sh.hv) * sh.dv, C = 2 * kd + vd;
    const int K = sh.K;
    const float q_scale = 1.0f / std::sqrt(float(sh.dk)), eps = 1e-6f;
    const std::vector<float> conv_w = randn(rng, size_t(C * K), 0.5f), norm_w = randn(rng, size_t(sh.dv), 0.3f),
                             A_log = randn(rng, size_t(sh.hv), 0.5f), dt_bias = randn(rng, size_t(sh.hv), 0.5f);
    std::vector<float> conv(size_t((K - 1) * C)), S(size_t(sh.hv) * sh.dk * sh.dv);
    DevBuf<float> d_conv_w(conv_w), d_norm_w(norm_w), d_A(A_log), d_dt(dt_bias), d_conv(conv.size()), d_S(S.size()),
        d_u(static_cast<size_t>(C)), d_o(static_cast<size_t>(vd));
    // deltanet_decode's fallback (conv1d_silu_step + l2_norm_qk + delta_rule_norm_step) on its own
    // copy of the state.
    DevBuf<float> f_conv(conv.size()), f_S(S.size()), f_u(static_cast<size_t>(C)), f_o(static_cast<size_t>(vd));
    // deltanet_step (one launch, sm_90), on its own state.
    DevBuf<float> s_conv(conv.size()), s_S(S.size()), s_o(static_cast<size_t>(vd));
    for (int step = 0; step < 4; ++step) {
      const std::vector<float> x = randn(rng, size_t(C)), z = randn(rng, size_t(vd)), b = randn(rng, size_t(sh.hv)),
                               a = randn(rng, size_t(sh.hv));
      // Reference: each part's CPU reference, in the model's order (model-math.md 5.2-5.6).
      std::vector<float> u = x, o(static_cast<size_t>(vd));
      gdn::conv_silu_reference(u.data(), 1, C, conv_w.data(), K, conv.data());
      gdn::l2_norm_heads_reference(u.data(), sh.hk, sh.dk, eps, q_scale);
      gdn::l2_norm_heads_reference(u.data() + kd, sh.hk, sh.dk, eps, 1.0f);
      std::vector<float> beta(size_t(sh.hv)), g(size_t(sh.hv));
      for (int h = 0; h < sh.hv; ++h) {
        beta[size_t(h)] = ref::sigmoid(b[size_t(h)]);
        g[size_t(h)] = -std::exp(A_log[size_t(h)]) * ref::softplus(a[size_t(h)] + dt_bias[size_t(h)]);
      }
      gdn::DeltaBatch rule;
      rule.T = 1;
      rule.q = u.data();
      rule.k = u.data() + kd;
      rule.v = u.data() + 2 * kd;
      rule.qkv_stride = C;
      rule.g = g.data();
      rule.beta = beta.data();
      rule.gate_stride = sh.hv;
      rule.out = o.data();
      rule.out_stride = vd;
      gdn::delta_rule_reference({sh.hk, sh.hv, sh.dk, sh.dv}, rule, S.data());
      gdn::gated_rms_norm_reference(o.data(), z.data(), norm_w.data(), sh.hv, sh.dv, eps);
      // GPU.
      DevBuf<float> dx(x), dz(z), db(b), da(a);
      cuda::conv1d_silu_step(dx.p, d_conv_w.p, d_conv.p, C, K, d_u.p);
      cuda::l2_norm_rows(d_u.p, sh.hk, sh.dk, eps, q_scale);
      cuda::l2_norm_rows(d_u.p + kd, sh.hk, sh.dk, eps, 1.0f);
      cuda::delta_rule_step(d_u.p, d_u.p + kd, d_u.p + 2 * kd, db.p, da.p, d_A.p, d_dt.p, d_S.p, sh.hk, sh.hv, sh.dk,
                            sh.dv, d_o.p);
      cuda::gated_rms_norm(d_o.p, dz.p, d_norm_w.p, sh.hv, sh.dv, eps);
      const std::string what = "deltanet hk=" + std::to_string(sh.hk) + " hv=" + std::to_string(sh.hv) + " dk=" +
                               std::to_string(sh.dk) + " dv=" + std::to_string(sh.dv) + " step " + std::to_string(step);
      expect_close(d_u.get(), u, 1e-5f, 1e-5f, what + " conv/l2");
      expect_close(d_conv.get(), conv, 0.0f, 0.0f, what + " conv state");
      expect_close(d_S.get(), S, 1e-4f, 1e-5f, what + " state");
      expect_close(d_o.get(), o, 1e-4f, 1e-4f, what + " output");

      cuda::conv1d_silu_step(dx.p, d_conv_w.p, f_conv.p, C, K, f_u.p);
      cuda::l2_norm_qk(f_u.p, sh.hk, sh.dk, eps, q_scale);
      cuda::delta_rule_norm_step(f_u.p, f_u.p + kd, f_u.p + 2 * kd, db.p, da.p, d_A.p, d_dt.p, f_S.p, dz.p,
                                 d_norm_w.p, eps, sh.hk, sh.hv, sh.dk, sh.dv, f_o.p);
      expect_close(f_u.get(), u, 1e-5f, 1e-5f, what + " fused conv/l2");
      expect_close(f_conv.get(), conv, 0.0f, 0.0f, what + " fused conv state");
      expect_close(f_S.get(), S, 1e-4f, 1e-5f, what + " fused state");
      expect_close(f_o.get(), o, 1e-4f, 1e-4f, what + " fused output");

      // With its state loaded before the PDL wait: its predecessor (delta_rule_norm_step above)
      // writes other buffers, as a decode layer's projection does.
      const cuda::DeltaNetIn in{dx.p, dz.p, db.p, da.p};
      const cuda::DeltaNetSpec spec{d_conv_w.p, d_A.p, d_dt.p, d_norm_w.p, sh.hk,   sh.hv,
                                    sh.dk,      sh.dv, K,      eps,        q_scale, eps};
      const bool stepped = cuda::deltanet_step(spec, in, s_conv.p, s_S.p, s_o.p, nullptr, /*state_early=*/true);
      if (!stepped) continue;  // not sm_90: the two kernels above run instead
      expect_close(s_conv.get(), conv, 0.0f, 0.0f, what + " step conv state");
      expect_close(s_S.get(), S, 1e-4f, 1e-5f, what + " step state");
      expect_close(s_o.get(), o, 1e-4f, 1e-4f, what + " step output");
    }
  }
}

// deltanet_step_rows (a decode batch's DeltaNet step: every sequence's heads in one launch, each
// sequence's states from a table) equals deltanet_step on each sequence alone, bit for bit, over a
// few steps from random states, for batches whose blocks fit on the device at once and batches
// whose blocks do not.
TEST(CudaKernels, DeltaNetStepRowsEqualOneSequenceSteps) {
  REQUIRE_GPU();
  std::mt19937 rng(31);
  for (const DeltaShape& sh : {DeltaShape{16, 32, 128, 128, 4}, DeltaShape{2, 6, 96, 80, 4}, DeltaShape{1, 1, 256, 40, 2}}) {
    for (const int n : {1, 5, 9}) {
      const int64_t kd = int64_t(sh.hk) * sh.dk, vd = int64_t(sh.hv) * sh.dv, C = 2 * kd + vd;
      const int K = sh.K;
      const size_t conv_n = size_t((K - 1) * C), S_n = size_t(sh.hv) * sh.dk * sh.dv;
      const float q_scale = 1.0f / std::sqrt(float(sh.dk)), eps = 1e-6f;
      const std::vector<float> conv_w = randn(rng, size_t(C * K), 0.5f), norm_w = randn(rng, size_t(sh.dv), 0.3f),
                               A_log = randn(rng, size_t(sh.hv), 0.5f), dt_bias = randn(rng, size_t(sh.hv), 0.5f);
      DevBuf<float> d_conv_w(conv_w), d_norm_w(norm_w), d_A(A_log), d_dt(dt_bias);
      const cuda::DeltaNetSpec spec{d_conv_w.p, d_A.p, d_dt.p, d_norm_w.p, sh.hk,   sh.hv,
                                    sh.dk,      sh.dv, K,      eps,        q_scale, eps};
      // Each sequence's states twice: the batch's and its own.
      std::vector<std::unique_ptr<DevBuf<float>>> batch_st, own_st;
      std::vector<float*> table;
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < 2; ++c) {
          const std::vector<float> init = randn(rng, c == 0 ? conv_n : S_n, 0.3f);
          batch_st.push_back(std::make_unique<DevBuf<float>>(init));
          own_st.push_back(std::make_unique<DevBuf<float>>(init));
          table.push_back(batch_st.back()->p);
        }
      DevBuf<float*> d_table(table);
      DevBuf<float> d_o(size_t(n) * size_t(vd)), own_o(static_cast<size_t>(vd));
      const std::string what = "deltanet rows hk=" + std::to_string(sh.hk) + " hv=" + std::to_string(sh.hv) +
                               " dk=" + std::to_string(sh.dk) + " dv=" + std::to_string(sh.dv) + " n=" + std::to_string(n);
      for (int step = 0; step < 3; ++step) {
        const std::vector<float> x = randn(rng, size_t(n * C)), z = randn(rng, size_t(n * vd)),
                                 b = randn(rng, size_t(n * sh.hv)), a = randn(rng, size_t(n * sh.hv));
        DevBuf<float> dx(x), dz(z), db(b), da(a);
        const cuda::DeltaNetIn rows_in{dx.p, dz.p, db.p, da.p};
        cuda::StepRows rows;
        rows.n = n;
        rows.d_states = d_table.p;
        if (!cuda::deltanet_step_rows(spec, rows_in, rows, d_o.p)) GTEST_SKIP() << "deltanet_step_rows needs sm_90";
        const std::vector<float> o = d_o.get();
        for (int i = 0; i < n; ++i) {
          const cuda::DeltaNetIn in{dx.p + i * C, dz.p + i * vd, db.p + i * sh.hv, da.p + i * sh.hv};
          ASSERT_TRUE(cuda::deltanet_step(spec, in, own_st[size_t(2 * i)]->p, own_st[size_t(2 * i + 1)]->p, own_o.p,
                                          nullptr, /*state_early=*/false));
          const std::string who = what + " sequence " + std::to_string(i) + " step " + std::to_string(step);
          const std::vector<float> want_o = own_o.get();
          expect_close(std::vector<float>(o.begin() + i * vd, o.begin() + (i + 1) * vd), want_o, 0.0f, 0.0f,
                       who + " output");
          expect_close(batch_st[size_t(2 * i)]->get(), own_st[size_t(2 * i)]->get(), 0.0f, 0.0f, who + " conv state");
          expect_close(batch_st[size_t(2 * i + 1)]->get(), own_st[size_t(2 * i + 1)]->get(), 0.0f, 0.0f,
                       who + " state");
        }
      }
    }
  }
}

// The routed experts of one token in one launch per stage (expert_gate_up, expert_down,
// moe_combine) against per-expert reference products, experts in slots found through a table.
TEST(CudaKernels, GroupedExpertsMatchReference) {
  REQUIRE_GPU();
  std::mt19937 rng(23);
  for (int bits : {4, 8}) {
    const int64_t H = 256, I = 192;
    const int E = 6;
    std::vector<HostMatrix> gate, up, down;
    for (int e = 0; e < E; ++e) {
      gate.push_back(random_matrix(rng, WeightFormat::Affine, I, H, bits, 64, DType::BF16));
      up.push_back(random_matrix(rng, WeightFormat::Affine, I, H, bits, 64, DType::BF16));
      down.push_back(random_matrix(rng, WeightFormat::Affine, H, I, bits, 64, DType::BF16));
    }
    const size_t gb = cuda::matrix_device_bytes(gate[0].m), ub = cuda::matrix_device_bytes(up[0].m);
    const size_t slot = gb + ub + cuda::matrix_device_bytes(down[0].m);
    auto* arena = static_cast<uint8_t*>(cuda::gpu_alloc(slot * E));
    std::vector<const void*> table(E);
    cuda::ExpertLayout lay;
    for (int e = 0; e < E; ++e) {
      uint8_t* base = arena + size_t((e * 5) % E) * slot;  // slots in another order than ids
      table[size_t(e)] = base;
      lay = cuda::upload_expert_to(gate[size_t(e)].m, up[size_t(e)].m, down[size_t(e)].m, base);
    }
    const std::vector<int32_t> ids = {4, 1, 5, 0};
    const int n = int(ids.size());
    const std::vector<float> x = randn(rng, size_t(H)), w = {0.4f, 0.3f, 0.2f, 0.1f}, base = randn(rng, size_t(H));
    std::vector<float> want = base, g(static_cast<size_t>(I) + 0), u(g.size()), y(static_cast<size_t>(H) + 0);
    for (int i = 0; i < n; ++i) {
      ref::matmul(gate[size_t(ids[size_t(i)])].m, x.data(), 1, g.data());
      ref::matmul(up[size_t(ids[size_t(i)])].m, x.data(), 1, u.data());
      for (int64_t j = 0; j < I; ++j) g[size_t(j)] = ref::silu(g[size_t(j)]) * u[size_t(j)];
      ref::matmul(down[size_t(ids[size_t(i)])].m, g.data(), 1, y.data());
      for (int64_t d = 0; d < H; ++d) want[size_t(d)] += w[size_t(i)] * y[size_t(d)];
    }
    auto* d_table = static_cast<const void**>(cuda::gpu_alloc(E * sizeof(void*)));
    cuda::gpu_upload(d_table, table.data(), E * sizeof(void*));
    DevBuf<int32_t> d_ids(ids);
    DevBuf<float> dx(x), dw(w), dout(base), dg(size_t(n * I)), du(size_t(n * I)), dy(size_t(n * H));
    cuda::expert_gate_up(lay, d_table, d_ids.p, n, dx.p, dg.p, du.p);
    cuda::silu_mul(dg.p, du.p, n * I, dg.p);
    cuda::expert_down(lay, d_table, d_ids.p, n, dg.p, dy.p);
    cuda::moe_combine(dout.p, dy.p, dw.p, n, H);
    expect_close(dout.get(), want, 1e-4f, 1e-4f, "grouped experts, bits " + std::to_string(bits));
    cuda::gpu_free(d_table);
    cuda::gpu_free(arena);
  }
}

// A prompt's routed experts grouped per expert (ExpertBatch) and its MoE output with the gated
// shared expert, against the reference per (token, choice) pair. Expert 0 is every token's first
// choice, so its group spans several tiles of pairs; expert 3 is never chosen (no group).
TEST(CudaKernels, ExpertPairsMatchReference) {
  REQUIRE_GPU();
  std::mt19937 rng(29);
  for (int bits : {4, 8}) {
    for (int64_t T : {1, 13, 40}) {
      const int64_t H = 256, I = 192;
      const int E = 6, k = 3;
      std::vector<HostMatrix> gate, up, down;
      for (int e = 0; e < E; ++e) {
        gate.push_back(random_matrix(rng, WeightFormat::Affine, I, H, bits, 64, DType::BF16));
        up.push_back(random_matrix(rng, WeightFormat::Affine, I, H, bits, 64, DType::BF16));
        down.push_back(random_matrix(rng, WeightFormat::Affine, H, I, bits, 64, DType::BF16));
      }
      const cuda_test::DevExperts ex(gate, up, down, 5);
      // Choices: 0, then two distinct of {1, 2, 4, 5}.
      const int others[] = {1, 2, 4, 5};
      std::vector<int32_t> ids;
      for (int64_t t = 0; t < T; ++t) {
        ids.push_back(0);
        ids.push_back(others[t % 4]);
        ids.push_back(others[(t + 1 + t / 4) % 4]);
      }
      const cuda_test::DevWorkList wl(ids, E, k);
      const std::vector<float> x = randn(rng, size_t(T * H)), w = randn(rng, size_t(T * k), 0.3f);
      const std::vector<float> shared = randn(rng, size_t(T * H)), sg = randn(rng, size_t(T));
      const std::vector<float> h0 = randn(rng, size_t(T * H));
      std::vector<float> want = h0, g(static_cast<size_t>(I)), u(g.size()), y(static_cast<size_t>(H));
      float big = 0.0f;  // the largest term: terms of ~1e4 (8-bit codes) cancel, rounding scales with them
      for (int64_t t = 0; t < T; ++t) {
        const float sig = 1.0f / (1.0f + std::exp(-sg[size_t(t)]));
        for (int64_t d = 0; d < H; ++d) want[size_t(t * H + d)] += sig * shared[size_t(t * H + d)];
        for (int j = 0; j < k; ++j) {
          const int e = ids[size_t(t * k + j)];
          ref::matmul(gate[size_t(e)].m, x.data() + t * H, 1, g.data());
          ref::matmul(up[size_t(e)].m, x.data() + t * H, 1, u.data());
          for (int64_t i = 0; i < I; ++i) g[size_t(i)] = ref::silu(g[size_t(i)]) * u[size_t(i)];
          ref::matmul(down[size_t(e)].m, g.data(), 1, y.data());
          for (int64_t d = 0; d < H; ++d) {
            want[size_t(t * H + d)] += w[size_t(t * k + j)] * y[size_t(d)];
            big = std::max(big, std::fabs(w[size_t(t * k + j)] * y[size_t(d)]));
          }
        }
      }
      DevBuf<float> dx(x), dw(w), dsh(shared), dsg(sg), dh(h0);
      DevBuf<float> dg(size_t(T * k * I)), du(size_t(T * k * I)), dy(size_t(T * k * H));
      cuda::expert_gate_up_pairs(ex.lay, ex.d_table, wl.batch, dx.p, dg.p, du.p);
      cuda::silu_mul(dg.p, du.p, T * k * I, dg.p);
      cuda::expert_down_pairs(ex.lay, ex.d_table, wl.batch, dg.p, dy.p);
      cuda::moe_finish_rows(dh.p, dsh.p, dsg.p, dy.p, dw.p, T, k, H);
      expect_close(dh.get(), want, 1e-4f, 1e-4f + 1e-5f * big,
                   "expert pairs, bits " + std::to_string(bits) + " T=" + std::to_string(T));
    }
  }
}

TEST(CudaKernels, DequantRowMatchesReference) {
  REQUIRE_GPU();
  std::mt19937 rng(29);
  for (auto [f, bits] : {std::pair<WeightFormat, int>{WeightFormat::Affine, 4}, {WeightFormat::Affine, 8},
                         {WeightFormat::BF16, 0}, {WeightFormat::F32, 0}}) {
    HostMatrix w = random_matrix(rng, f, 37, 320, bits, 64, DType::BF16);
    void* owner = nullptr;
    const cuda::GpuMatrix g = cuda::upload_matrix(w.m, &owner);
    for (int32_t row : {0, 17, 36}) {
      std::vector<float> want(320);
      ref::dequant_row(w.m, row, want.data());
      DevBuf<float> a(size_t(320)), b(size_t(320));
      DevBuf<int32_t> d_row(std::vector<int32_t>{row});
      cuda::dequant_row(g, row, a.p);
      cuda::dequant_rows(g, d_row.p, 1, b.p);
      expect_close(a.get(), want, 1e-6f, 1e-6f, "dequant_row format " + std::to_string(int(f)));
      expect_close(b.get(), want, 1e-6f, 1e-6f, "dequant_rows (one) format " + std::to_string(int(f)));
    }
    // A prompt's lookup: rows by a device list, repeats included.
    const std::vector<int32_t> rows = {36, 0, 17, 0};
    std::vector<float> want(rows.size() * 320);
    for (size_t i = 0; i < rows.size(); ++i) ref::dequant_row(w.m, rows[i], want.data() + i * 320);
    DevBuf<int32_t> d_rows(rows);
    DevBuf<float> out(want.size());
    cuda::dequant_rows(g, d_rows.p, int64_t(rows.size()), out.p);
    expect_close(out.get(), want, 1e-6f, 1e-6f, "dequant_rows format " + std::to_string(int(f)));
    cuda::gpu_free(owner);
  }
}

// attn_prep against Forward::gated_attention's per-token loop: q/k RMSNorm + RoPE, gate copy,
// K and V into the cache row of the position (given on the host and on the device).
TEST(CudaKernels, AttnPrepMatchesReference) {
  REQUIRE_GPU();
  std::mt19937 rng(31);
  for (auto [nh, nkv, hd, rot] : {std::tuple<int, int, int, int>{16, 2, 256, 64}, {6, 2, 16, 4}, {4, 4, 48, 48}}) {
    for (bool gated : {true, false}) {
      const int64_t pos = 5, kvd = int64_t(nkv) * hd;
      const float theta = 10000.0f, eps = 1e-6f;
      const std::vector<float> P = randn(rng, size_t(nh * hd * (gated ? 2 : 1))), K = randn(rng, size_t(kvd)),
                               V = randn(rng, size_t(kvd)), qn = randn(rng, size_t(hd), 0.2f),
                               kn = randn(rng, size_t(hd), 0.2f);
      std::vector<float> cs(size_t(rot / 2)), sn(size_t(rot / 2));
      for (int i = 0; i < rot / 2; ++i) {
        const float inv = 1.0f / std::pow(theta, float(2 * i) / float(rot));
        cs[size_t(i)] = std::cos(float(pos) * inv);
        sn[size_t(i)] = std::sin(float(pos) * inv);
      }
      std::vector<float> wq(size_t(nh * hd)), wg(size_t(nh * hd)), wk(size_t((pos + 1) * kvd)), wv = wk;
      for (int j = 0; j < nh; ++j) {
        const float* src = P.data() + int64_t(j) * hd * (gated ? 2 : 1);
        ref::rms_norm(src, qn.data(), hd, eps, wq.data() + j * hd);
        ref::rope_neox(wq.data() + j * hd, rot, cs.data(), sn.data());
        if (gated) std::copy(src + hd, src + 2 * hd, wg.begin() + j * hd);
      }
      for (int j = 0; j < nkv; ++j) {
        float* kd = wk.data() + pos * kvd + j * hd;
        ref::rms_norm(K.data() + j * hd, kn.data(), hd, eps, kd);
        ref::rope_neox(kd, rot, cs.data(), sn.data());
      }
      std::copy(V.begin(), V.end(), wv.begin() + pos * kvd);
      for (bool on_device : {false, true}) {
        DevBuf<float> dP(P), dK(K), dV(V), dqn(qn), dkn(kn), dq(size_t(nh * hd)), dg(size_t(nh * hd)),
            dkc(size_t((pos + 1) * kvd)), dvc(size_t((pos + 1) * kvd));
        DevBuf<int64_t> dpos(std::vector<int64_t>{pos});
        cuda::attn_prep(dP.p, dK.p, dV.p, dqn.p, dkn.p, nh, nkv, hd, gated, rot, on_device ? 0 : pos,
                        on_device ? dpos.p : nullptr, theta, eps, dq.p, dg.p, dkc.p, dvc.p);
        const std::string what = "attn_prep hd=" + std::to_string(hd) + (gated ? " gated" : "") +
                                 (on_device ? " device pos" : "");
        expect_close(dq.get(), wq, 1e-5f, 1e-5f, what + " q");
        if (gated) expect_close(dg.get(), wg, 0.0f, 0.0f, what + " gate");
        expect_close(dkc.get(), wk, 1e-5f, 1e-5f, what + " k");
        expect_close(dvc.get(), wv, 0.0f, 0.0f, what + " v");
      }
      // attention_step: the same prep inside the attention over the earlier positions (random rows).
      std::vector<float> kc = randn(rng, size_t((pos + 1) * kvd)), vc = randn(rng, size_t((pos + 1) * kvd));
      std::copy(wk.begin() + pos * kvd, wk.end(), kc.begin() + pos * kvd);
      std::copy(wv.begin() + pos * kvd, wv.end(), vc.begin() + pos * kvd);
      const std::vector<float> want = attention_ref(wq, kc, vc, pos + 1, nh, nkv, hd, gated ? &wg : nullptr);
      // The step's three forms: the position on the host, on the device, and as the one row of a
      // decode step (position and caches through the step's tables).
      for (int form = 0; form < 3; ++form) {
        const bool on_device = form > 0;
        std::vector<float> stale_k = kc, stale_v = vc;  // row pos must be overwritten
        std::fill(stale_k.begin() + pos * kvd, stale_k.end(), 7.0f);
        std::fill(stale_v.begin() + pos * kvd, stale_v.end(), 7.0f);
        DevBuf<float> dP(P), dK(K), dV(V), dqn(qn), dkn(kn), dkc(stale_k), dvc(stale_v), dout(size_t(nh * hd));
        DevBuf<int64_t> dpos(std::vector<int64_t>{pos});
        DevBuf<float*> dcaches(std::vector<float*>{dkc.p, dvc.p});
        const cuda::AttentionSpec spec{dqn.p, dkn.p, nh, nkv, hd, rot, gated, theta, eps, 1.0f / std::sqrt(float(hd))};
        const cuda::QkvRows in{dP.p, 0, dK.p, 0, dV.p, 0};
        if (form < 2) {
          cuda::attention_step(spec, in, on_device ? 0 : pos, on_device ? dpos.p : nullptr, dkc.p, dvc.p, dout.p);
        } else {
          cuda::StepRows rows;
          rows.d_pos = dpos.p;
          rows.d_states = dcaches.p;
          cuda::attention_step_rows(spec, in, rows, dout.p, nh * hd);
        }
        const std::string what = std::string(form == 2 ? "attention_step_rows" : "attention_step") +
                                 " hd=" + std::to_string(hd) + (gated ? " gated" : "") +
                                 (on_device ? " device pos" : "");
        expect_close(dout.get(), want, 1e-4f, 1e-5f, what + " out");
        expect_close(dkc.get(), kc, 1e-5f, 1e-5f, what + " k cache");
        expect_close(dvc.get(), vc, 0.0f, 0.0f, what + " v cache");
      }
    }
  }
}

}  // namespace
}  // namespace swiftlet
