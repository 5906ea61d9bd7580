// Expert routing traces: per token and MoE layer, the experts the router chose (in router
// order), optionally their weights and the experts the next-layer predictor had guessed.
// Recorded by `--trace-experts FILE` (RoutingTraceWriter), read by the cache simulator
// (cache_sim.h) and replayed on another model by `swiftlet bench --routing-trace`
// (TraceRouteOverride). The file format is in docs/routing-trace.md.
#pragma once

#include "model/qwen3_hybrid.h"

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace swiftlet {

inline constexpr uint16_t kNoPrediction = 0xFFFF;  // a layer of a token without a guess

struct RoutingTrace {
  int layers = 0, experts = 0, top_k = 0;
  bool has_weights = false, has_predictions = false;
  std::vector<int32_t> positions;   // [N] the token's position in its session
  std::vector<int32_t> tokens;      // [N] the token id fed at that position
  std::vector<uint16_t> chosen;     // [N][layers][top_k] expert ids, router order
  std::vector<float> weights;       // [N][layers][top_k] (has_weights; stored as fp16)
  std::vector<uint16_t> predicted;  // [N][layers][top_k] guessed ids or kNoPrediction (has_predictions)

  size_t size() const { return positions.size(); }
  size_t offset(size_t token, int layer) const { return (token * size_t(layers) + size_t(layer)) * size_t(top_k); }
  std::span<const uint16_t> experts_of(size_t token, int layer) const {
    return std::span(chosen).subspan(offset(token, layer), size_t(top_k));
  }
  // Empty when the token has no guess for that layer (or the trace no predictions).
  std::span<const uint16_t> predicted_of(size_t token, int layer) const;
  // Appends one token's records ([layers][top_k] each; weights and predicted empty when absent).
  void append(int32_t position, int32_t token, std::span<const uint16_t> experts, std::span<const float> w = {},
              std::span<const uint16_t> pred = {});
};

// Throws Error (saying what is wrong with the file) on a missing, foreign, truncated or
// inconsistent file.
RoutingTrace read_routing_trace(const std::string& path);
void write_routing_trace(const std::string& path, const RoutingTrace& trace);

// Writes the routing of every token a Forward runs to a trace file as it goes (one record per
// token once the call's last layer has routed).
class RoutingTraceWriter : public RoutingObserver {
 public:
  // predictions: reserve room for next-layer guesses (runs with --predict-next on a streamed
  // model). Throws Error if the file cannot be created.
  RoutingTraceWriter(const std::string& path, const ModelConfig& c, bool predictions);
  ~RoutingTraceWriter() override;
  RoutingTraceWriter(const RoutingTraceWriter&) = delete;
  RoutingTraceWriter& operator=(const RoutingTraceWriter&) = delete;

  void routed(int layer, int64_t pos0, std::span<const int32_t> tokens, std::span<const int32_t> experts,
              std::span<const float> weights) override;
  void predicted(int layer, int64_t pos, std::span<const int32_t> experts) override;
  // Closes the file; throws Error if anything could not be written.
  void finish();
  uint64_t tokens_written() const { return written_; }

 private:
  std::string path_;
  FILE* f_ = nullptr;
  int layers_, experts_, top_k_;
  bool predictions_;
  bool failed_ = false;
  uint64_t written_ = 0;
  int64_t pos0_ = 0;
  RoutingTrace call_;  // the current call's tokens
};

// Replays a trace on a model of another shape (docs/routing-trace.md, "Replay"): position p
// uses trace token p mod N; model layer l uses trace layer a = floor(l * Lt / Lm); its top_k
// experts are the trace's experts of layers a, a+1, ... (mod Lt) in router order, expert e of
// the s-th of those layers mapped to (e * Em / Et + s) mod Em, skipping repeats, then the lowest
// unused ids if still short.
class TraceRouteOverride : public RouteOverride {
 public:
  TraceRouteOverride(const RoutingTrace& trace, int model_layers, int model_experts, int model_top_k);
  void route(int layer, int64_t pos, std::span<int32_t> experts) override;
  bool predict(int layer, int64_t pos, std::span<int32_t> experts) override;

 private:
  // Maps trace layer a's sets (chosen or predicted) of token `token` into `out`; false when a
  // predicted set is missing.
  bool map(size_t token, int layer, bool predicted, std::span<int32_t> out);
  const RoutingTrace& t_;
  int lm_, em_, km_;
  std::vector<uint8_t> used_;
};

}  // namespace swiftlet
