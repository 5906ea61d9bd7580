#include "runtime/perplexity.h"

#include "core/error.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace swiftlet {

namespace {
constexpr char kMagic[8] = {'S', 'W', 'L', 'O', 'G', 'P', 'R', 'B'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 48;

uint64_t record_bytes(uint32_t vocab) { return 12 + 2 * uint64_t(vocab); }
}  // namespace

double log_sum_exp(std::span<const float> row) {
  const float m = *std::max_element(row.begin(), row.end());
  double s = 0;
  for (float x : row) s += std::exp(double(x) - double(m));
  return double(m) + std::log(s);
}

double token_nll(std::span<const float> row, int32_t target) { return log_sum_exp(row) - double(row[size_t(target)]); }

double MeanStat::stderr_of_mean() const {
  if (n < 2) return 0.0;
  const double m = mean(), var = sum2 / double(n) - m * m;
  return var > 0 ? std::sqrt(var / double(n - 1)) : 0.0;
}

void quantize_log_probs(std::span<const float> logits, QuantizedLogProbs& out) {
  const double lse = log_sum_exp(logits);
  const auto [mn, mx] = std::minmax_element(logits.begin(), logits.end());
  out.argmax = uint32_t(mx - logits.begin());
  const double hi = double(*mx) - lse;
  const double lo = std::max(double(*mn) - lse, hi - kLogProbRange);
  out.hi = float(hi);
  out.lo = float(lo);
  out.q.resize(logits.size());
  // Scaled with the stored (float) bounds, so reading back uses exactly the same grid.
  const double range = double(out.hi) - double(out.lo);
  const double scale = range > 0 ? 65535.0 / range : 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double v = std::round((double(logits[i]) - lse - double(out.lo)) * scale);
    out.q[i] = uint16_t(std::clamp(v, 0.0, 65535.0));
  }
}

void dequantize_log_probs(const QuantizedLogProbs& in, std::vector<double>& log_p) {
  const double step = (double(in.hi) - double(in.lo)) / 65535.0;
  log_p.resize(in.q.size());
  double m = -INFINITY;
  for (size_t i = 0; i < in.q.size(); ++i) {
    log_p[i] = double(in.lo) + double(in.q[i]) * step;
    m = std::max(m, log_p[i]);
  }
  double s = 0;
  for (double v : log_p) s += std::exp(v - m);
  const double lse = m + std::log(s);
  for (double& v : log_p) v -= lse;
}

double kl_divergence(std::span<const double> log_p, std::span<const float> logits_q) {
  SWIFTLET_CHECK(log_p.size() == logits_q.size(), "KL of distributions of {} and {} entries", log_p.size(),
                 logits_q.size());
  const double lse_q = log_sum_exp(logits_q);
  double kl = 0;
  for (size_t i = 0; i < log_p.size(); ++i) kl += std::exp(log_p[i]) * (log_p[i] - (double(logits_q[i]) - lse_q));
  return std::max(0.0, kl);  // rounding can leave -1e-17 for identical distributions
}

uint64_t tokens_hash(std::span<const int32_t> tokens) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : tokens) {
    uint8_t b[4];
    std::memcpy(b, &t, 4);
    for (uint8_t c : b) h = (h ^ c) * 1099511628211ull;
  }
  return h;
}

uint64_t log_prob_file_bytes(const LogProbFileInfo& info) {
  return kHeaderBytes + info.scored * record_bytes(info.vocab);
}

LogProbWriter::LogProbWriter(const std::string& path, const LogProbFileInfo& info)
    : path_(path), tmp_(path + ".tmp"), vocab_(info.vocab) {
  const uint64_t bytes = log_prob_file_bytes(info);
  namespace fs = std::filesystem;
  const fs::path dir = fs::absolute(path).parent_path();
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = uint64_t(vfs.f_bavail) * uint64_t(vfs.f_frsize);
    if (bytes + (uint64_t(1) << 30) > free_bytes)
      fail("--save-logits: the log-probabilities of {} scored tokens take {:.2f} GB ({} KB each) but {} has only "
           "{:.2f} GB free (keeping 1 GB spare): save fewer windows with --chunks K or use another disk",
           info.scored, double(bytes) / 1e9, record_bytes(info.vocab) / 1000, dir.string(), double(free_bytes) / 1e9);
  }
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) fail("--save-logits: cannot create '{}': {}", tmp_, std::strerror(errno));
  char h[kHeaderBytes] = {};
  std::memcpy(h, kMagic, 8);
  const uint32_t v[4] = {kVersion, info.vocab, info.ctx, info.windows};
  std::memcpy(h + 8, v, sizeof v);
  std::memcpy(h + 24, &info.scored, 8);
  std::memcpy(h + 32, &info.tokens_hash, 8);
  failed_ = std::fwrite(h, 1, kHeaderBytes, f_) != kHeaderBytes;
}

LogProbWriter::~LogProbWriter() {
  if (!f_) return;
  std::fclose(f_);
  std::remove(tmp_.c_str());  // not finished: leave no partial file behind
}

void LogProbWriter::write(const QuantizedLogProbs& r) {
  SWIFTLET_CHECK(r.q.size() == vocab_, "log-probabilities of {} entries, want {}", r.q.size(), vocab_);
  bool ok = std::fwrite(&r.hi, 4, 1, f_) == 1 && std::fwrite(&r.lo, 4, 1, f_) == 1 &&
            std::fwrite(&r.argmax, 4, 1, f_) == 1 && std::fwrite(r.q.data(), 2, r.q.size(), f_) == r.q.size();
  failed_ = failed_ || !ok;
}

void LogProbWriter::finish() {
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (failed_ || !closed || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_.c_str());
    fail("--save-logits: could not write '{}' (disk full?)", path_);
  }
}

LogProbReader::LogProbReader(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "rb");
  if (!f_) fail("--compare-logits: cannot open '{}': {}", path, std::strerror(errno));
  char h[kHeaderBytes];
  if (std::fread(h, 1, kHeaderBytes, f_) != kHeaderBytes || std::memcmp(h, kMagic, 8) != 0)
    fail("--compare-logits: '{}' is not a file of log-probabilities saved by swiftlet perplexity --save-logits", path);
  uint32_t v[4];
  std::memcpy(v, h + 8, sizeof v);
  if (v[0] != kVersion) fail("--compare-logits: '{}' has version {}; this build reads version {}", path, v[0], kVersion);
  info_.vocab = v[1];
  info_.ctx = v[2];
  info_.windows = v[3];
  std::memcpy(&info_.scored, h + 24, 8);
  std::memcpy(&info_.tokens_hash, h + 32, 8);
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || info_.vocab == 0 || size != log_prob_file_bytes(info_))
    fail("--compare-logits: '{}' is truncated or damaged ({} bytes, its header promises {}): save it again", path,
         size, log_prob_file_bytes(info_));
}

LogProbReader::~LogProbReader() {
  if (f_) std::fclose(f_);
}

void LogProbReader::read(QuantizedLogProbs& r) {
  r.q.resize(info_.vocab);
  const bool ok = std::fread(&r.hi, 4, 1, f_) == 1 && std::fread(&r.lo, 4, 1, f_) == 1 &&
                  std::fread(&r.argmax, 4, 1, f_) == 1 && std::fread(r.q.data(), 2, r.q.size(), f_) == r.q.size();
  if (!ok) fail("--compare-logits: '{}' ended early", path_);
  if (r.argmax >= info_.vocab) fail("--compare-logits: '{}' is damaged (top token {} of {})", path_, r.argmax, info_.vocab);
}

}  // namespace swiftlet
