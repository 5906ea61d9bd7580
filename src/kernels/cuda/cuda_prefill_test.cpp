// The T-token token-mixer kernels (attention.cu, deltanet.cu, norms.cu) against their one-token
// forms run T times in order on a copy of the same state: outputs and final states must agree.
// Random ragged shapes (T = 1, 7, 33; widths off multiples of 32; inputs that are columns of wider
// rows). Skips where no usable GPU is present (CI), saying why.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace swiftlet {
namespace {

using Dev = cuda_test::DevBuf<float>;
using cuda_test::randn;

// batched ~ steps within atol + rtol |steps|; reports the first miss.
void expect_match(const Dev& batched, const Dev& steps, const std::string& what, float rtol = 1e-4f,
                  float atol = 1e-5f) {
  cuda_test::expect_close(batched.get(), steps.get(), rtol, atol, what);
}

std::string tag(const char* name, std::initializer_list<int64_t> v) {
  std::string s = name;
  for (int64_t x : v) {
    s += ' ';
    s += std::to_string(x);
  }
  return s;
}

const int64_t kTs[] = {1, 7, 33};

TEST(CudaPrefill, ConvScanMatchesSteps) {
  REQUIRE_GPU();
  std::mt19937 rng(101);
  for (auto [C, K] : {std::pair<int64_t, int>{37, 4}, {300, 4}, {1000, 2}, {96, 3}}) {
    for (int64_t T : kTs) {
      const int64_t xs = C + 5, us = C + 3;  // inputs and outputs as columns of wider rows
      const std::vector<float> x = randn(rng, size_t(T * xs)), w = randn(rng, size_t(C * K), 0.5f),
                               state0 = randn(rng, size_t((K - 1) * C));
      Dev dx(x), dw(w), st_b(state0), st_s(state0), u_b(size_t(T * us)), u_s(size_t(T * us));
      cuda::conv1d_silu_scan(dx.p, xs, dw.p, st_b.p, C, K, T, u_b.p, us);
      for (int64_t t = 0; t < T; ++t) cuda::conv1d_silu_step(dx.p + t * xs, dw.p, st_s.p, C, K, u_s.p + t * us);
      const std::string what = tag("conv C K T", {C, K, T});
      expect_match(u_b, u_s, what + " u");
      expect_match(st_b, st_s, what + " state", 0.0f, 0.0f);
    }
  }
}

TEST(CudaPrefill, L2NormQkRows) {
  REQUIRE_GPU();
  std::mt19937 rng(102);
  for (auto [hk, n] : {std::pair<int, int64_t>{2, 128}, {1, 64}, {3, 40}}) {
    for (int64_t T : kTs) {
      const int64_t stride = 2 * hk * n + 17;  // q/k heads followed by other columns (v)
      const float eps = 1e-6f, q_scale = 1.0f / std::sqrt(float(n));
      const std::vector<float> x = randn(rng, size_t(T * stride));
      Dev xb(x), xs(x);
      cuda::l2_norm_qk_rows(xb.p, T, stride, hk, n, eps, q_scale);
      for (int64_t t = 0; t < T; ++t) cuda::l2_norm_qk(xs.p + t * stride, hk, n, eps, q_scale);
      expect_match(xb, xs, tag("l2_norm_qk hk n T", {hk, n, T}));
    }
  }
}

struct Delta {
  int hk, hv, dk, dv;
};

// Random DeltaNet inputs for T tokens of shape d: u rows of q|k|v columns (and 3 spare), b|a
// rows, z, the heads' decay parameters, the norm weight and a starting state. q and k are
// L2-normalised (q scaled) as the DeltaNet feeds them, so the state stays bounded.
struct DeltaInputs {
  static constexpr float kEps = 1e-6f;
  int64_t kd, vd, qs, bs;
  std::vector<float> u, ba, z, A_log, dt_bias, norm_w, S0;
  DeltaInputs(std::mt19937& rng, const Delta& d, int64_t T)
      : kd(int64_t(d.hk) * d.dk), vd(int64_t(d.hv) * d.dv), qs(2 * kd + vd + 3), bs(2 * d.hv) {
    const float q_scale = 1.0f / std::sqrt(float(d.dk));
    u = randn(rng, size_t(T * qs));
    for (int64_t t = 0; t < T; ++t)
      for (int i = 0; i < 2 * d.hk; ++i) {
        float* x = u.data() + t * qs + int64_t(i) * d.dk;
        float ss = 0.0f;
        for (int c = 0; c < d.dk; ++c) ss += x[c] * x[c];
        const float inv = 1.0f / std::sqrt(ss + kEps) * (i < d.hk ? q_scale : 1.0f);
        for (int c = 0; c < d.dk; ++c) x[c] *= inv;
      }
    ba = randn(rng, size_t(T * bs));
    z = randn(rng, size_t(T * vd));
    A_log = randn(rng, size_t(d.hv), 0.5f);
    dt_bias = randn(rng, size_t(d.hv), 0.5f);
    norm_w = randn(rng, size_t(d.dv), 0.3f);
    S0 = randn(rng, size_t(d.hv) * d.dk * d.dv, 0.1f);
  }
};

// DeltaInputs on the device, and the views the kernels take: q, k and v columns of u, b and a of
// ba, the layer's spec (the norm's eps; no conv).
struct DeltaOnDevice {
  Dev u, ba, z, A_log, dt_bias, norm_w;
  const float *q, *k, *v, *b, *a;
  cuda::DeltaNetSpec spec;
  DeltaOnDevice(const DeltaInputs& in, const Delta& d)
      : u(in.u),
        ba(in.ba),
        z(in.z),
        A_log(in.A_log),
        dt_bias(in.dt_bias),
        norm_w(in.norm_w),
        q(u.p),
        k(u.p + in.kd),
        v(u.p + 2 * in.kd),
        b(ba.p),
        a(ba.p + d.hv),
        spec{nullptr, A_log.p, dt_bias.p, norm_w.p, d.hk, d.hv, d.dk, d.dv, 0, 0.0f, 0.0f, DeltaInputs::kEps} {}
};

TEST(CudaPrefill, DeltaRuleScanMatchesSteps) {
  REQUIRE_GPU();
  std::mt19937 rng(104);
  for (const Delta& d : {Delta{2, 4, 128, 128}, Delta{1, 2, 64, 80}, Delta{3, 6, 64, 40}, Delta{2, 4, 256, 24}}) {
    for (int64_t T : kTs) {
      const DeltaInputs in(rng, d, T);
      const int64_t vd = in.vd, qs = in.qs, bs = in.bs;
      const float eps = DeltaInputs::kEps;
      const std::vector<float>& S0 = in.S0;
      const DeltaOnDevice g(in, d);
      const std::string what = tag("delta rule hk hv dk dv T", {d.hk, d.hv, d.dk, d.dv, T});
      {
        Dev S_b(S0), S_s(S0), o_b(size_t(T * vd)), o_s(size_t(T * vd));
        cuda::delta_rule_scan(g.q, g.k, g.v, qs, g.b, g.a, bs, g.A_log.p, g.dt_bias.p, S_b.p, d.hk, d.hv, d.dk, d.dv, T,
                              o_b.p);
        for (int64_t t = 0; t < T; ++t)
          cuda::delta_rule_step(g.q + t * qs, g.k + t * qs, g.v + t * qs, g.b + t * bs, g.a + t * bs, g.A_log.p,
                                g.dt_bias.p, S_s.p, d.hk, d.hv, d.dk, d.dv, o_s.p + t * vd);
        expect_match(o_b, o_s, what + " o");
        expect_match(S_b, S_s, what + " state");
      }
      {
        // with the gated RMSNorm, against the fused one-token step; without a work buffer
        // delta_rule_norm_scan scans (the chunked form: DeltaRuleChunkedMatchesSteps)
        Dev S_b(S0), S_s(S0), o_b(size_t(T * vd)), o_s(size_t(T * vd));
        cuda::delta_rule_norm_scan(g.spec, g.u.p, qs, g.b, g.a, bs, S_b.p, g.z.p, T, o_b.p);
        for (int64_t t = 0; t < T; ++t)
          cuda::delta_rule_norm_step(g.q + t * qs, g.k + t * qs, g.v + t * qs, g.b + t * bs, g.a + t * bs, g.A_log.p,
                                     g.dt_bias.p, S_s.p, g.z.p + t * vd, g.norm_w.p, eps, d.hk, d.hv, d.dk, d.dv,
                                     o_s.p + t * vd);
        expect_match(o_b, o_s, what + " normed o");
        expect_match(S_b, S_s, what + " normed state");
      }
    }
  }
}

// ||got - want|| / ||want|| over the whole buffer.
double rel_err(const Dev& got, const Dev& want) {
  const std::vector<float> g = got.get(), w = want.get();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    num += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
    den += double(w[i]) * w[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The chunked (WY) form against T one-token steps: equal up to float rounding (the CPU's
// delta_rule_chunked test uses the same measure and bound), chunks whole and partial, several
// chunks carrying the state, and through delta_rule_norm_scan, which takes it from 16 tokens.
TEST(CudaPrefill, DeltaRuleChunkedMatchesSteps) {
  REQUIRE_GPU();
  std::mt19937 rng(105);
  for (const Delta& d : {Delta{2, 4, 128, 128}, Delta{1, 2, 64, 64}, Delta{3, 6, 32, 96}}) {
    if (!cuda::delta_rule_chunked_takes(d.dk, d.dv)) {  // dk 128 needs 142 KB of shared memory a block
      ASSERT_EQ(d.dk, 128) << "every other shape here fits any sm_80+ device";
      continue;
    }
    for (int64_t T : {1, 16, 64, 65, 150}) {
      const DeltaInputs in(rng, d, T);
      const int64_t vd = in.vd, qs = in.qs, bs = in.bs;
      const float eps = DeltaInputs::kEps;
      const std::vector<float>& S0 = in.S0;
      const DeltaOnDevice g(in, d);
      const std::string what = tag("chunked delta rule hk hv dk dv T", {d.hk, d.hv, d.dk, d.dv, T});
      Dev S_c(S0), S_s(S0), o_c(size_t(T * vd)), o_s(size_t(T * vd));
      Dev work(size_t(cuda::delta_rule_chunked_work_floats(T, d.hv, d.dk, d.dv)));
      cuda::delta_rule_chunked(g.q, g.k, g.v, qs, g.b, g.a, bs, g.A_log.p, g.dt_bias.p, S_c.p, d.hk, d.hv, d.dk, d.dv,
                               T, work.p, o_c.p);
      for (int64_t t = 0; t < T; ++t)
        cuda::delta_rule_step(g.q + t * qs, g.k + t * qs, g.v + t * qs, g.b + t * bs, g.a + t * bs, g.A_log.p,
                              g.dt_bias.p, S_s.p, d.hk, d.hv, d.dk, d.dv, o_s.p + t * vd);
      EXPECT_LT(rel_err(o_c, o_s), 1e-4) << what << " o";
      EXPECT_LT(rel_err(S_c, S_s), 1e-4) << what << " state";
      // A second call continues from the state the first left.
      Dev o_c2(size_t(T * vd)), o_s2(size_t(T * vd));
      cuda::delta_rule_chunked(g.q, g.k, g.v, qs, g.b, g.a, bs, g.A_log.p, g.dt_bias.p, S_c.p, d.hk, d.hv, d.dk, d.dv,
                               T, work.p, o_c2.p);
      for (int64_t t = 0; t < T; ++t)
        cuda::delta_rule_step(g.q + t * qs, g.k + t * qs, g.v + t * qs, g.b + t * bs, g.a + t * bs, g.A_log.p,
                              g.dt_bias.p, S_s.p, d.hk, d.hv, d.dk, d.dv, o_s2.p + t * vd);
      EXPECT_LT(rel_err(o_c2, o_s2), 1e-4) << what << " o, second call";
      // The normed form picks the chunks from 16 tokens on.
      Dev S_n(S0), S_m(S0), o_n(size_t(T * vd)), o_m(size_t(T * vd));
      cuda::delta_rule_norm_scan(g.spec, g.u.p, qs, g.b, g.a, bs, S_n.p, g.z.p, T, o_n.p, work.p);
      for (int64_t t = 0; t < T; ++t)
        cuda::delta_rule_norm_step(g.q + t * qs, g.k + t * qs, g.v + t * qs, g.b + t * bs, g.a + t * bs, g.A_log.p,
                                   g.dt_bias.p, S_m.p, g.z.p + t * vd, g.norm_w.p, eps, d.hk, d.hv, d.dk, d.dv,
                                   o_m.p + t * vd);
      EXPECT_LT(rel_err(o_n, o_m), 1e-4) << what << " normed o";
      EXPECT_LT(rel_err(S_n, S_m), 1e-4) << what << " normed state";
    }
  }
  EXPECT_FALSE(cuda::delta_rule_chunked_takes(256, 128));
  EXPECT_FALSE(cuda::delta_rule_chunked_takes(128, 40));
  EXPECT_FALSE(cuda::delta_rule_chunked_takes(66, 128));
}

TEST(CudaPrefill, AttnPrepRowsAndAttentionPrefillMatchDecode) {
  REQUIRE_GPU();
  std::mt19937 rng(105);
  // head_dim 130: not a multiple of 4 (4-byte copies into the tiles, padded to 256)
  for (auto [nh, nkv, hd, rot] :
       {std::tuple<int, int, int, int>{8, 2, 256, 64}, {4, 2, 64, 64}, {6, 3, 48, 16}, {2, 1, 130, 32}}) {
    for (bool gated : {true, false}) {
      for (int64_t pos0 : {0, 5, 40}) {
        // the tiled form from 16 tokens, in tiles of 64 queries and 32 keys: one tile, a ragged
        // second, a third
        for (int64_t T : {int64_t(1), int64_t(7), int64_t(33), int64_t(64), int64_t(65), int64_t(100), int64_t(130)}) {
          const int64_t qd = int64_t(nh) * hd, kvd = int64_t(nkv) * hd, pw = qd * (gated ? 2 : 1);
          const int64_t rs = pw + 2 * kvd + 3;  // one row [P | K | V | pad] per token
          const int64_t n_rows = pos0 + T + 2;  // cache rows; the last two stay untouched
          const float theta = 10000.0f, eps = 1e-6f, scale = 1.0f / std::sqrt(float(hd));
          const std::vector<float> X = randn(rng, size_t(T * rs)), qn = randn(rng, size_t(hd), 0.2f),
                                   kn = randn(rng, size_t(hd), 0.2f);
          // Earlier positions already filled (a prompt continued after earlier tokens).
          std::vector<float> kc0 = randn(rng, size_t(n_rows * kvd)), vc0 = randn(rng, size_t(n_rows * kvd));
          Dev dX(X), dqn(qn), dkn(kn);
          Dev kc_b(kc0), vc_b(vc0), q_b(size_t(T * qd)), g_b(size_t(T * qd)), o_b(size_t(T * qd));
          Dev kc_s(kc0), vc_s(vc0), q_s(size_t(T * qd)), g_s(size_t(T * qd)), o_s(size_t(T * qd));
          const float *P = dX.p, *Kp = dX.p + pw, *Vp = dX.p + pw + kvd;
          const cuda::AttentionSpec spec{dqn.p, dkn.p, nh, nkv, hd, rot, gated, theta, eps, scale};
          cuda::attn_prep_rows(spec, {P, rs, Kp, rs, Vp, rs}, pos0, T, q_b.p, g_b.p, kc_b.p, vc_b.p);
          cuda::attention_prefill(spec, q_b.p, g_b.p, kc_b.p, vc_b.p, pos0, T, o_b.p);
          for (int64_t t = 0; t < T; ++t) {
            cuda::attn_prep(P + t * rs, Kp + t * rs, Vp + t * rs, dqn.p, dkn.p, nh, nkv, hd, gated, rot, pos0 + t,
                            nullptr, theta, eps, q_s.p + t * qd, g_s.p + t * qd, kc_s.p, vc_s.p);
            cuda::attention_decode(q_s.p + t * qd, kc_s.p, vc_s.p, pos0 + t + 1, nh, nkv, hd, scale,
                                   gated ? g_s.p + t * qd : nullptr, o_s.p + t * qd);
          }
          const std::string what =
              tag("attention nh nkv hd rot gated pos0 T", {nh, nkv, hd, rot, gated ? 1 : 0, pos0, T});
          expect_match(q_b, q_s, what + " q");
          expect_match(g_b, g_s, what + " gate", 0.0f, 0.0f);
          expect_match(kc_b, kc_s, what + " k cache");
          expect_match(vc_b, vc_s, what + " v cache", 0.0f, 0.0f);
          expect_match(o_b, o_s, what + " out");
        }
      }
    }
  }
}

}  // namespace
}  // namespace swiftlet
