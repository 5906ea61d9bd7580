// The attention kernels' properties beyond matching the scalar loop (which swiftlet_ops_test
// checks at every shape and form, kernels/ops_test.cpp).
#include "kernels/cpu/attention.h"

#include "kernels/cpu/ops_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace swiftlet::attn {
namespace {

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
