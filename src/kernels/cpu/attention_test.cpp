// The AVX2 attention against the scalar double-precision loop.
#include "kernels/cpu/attention.h"

#include "kernels/cpu/ops_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace swiftlet::attn {
namespace {

void check(AttnShape sh, int64_t pos0, int64_t T) {
  std::mt19937_64 rng(uint64_t(pos0 * 31 + T + sh.heads));
  std::normal_distribution<float> nd;
  const int64_t qs = int64_t(sh.heads) * sh.head_dim, kvs = int64_t(sh.kv_heads) * sh.head_dim;
  const int64_t n = pos0 + T;
  std::vector<float> q(size_t(T * qs)), K(size_t(n * kvs)), V(size_t(n * kvs));
  for (auto* v : {&q, &K, &V})
    for (float& e : *v) e = 2.0f * nd(rng);  // peaked softmaxes as well as flat ones
  std::vector<float> want(q.size()), got(q.size());
  AttnBatch b{T, pos0, q.data(), qs, K.data(), V.data(), kvs, 1.0f / std::sqrt(float(sh.head_dim)), want.data(), qs};
  attend_reference(sh, b);
  b.out = got.data();
  attend(sh, b);
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want[i])));
  EXPECT_LT(worst, 5e-5) << sh.heads << "/" << sh.kv_heads << "x" << sh.head_dim << " pos0 " << pos0 << " T " << T;
}

TEST(Attention, MatchesScalarLoop) {
  for (AttnShape sh : {AttnShape{16, 2, 256}, AttnShape{4, 2, 32}, AttnShape{16, 1, 64}, AttnShape{6, 2, 24}})
    for (auto [pos0, T] : {std::pair<int64_t, int64_t>{0, 1}, {0, 7}, {37, 1}, {100, 3}, {1000, 1}, {3000, 1}})
      check(sh, pos0, T);
}

TEST(Attention, PrefillRowsEqualDecodedRowsExactly) {
  // Prefix reuse relies on it: a row gives the same bits whether it was prefilled with others
  // or decoded alone (including contexts long enough to be split over threads).
  const AttnShape sh{16, 2, 64};
  const int64_t pos0 = 1500, T = 40, qs = 16 * 64, kvs = 2 * 64;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd;
  std::vector<float> q(size_t(T * qs)), K(size_t((pos0 + T) * kvs)), V(K.size());
  for (auto* v : {&q, &K, &V})
    for (float& e : *v) e = nd(rng);
  std::vector<float> pre(q.size()), dec(q.size());
  attend(sh, {T, pos0, q.data(), qs, K.data(), V.data(), kvs, 0.125f, pre.data(), qs});
  for (int64_t t = 0; t < T; ++t)
    attend(sh, {1, pos0 + t, q.data() + t * qs, qs, K.data(), V.data(), kvs, 0.125f, dec.data() + t * qs, qs});
  EXPECT_EQ(pre, dec);
}

TEST(Attention, SigmoidGate) {
  std::vector<float> o(37), g(37), want(37);
  for (int i = 0; i < 37; ++i) {
    o[size_t(i)] = float(i) - 18.0f;
    g[size_t(i)] = 0.7f * float(i) - 12.0f;
    want[size_t(i)] = o[size_t(i)] * ref::sigmoid(g[size_t(i)]);
  }
  std::vector<float> r = o;
  sigmoid_gate_reference(r.data(), g.data(), 37);
  sigmoid_gate(o.data(), g.data(), 37);
  for (int i = 0; i < 37; ++i) EXPECT_NEAR(r[size_t(i)], want[size_t(i)], 1e-6f * (1 + std::fabs(want[size_t(i)])));
  for (int i = 0; i < 37; ++i) EXPECT_NEAR(o[size_t(i)], want[size_t(i)], 1e-5f * (1 + std::fabs(want[size_t(i)])));
}

}  // namespace
}  // namespace swiftlet::attn
