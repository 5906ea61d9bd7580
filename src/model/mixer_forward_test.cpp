// The fast token mixers inside the forward pass: a prompt longer than one DeltaNet chunk (64)
// prefilled in one call (chunked delta rule, batched attention) must give the logits and the
// session state of the same prompt decoded token by token (fused recurrent step), and of the
// scalar reference backend.
#include "model/qwen3_hybrid.h"

#include "runtime/model_loader.h"
#include "support/test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>

namespace swiftlet {
namespace {

using swiftlet::testing::fixture_dir;

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    num = std::max(num, double(std::fabs(got[i] - want[i])));
    den = std::max(den, double(std::fabs(want[i])));
  }
  return num / std::max(den, 1e-30);
}

void expect_same_state(const SessionState& a, const SessionState& b, double tol, const std::string& what) {
  ASSERT_EQ(a.layers.size(), b.layers.size());
  EXPECT_EQ(a.pos, b.pos);
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerState &x = a.layers[l], &y = b.layers[l];
    EXPECT_LT(rel_err(x.k, y.k), tol) << what << " layer " << l << " k";
    EXPECT_LT(rel_err(x.v, y.v), tol) << what << " layer " << l << " v";
    EXPECT_LT(rel_err(x.conv, y.conv), tol) << what << " layer " << l << " conv";
    EXPECT_LT(rel_err(x.ssm, y.ssm), tol) << what << " layer " << l << " ssm";
  }
}

struct Case {
  std::string fixture;
  bool chunked;  // DeltaNet prefill in chunks (else the fused recurrence, as decode)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture << (c.chunked ? " chunked" : " recurrent"); }

class MixerForward : public ::testing::TestWithParam<Case> {};

TEST_P(MixerForward, PrefillEqualsTokenByTokenDecode) {
  auto lm = load_model(fixture_dir(GetParam().fixture));
  const ModelConfig& c = lm->model.config;
  // 150 tokens: two full DeltaNet chunks and a partial one.
  std::mt19937_64 rng(11);
  std::vector<int32_t> prompt(150);
  for (int32_t& id : prompt) id = int32_t(rng() % uint64_t(c.vocab_size));

  Forward fast(lm->model, Backend::CpuF32);
  fast.set_chunked_prefill(GetParam().chunked);
  SessionState pre = SessionState::create(c);
  std::vector<float> prefill, row, decode;
  fast.run(pre, prompt, LogitsMode::All, prefill);

  SessionState dec = SessionState::create(c);
  for (int32_t id : prompt) {
    fast.run(dec, std::span(&id, 1), LogitsMode::Last, row);
    decode.insert(decode.end(), row.begin(), row.end());
  }
  EXPECT_LT(rel_err(prefill, decode), 1e-4) << "prefill vs token-by-token decode";
  expect_same_state(pre, dec, 1e-4, "prefill vs decode");

  // And both against the scalar oracle's prefill.
  Forward oracle(lm->model, Backend::Reference);
  SessionState ref_st = SessionState::create(c);
  std::vector<float> want;
  oracle.run(ref_st, prompt, LogitsMode::All, want);
  EXPECT_LT(rel_err(prefill, want), 1e-4) << "cpu-f32 prefill vs reference";
  expect_same_state(pre, ref_st, 1e-4, "cpu-f32 vs reference");

  // A second prompt on top of the first (state passing into the chunked form).
  std::vector<int32_t> more(70);
  for (int32_t& id : more) id = int32_t(rng() % uint64_t(c.vocab_size));
  fast.run(pre, more, LogitsMode::All, prefill);
  oracle.run(ref_st, more, LogitsMode::All, want);
  EXPECT_LT(rel_err(prefill, want), 1e-4) << "continued prefill vs reference";
  expect_same_state(pre, ref_st, 1e-4, "continued prefill");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MixerForward,
                         ::testing::Values(Case{"next_8l", true}, Case{"q35_text_tied", true},
                                           Case{"next_8l", false}, Case{"q35_text_tied", false}),
                         [](const auto& info) {
                           return info.param.fixture + (info.param.chunked ? "_chunked" : "_recurrent");
                         });

}  // namespace
}  // namespace swiftlet
