// Perplexity and KL divergence the way llama.cpp's llama-perplexity measures them (see
// `swiftlet perplexity`, docs/perplexity.md): the text in windows of ctx tokens, each from a
// fresh state, the second half of each window scored; log-softmax in double from fp32 logits.
// And the file of log-probabilities one run saves (--save-logits) for another to compare with
// (--compare-logits).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace swiftlet {

// Scored positions of a window of ctx tokens: logits row j predicts token j + 1, for
// j = ctx / 2 .. ctx - 2.
inline int64_t first_scored(int64_t ctx) { return ctx / 2; }
inline int64_t scored_per_window(int64_t ctx) { return ctx - 1 - ctx / 2; }

// log(sum(exp(row))) in double.
double log_sum_exp(std::span<const float> row);
// -log softmax(row)[target] in double.
double token_nll(std::span<const float> row, int32_t target);

// Mean with llama.cpp's standard error: sqrt((mean(x^2) - mean(x)^2) / (n - 1)).
struct MeanStat {
  double sum = 0, sum2 = 0;
  uint64_t n = 0;
  void add(double x) {
    sum += x;
    sum2 += x * x;
    n++;
  }
  double mean() const { return n ? sum / double(n) : 0.0; }
  double stderr_of_mean() const;
};

// One scored token's log-probabilities, quantised (docs/perplexity.md, "Saved log-probabilities"):
// log p = lo + q * (hi - lo) / 65535 with hi the largest log-probability and lo = max(smallest,
// hi - kLogProbRange); smaller values are stored as lo. Plus the index of the largest.
inline constexpr double kLogProbRange = 40.0;
struct QuantizedLogProbs {
  float hi = 0, lo = 0;
  uint32_t argmax = 0;
  std::vector<uint16_t> q;  // [vocab]
};
void quantize_log_probs(std::span<const float> logits, QuantizedLogProbs& out);
// The saved distribution as normalised log-probabilities (renormalised after dequantising).
void dequantize_log_probs(const QuantizedLogProbs& in, std::vector<double>& log_p);
// KL(P || Q) = sum p (log p - log q), P given as normalised log-probabilities, Q as logits.
double kl_divergence(std::span<const double> log_p, std::span<const float> logits_q);

// The file: a 48-byte header, then one record per scored token in order.
struct LogProbFileInfo {
  uint32_t vocab = 0, ctx = 0, windows = 0;
  uint64_t scored = 0;       // records
  uint64_t tokens_hash = 0;  // FNV-1a 64 of the evaluated tokens (windows x ctx), as int32 LE
};
uint64_t tokens_hash(std::span<const int32_t> tokens);
uint64_t log_prob_file_bytes(const LogProbFileInfo& info);

class LogProbWriter {
 public:
  // Writes to path + ".tmp", renamed to path by finish(). Throws Error when it cannot be created
  // or the file would not fit on its disk (with the size and how to make it smaller).
  LogProbWriter(const std::string& path, const LogProbFileInfo& info);
  ~LogProbWriter();
  LogProbWriter(const LogProbWriter&) = delete;
  LogProbWriter& operator=(const LogProbWriter&) = delete;
  void write(const QuantizedLogProbs& r);
  void finish();  // throws Error if anything could not be written

 private:
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  bool failed_ = false;
  uint32_t vocab_;
};

class LogProbReader {
 public:
  // Throws Error for a missing, foreign or truncated file.
  explicit LogProbReader(const std::string& path);
  ~LogProbReader();
  LogProbReader(const LogProbReader&) = delete;
  LogProbReader& operator=(const LogProbReader&) = delete;
  const LogProbFileInfo& info() const { return info_; }
  // The next record; throws Error past the end.
  void read(QuantizedLogProbs& r);

 private:
  std::string path_;
  FILE* f_ = nullptr;
  LogProbFileInfo info_;
};

}  // namespace swiftlet
