#include "experts/routing_trace.h"

#include "core/dtype.h"
#include "core/error.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace swiftlet {

namespace {
// docs/routing-trace.md: a 32-byte header, then one record per token (all little-endian).
constexpr char kMagic[8] = {'S', 'W', 'R', 'T', 'R', 'A', 'C', 'E'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kFlagWeights = 1, kFlagPredictions = 2;
constexpr size_t kHeaderBytes = 32;

struct Header {
  uint32_t layers, experts, top_k, flags;
};

size_t record_bytes(const Header& h) {
  const size_t lk = size_t(h.layers) * h.top_k;
  return 8 + 2 * lk * (1 + ((h.flags & kFlagWeights) ? 1 : 0) + ((h.flags & kFlagPredictions) ? 1 : 0));
}

std::string header_bytes(const Header& h) {
  std::string b(kHeaderBytes, '\0');
  std::memcpy(b.data(), kMagic, 8);
  const uint32_t v[5] = {kVersion, h.layers, h.experts, h.top_k, h.flags};
  std::memcpy(b.data() + 8, v, sizeof v);
  return b;
}

template <typename T>
void put(std::string& out, const T* p, size_t n) {
  out.append(reinterpret_cast<const char*>(p), n * sizeof(T));
}

// One token's record from trace row `i`.
std::string record(const RoutingTrace& t, size_t i) {
  std::string r;
  put(r, &t.positions[i], 1);
  put(r, &t.tokens[i], 1);
  const size_t lk = size_t(t.layers) * size_t(t.top_k), o = i * lk;
  put(r, t.chosen.data() + o, lk);
  if (t.has_weights) {
    std::vector<uint16_t> h(lk);
    for (size_t j = 0; j < lk; ++j) h[j] = f32_to_f16(t.weights[o + j]);
    put(r, h.data(), lk);
  }
  if (t.has_predictions) put(r, t.predicted.data() + o, lk);
  return r;
}
}  // namespace

std::span<const uint16_t> RoutingTrace::predicted_of(size_t token, int layer) const {
  if (!has_predictions) return {};
  auto s = std::span(predicted).subspan(offset(token, layer), size_t(top_k));
  return s[0] == kNoPrediction ? std::span<const uint16_t>{} : s;
}

void RoutingTrace::append(int32_t position, int32_t token, std::span<const uint16_t> experts_in,
                          std::span<const float> w, std::span<const uint16_t> pred) {
  const size_t lk = size_t(layers) * size_t(top_k);
  SWIFTLET_CHECK(experts_in.size() == lk, "trace record of {} experts, want {}", experts_in.size(), lk);
  positions.push_back(position);
  tokens.push_back(token);
  chosen.insert(chosen.end(), experts_in.begin(), experts_in.end());
  if (has_weights) {
    SWIFTLET_CHECK(w.size() == lk, "trace record without weights");
    weights.insert(weights.end(), w.begin(), w.end());
  }
  if (has_predictions) {
    if (pred.empty()) predicted.insert(predicted.end(), lk, kNoPrediction);
    else predicted.insert(predicted.end(), pred.begin(), pred.end());
  }
}

RoutingTrace read_routing_trace(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    fail("'{}' is a directory, not a routing trace (a file written by --trace-experts)", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open the routing trace '{}': {}", path, std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0)
    fail("'{}' is not a swiftlet routing trace (no SWRTRACE header); record one with --trace-experts", path);
  uint32_t v[5];
  std::memcpy(v, bytes.data() + 8, sizeof v);
  if (v[0] != kVersion) fail("routing trace '{}' has version {}; this build reads version {}", path, v[0], kVersion);
  const Header h{v[1], v[2], v[3], v[4]};
  if (h.layers < 1 || h.layers > 4096 || h.experts < 1 || h.experts >= kNoPrediction || h.top_k < 1 ||
      h.top_k > h.experts || (h.flags & ~(kFlagWeights | kFlagPredictions)))
    fail("routing trace '{}' has an impossible header: {} layers, {} experts, top-{}, flags {}", path, h.layers,
         h.experts, h.top_k, h.flags);
  const size_t rec = record_bytes(h), body = bytes.size() - kHeaderBytes;
  if (body % rec != 0)
    fail("routing trace '{}' is truncated: {} bytes after the header is not a whole number of {}-byte records "
         "(was the run interrupted?)",
         path, body, rec);
  RoutingTrace t;
  t.layers = int(h.layers);
  t.experts = int(h.experts);
  t.top_k = int(h.top_k);
  t.has_weights = h.flags & kFlagWeights;
  t.has_predictions = h.flags & kFlagPredictions;
  const size_t n = body / rec, lk = size_t(h.layers) * h.top_k;
  t.positions.resize(n);
  t.tokens.resize(n);
  t.chosen.resize(n * lk);
  if (t.has_weights) t.weights.resize(n * lk);
  if (t.has_predictions) t.predicted.resize(n * lk);
  std::vector<uint16_t> half(lk);
  for (size_t i = 0; i < n; ++i) {
    const char* p = bytes.data() + kHeaderBytes + i * rec;
    std::memcpy(&t.positions[i], p, 4);
    std::memcpy(&t.tokens[i], p + 4, 4);
    p += 8;
    std::memcpy(t.chosen.data() + i * lk, p, 2 * lk);
    p += 2 * lk;
    if (t.has_weights) {
      std::memcpy(half.data(), p, 2 * lk);
      for (size_t j = 0; j < lk; ++j) t.weights[i * lk + j] = f16_to_f32(half[j]);
      p += 2 * lk;
    }
    if (t.has_predictions) std::memcpy(t.predicted.data() + i * lk, p, 2 * lk);
  }
  for (size_t j = 0; j < t.chosen.size(); ++j)
    if (t.chosen[j] >= h.experts)
      fail("routing trace '{}': token {} layer {} names expert {} of {}", path, j / lk, (j % lk) / h.top_k,
           t.chosen[j], h.experts);
  for (size_t g = 0; g < t.chosen.size(); g += h.top_k) {
    const auto first = t.chosen.begin() + ptrdiff_t(g), last = first + h.top_k;
    for (auto it = first; it != last; ++it)
      if (std::find(first, it, *it) != it)
        fail("routing trace '{}': token {} layer {} names expert {} twice", path, g / lk, (g % lk) / h.top_k, *it);
  }
  for (size_t j = 0; j < t.predicted.size(); ++j)
    if (t.predicted[j] >= h.experts && t.predicted[j] != kNoPrediction)
      fail("routing trace '{}': token {} layer {} predicts expert {} of {}", path, j / lk, (j % lk) / h.top_k,
           t.predicted[j], h.experts);
  return t;
}

void write_routing_trace(const std::string& path, const RoutingTrace& t) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot create '{}': {}", path, std::strerror(errno));
  const Header h{uint32_t(t.layers), uint32_t(t.experts), uint32_t(t.top_k),
                 (t.has_weights ? kFlagWeights : 0) | (t.has_predictions ? kFlagPredictions : 0)};
  out << header_bytes(h);
  for (size_t i = 0; i < t.size(); ++i) out << record(t, i);
  if (!out.flush()) fail("cannot write '{}': {}", path, std::strerror(errno));
}

RoutingTraceWriter::RoutingTraceWriter(const std::string& path, const ModelConfig& c, bool predictions)
    : path_(path), layers_(c.num_layers), experts_(c.num_experts), top_k_(c.num_experts_per_tok),
      predictions_(predictions) {
  if (experts_ >= kNoPrediction) fail("--trace-experts: {} experts do not fit the trace format", experts_);
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) fail("--trace-experts: cannot create '{}': {}", path, std::strerror(errno));
  const Header h{uint32_t(layers_), uint32_t(experts_), uint32_t(top_k_),
                 kFlagWeights | (predictions ? kFlagPredictions : 0)};
  const std::string b = header_bytes(h);
  failed_ = std::fwrite(b.data(), 1, b.size(), f_) != b.size();
  call_.layers = layers_;
  call_.experts = experts_;
  call_.top_k = top_k_;
  call_.has_weights = true;
  call_.has_predictions = predictions;
}

