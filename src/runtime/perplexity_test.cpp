// Perplexity arithmetic on hand-worked distributions, and the saved log-probabilities file.
#include "runtime/perplexity.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include <unistd.h>

namespace swiftlet {
namespace {

TEST(Perplexity, WindowsScoreTheirSecondHalf) {
  // ctx 512: rows 256 .. 510 (row 511 would predict the token after the window): 255 tokens.
  EXPECT_EQ(first_scored(512), 256);
  EXPECT_EQ(scored_per_window(512), 255);
  EXPECT_EQ(scored_per_window(5), 2);  // rows 2 and 3
}

TEST(Perplexity, NllByHand) {
  // logits [0, ln 3]: p = [1/4, 3/4].
  const std::vector<float> row = {0.0f, std::log(3.0f)};
  EXPECT_NEAR(token_nll(row, 0), std::log(4.0), 1e-7);
  EXPECT_NEAR(token_nll(row, 1), std::log(4.0 / 3.0), 1e-7);
  // Shifting every logit changes nothing; a huge offset does not overflow.
  const std::vector<float> shifted = {1000.0f, 1000.0f + std::log(3.0f)};
  EXPECT_NEAR(token_nll(shifted, 0), std::log(4.0), 1e-4);
}

TEST(Perplexity, StandardErrorByHand) {
  // x = 1, 2, 3: mean 2, mean of squares 14/3, variance 2/3, stderr sqrt((2/3) / 2) = sqrt(1/3).
  MeanStat s;
  for (double x : {1.0, 2.0, 3.0}) s.add(x);
  EXPECT_DOUBLE_EQ(s.mean(), 2.0);
  EXPECT_NEAR(s.stderr_of_mean(), std::sqrt(1.0 / 3.0), 1e-12);
}

TEST(Perplexity, KlByHand) {
  // P = [1/2, 1/2], Q = [1/4, 3/4]: KL = 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3).
  const std::vector<double> log_p = {std::log(0.5), std::log(0.5)};
  const std::vector<float> q = {0.0f, std::log(3.0f)};
  EXPECT_NEAR(kl_divergence(log_p, q), 0.5 * std::log(4.0 / 3.0), 1e-7);
  const std::vector<float> same = {5.0f, 5.0f};
  EXPECT_NEAR(kl_divergence(log_p, same), 0.0, 1e-12);
}

TEST(Perplexity, QuantisedLogProbsKeepTheDistribution) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 4.0f);
  std::vector<float> logits(151669);
  for (float& x : logits) x = n(rng);
  logits[1234] = 30.0f;  // a clear favourite
  QuantizedLogProbs q;
  quantize_log_probs(logits, q);
  EXPECT_EQ(q.argmax, 1234u);
  std::vector<double> log_p;
  dequantize_log_probs(q, log_p);
  // Within half a step (40 nats / 65535 / 2 = 3.1e-4) of the exact log-probabilities, wherever
  // they are inside the stored range; the KL of the two is tiny.
  const double lse = log_sum_exp(logits);
  const double step = (double(q.hi) - double(q.lo)) / 65535.0;
  for (size_t i = 0; i < logits.size(); i += 97) {
    if (double(logits[i]) - lse <= double(q.lo)) continue;
    EXPECT_NEAR(log_p[i], double(logits[i]) - lse, step) << i;
  }
  EXPECT_LT(kl_divergence(log_p, logits), 1e-6);
  // A flat distribution (hi == lo) survives.
  std::vector<float> flat(10, 2.0f);
  quantize_log_probs(flat, q);
  dequantize_log_probs(q, log_p);
  for (double v : log_p) EXPECT_NEAR(v, std::log(0.1), 1e-12);
}

TEST(Perplexity, LogProbFileRoundTrips) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("swiftlet_logprobs" + std::to_string(::getpid()))).string();
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  LogProbFileInfo info;
  info.vocab = 3;
  info.ctx = 4;
  info.windows = 1;
  info.scored = 2;
  info.tokens_hash = tokens_hash(tokens);
  EXPECT_NE(info.tokens_hash, tokens_hash(std::vector<int32_t>{1, 2, 3, 5}));
  QuantizedLogProbs a, b;
  quantize_log_probs(std::vector<float>{0.0f, 1.0f, 2.0f}, a);
  quantize_log_probs(std::vector<float>{3.0f, 1.0f, 2.0f}, b);
  {
    LogProbWriter w(path, info);
    w.write(a);
    w.write(b);
    w.finish();
  }
  EXPECT_EQ(std::filesystem::file_size(path), 48u + 2 * (12 + 2 * 3));
  LogProbReader r(path);
  EXPECT_EQ(r.info().vocab, 3u);
  EXPECT_EQ(r.info().ctx, 4u);
  EXPECT_EQ(r.info().windows, 1u);
  EXPECT_EQ(r.info().scored, 2u);
  EXPECT_EQ(r.info().tokens_hash, info.tokens_hash);
  QuantizedLogProbs got;
  r.read(got);
  EXPECT_EQ(got.q, a.q);
  EXPECT_EQ(got.argmax, 2u);
  r.read(got);
  EXPECT_EQ(got.q, b.q);
  EXPECT_EQ(got.argmax, 0u);
  EXPECT_EQ(got.hi, b.hi);
  EXPECT_THROW(r.read(got), Error);
  // Truncated: refused with a message.
  std::filesystem::resize_file(path, 60);
  EXPECT_THROW(LogProbReader{path}, Error);
  std::remove(path.c_str());
  // An unfinished writer leaves nothing behind.
  { LogProbWriter w(path, info); }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
}  // namespace swiftlet
