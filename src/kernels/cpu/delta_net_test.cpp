// The Gated DeltaNet kernels (model-math.md 5.2-5.6): the references by hand, and the fast forms
// on inputs beyond the random ones with which swiftlet_ops_test checks every shape and form
// against the references (kernels/ops_test.cpp).
#include "kernels/cpu/delta_net.h"

#include "kernels/cpu/ops_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace swiftlet::gdn {
namespace {

// Random but realistic inputs: unit q and k (q scaled by 1/sqrt(dk)), decays from mild to
// strong, betas in (0, 1), and a nonzero incoming state.
struct Inputs {
  DeltaShape sh;
  int64_t T;
  std::vector<float> qkv, g, beta, S0;
  int64_t stride() const { return 2 * int64_t(sh.key_heads) * sh.key_dim + int64_t(sh.value_heads) * sh.value_dim; }
  DeltaBatch batch(float* out) const {
    DeltaBatch b;
    const int64_t kd = int64_t(sh.key_heads) * sh.key_dim;
    b.T = T;
    b.q = qkv.data();
    b.k = qkv.data() + kd;
    b.v = qkv.data() + 2 * kd;
    b.qkv_stride = stride();
    b.g = g.data();
    b.beta = beta.data();
    b.gate_stride = sh.value_heads;
    b.out = out;
    b.out_stride = int64_t(sh.value_heads) * sh.value_dim;
    return b;
  }
};

Inputs make_inputs(DeltaShape sh, int64_t T, uint64_t seed) {
  Inputs in{sh, T, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  const int64_t kd = int64_t(sh.key_heads) * sh.key_dim;
  in.qkv.resize(size_t(T * in.stride()));
  for (float& x : in.qkv) x = nd(rng);
  for (int64_t t = 0; t < T; ++t) {
    float* row = in.qkv.data() + t * in.stride();
    for (int h = 0; h < sh.key_heads; ++h) {
      ref::l2_norm_scaled(row + h * sh.key_dim, sh.key_dim, 1e-6f, 1.0f / std::sqrt(float(sh.key_dim)));
      ref::l2_norm_scaled(row + kd + h * sh.key_dim, sh.key_dim, 1e-6f, 1.0f);
    }
  }
  in.g.resize(size_t(T * sh.value_heads));
  in.beta.resize(in.g.size());
  for (size_t i = 0; i < in.g.size(); ++i) {
    in.g[i] = -std::exp(-1.0f + 0.5f * nd(rng)) * ref::softplus(2.0f * nd(rng));
    in.beta[i] = ref::sigmoid(nd(rng));
  }
  in.S0.resize(size_t(sh.value_heads) * sh.key_dim * sh.value_dim);
  for (float& x : in.S0) x = 0.3f * nd(rng);
  return in;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, double(std::fabs(got[i] - want[i])));
    den = std::max(den, double(std::fabs(want[i])));
  }
  return num / std::max(den, 1e-30);
}

const DeltaShape kReal{2, 4, 128, 128};  // the real head sizes, fewer heads

TEST(DeltaNet, ChunkedWithStrongDecayStaysFinite) {
  // Cumulative log decays far below float's exp range inside one chunk: the masked exponentials
  // must neither overflow nor turn into NaN.
  Inputs in = make_inputs(kReal, 130, 3);
  for (float& g : in.g) g = -30.0f;
  std::vector<float> want(size_t(130 * 4 * 128)), got(want.size()), Sw = in.S0, Sg = in.S0;
  delta_rule_reference(kReal, in.batch(want.data()), Sw.data());
  delta_rule_chunked(kReal, in.batch(got.data()), Sg.data());
  EXPECT_LT(rel_err(got, want), 1e-4);
  EXPECT_LT(rel_err(Sg, Sw), 1e-4);
}

TEST(DeltaNet, ConvSiluMatchesScalar) {
  for (int64_t C : {64, 77})
    for (int64_t T : {1, 2, 5}) {
      std::mt19937_64 rng(uint64_t(C * 10 + T));
      std::normal_distribution<float> nd;
      const int K = 4;
      std::vector<float> x(size_t(T * C)), w(size_t(C * K)), state(size_t((K - 1) * C));
      for (auto* v : {&x, &w, &state})
        for (float& e : *v) e = nd(rng);
      // Expected: the reference over the whole call, and token by token (as decode feeds it).
      std::vector<float> st = state, want = x;
      conv_silu_reference(want.data(), T, C, w.data(), K, st.data());
      std::vector<float> st1 = state, want1 = x;
      for (int64_t t = 0; t < T; ++t) conv_silu_reference(want1.data() + t * C, 1, C, w.data(), K, st1.data());
      EXPECT_EQ(want1, want);
      EXPECT_EQ(st1, st);
      // By hand at one channel of the last token: w . [state rows | x row], then SiLU.
      {
        std::vector<float> raw(size_t((K - 1 + T) * C));
        std::copy(state.begin(), state.end(), raw.begin());
        std::copy(x.begin(), x.end(), raw.begin() + (K - 1) * C);
        const int64_t t = T - 1, c = C - 1;
        double acc = 0;
        for (int j = 0; j < K; ++j) acc += double(w[size_t(c * K + j)]) * raw[size_t((t + j) * C + c)];
        const double silu = acc / (1 + std::exp(-acc));
        EXPECT_NEAR(want[size_t(t * C + c)], silu, 1e-5 * (1 + std::fabs(silu)));
      }
      conv_silu(x.data(), T, C, w.data(), K, state.data());
      EXPECT_LT(rel_err(x, want), 1e-6) << C << " " << T;
      EXPECT_EQ(state, st);
    }
}

TEST(DeltaNet, NormsMatchScalar) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd;
  const int heads = 3, n = 20;
  std::vector<float> x(heads * n), z(heads * n), w(n);
  for (auto* v : {&x, &z, &w})
    for (float& e : *v) e = nd(rng);
  std::vector<float> a = x, b = x;
  l2_norm_heads(a.data(), heads, n, 1e-6f, 0.5f);
  l2_norm_heads_reference(b.data(), heads, n, 1e-6f, 0.5f);
  EXPECT_LT(rel_err(a, b), 1e-6);
  // Each head of the reference has norm 0.5.
  for (int h = 0; h < heads; ++h) {
    double ss = 0;
    for (int j = 0; j < n; ++j) ss += double(b[size_t(h * n + j)]) * b[size_t(h * n + j)];
    EXPECT_NEAR(std::sqrt(ss), 0.5, 1e-5);
  }
  a = x, b = x;
  gated_rms_norm(a.data(), z.data(), w.data(), heads, n, 1e-6f);
  gated_rms_norm_reference(b.data(), z.data(), w.data(), heads, n, 1e-6f);
  EXPECT_LT(rel_err(a, b), 1e-6);
  // By hand at one element: w * x / rms(x) * SiLU(z).
  {
    const int h = 1, j = 7;
    double ms = 0;
    for (int i = 0; i < n; ++i) ms += double(x[size_t(h * n + i)]) * x[size_t(h * n + i)];
    const double rms = std::sqrt(ms / n + 1e-6), zz = z[size_t(h * n + j)];
    const double want = w[size_t(j)] * x[size_t(h * n + j)] / rms * (zz / (1 + std::exp(-zz)));
    EXPECT_NEAR(b[size_t(h * n + j)], want, 1e-5 * (1 + std::fabs(want)));
  }
}

}  // namespace
}  // namespace swiftlet::gdn