RoutingTraceWriter::~RoutingTraceWriter() {
  if (f_) std::fclose(f_);
}

void RoutingTraceWriter::routed(int layer, int64_t pos0, std::span<const int32_t> tokens,
                                std::span<const int32_t> experts, std::span<const float> weights) {
  const size_t T = tokens.size(), k = size_t(top_k_), lk = size_t(layers_) * k;
  if (layer == 0) {
    pos0_ = pos0;
    call_.positions.assign(T, 0);
    call_.tokens.assign(tokens.begin(), tokens.end());
    call_.chosen.assign(T * lk, 0);
    call_.weights.assign(T * lk, 0.0f);
    if (predictions_) call_.predicted.assign(T * lk, kNoPrediction);
    for (size_t t = 0; t < T; ++t) call_.positions[t] = int32_t(pos0 + int64_t(t));
  }
  SWIFTLET_CHECK(pos0 == pos0_ && T == call_.tokens.size(), "routing of layer {} from another call", layer);
  for (size_t t = 0; t < T; ++t)
    for (size_t i = 0; i < k; ++i) {
      call_.chosen[call_.offset(t, layer) + i] = uint16_t(experts[t * k + i]);
      call_.weights[call_.offset(t, layer) + i] = weights[t * k + i];
    }
  if (layer + 1 < layers_ || !f_) return;
  for (size_t t = 0; t < T; ++t) {
    const std::string r = record(call_, t);
    if (std::fwrite(r.data(), 1, r.size(), f_) != r.size()) failed_ = true;
  }
  written_ += T;
}

