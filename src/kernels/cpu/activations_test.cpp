// The fast SwiGLU product against the scalar oracle.
#include "kernels/cpu/activations.h"

#include "kernels/cpu/ops_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace swiftlet::act {
namespace {

std::vector<float> random_values(int64_t n, float range, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-range, range);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

TEST(Activations, SiluMulMatchesScalarOnRaggedLengths) {
  for (int64_t n : {1, 7, 8, 9, 63, 512, 1027}) {
    const std::vector<float> g = random_values(n, 12.0f, uint32_t(n)), u = random_values(n, 3.0f, uint32_t(n + 1));
    std::vector<float> fast = g, slow = g;
    silu_mul(fast.data(), u.data(), n);
    silu_mul_reference(slow.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float want = g[size_t(i)] / (1.0f + std::exp(-g[size_t(i)])) * u[size_t(i)];
      EXPECT_NEAR(slow[size_t(i)], want, 1e-6f * (1 + std::fabs(want))) << "n " << n << " i " << i;
      EXPECT_NEAR(fast[size_t(i)], want, 2e-6f * (1 + std::fabs(want))) << "n " << n << " i " << i;
    }
  }
}

TEST(Activations, SiluMulExtremesStayFinite) {
  const std::vector<float> g = {-1000.0f, -90.0f, -20.0f, 0.0f, 20.0f, 90.0f, 1000.0f, -0.0f, 1e-30f};
  const std::vector<float> u(g.size(), 2.0f);
  std::vector<float> fast = g;
  silu_mul(fast.data(), u.data(), int64_t(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(std::isfinite(fast[i])) << g[i];
    EXPECT_NEAR(fast[i], 2.0f * ref::silu(g[i]), 1e-5f * (1 + std::fabs(2.0f * g[i]))) << g[i];
  }
}

// An element's result does not depend on where it sits (the tail takes the vector path too),
// so a token gets the same bits in a batch as alone.
TEST(Activations, SiluMulResultIndependentOfPosition) {
  const std::vector<float> g = random_values(37, 8.0f, 5), u = random_values(37, 2.0f, 6);
  std::vector<float> whole = g;
  silu_mul(whole.data(), u.data(), 37);
  for (int64_t start : {0, 3, 29, 36}) {
    std::vector<float> part(g.begin() + start, g.end());
    silu_mul(part.data(), u.data() + start, 37 - start);
    for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], whole[size_t(start) + i]) << start << " " << i;
  }
}

}  // namespace
}  // namespace swiftlet::act