void RoutingTraceWriter::predicted(int layer, int64_t pos, std::span<const int32_t> experts) {
  if (!predictions_ || pos < pos0_ || pos - pos0_ >= int64_t(call_.tokens.size())) return;
  const size_t o = call_.offset(size_t(pos - pos0_), layer);
  for (size_t i = 0; i < size_t(top_k_) && i < experts.size(); ++i) call_.predicted[o + i] = uint16_t(experts[i]);
}

void RoutingTraceWriter::finish() {
  if (!f_) return;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (failed_ || !closed) fail("--trace-experts: could not write '{}' (disk full?)", path_);
}

TraceRouteOverride::TraceRouteOverride(const RoutingTrace& trace, int model_layers, int model_experts,
                                       int model_top_k)
    : t_(trace), lm_(model_layers), em_(model_experts), km_(model_top_k), used_(size_t(model_experts)) {
  if (trace.size() == 0) fail("the routing trace has no tokens");
  if (km_ > em_) fail("routing replay: top-{} of {} experts", km_, em_);
}

bool TraceRouteOverride::map(size_t token, int layer, bool predicted, std::span<int32_t> out) {
  const int lt = t_.layers, et = t_.experts;
  const int a = int(int64_t(layer) * lt / lm_);
  std::fill(used_.begin(), used_.end(), 0);
  size_t n = 0;
  for (int s = 0; s < lt && n < out.size(); ++s) {
    const int src = (a + s) % lt;
    std::span<const uint16_t> set = predicted ? t_.predicted_of(token, src) : t_.experts_of(token, src);
    if (set.empty()) return false;
    for (uint16_t e : set) {
      const int m = int((int64_t(e) * em_ / et + s) % em_);
      if (used_[size_t(m)]) continue;
      used_[size_t(m)] = 1;
      out[n++] = m;
      if (n == out.size()) break;
    }
  }
  for (int m = 0; n < out.size(); ++m)
    if (!used_[size_t(m)]) {
      used_[size_t(m)] = 1;
      out[n++] = m;
    }
  return true;
}

void TraceRouteOverride::route(int layer, int64_t pos, std::span<int32_t> experts) {
  SWIFTLET_CHECK(int(experts.size()) == km_ && layer < lm_, "routing replay of another model");
  map(size_t(pos) % t_.size(), layer, false, experts);
}

bool TraceRouteOverride::predict(int layer, int64_t pos, std::span<int32_t> experts) {
  if (!t_.has_predictions) return false;
  return map(size_t(pos) % t_.size(), layer, true, experts);
}

}  // namespace swiftlet
