// Server counters, rendered in the Prometheus text exposition format (version 0.0.4) for
// GET /metrics. Updated by the HTTP threads (requests, statuses) and the engine thread (tokens,
// timings, cache counters); read by anyone. All methods are thread-safe.
#pragma once

#include "runtime/session.h"
#include "server/engine_worker.h"

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace swiftlet::server {

// Gauges the metrics page samples when rendered (they live elsewhere).
struct LiveGauges {
  size_t queue_length = 0;
  size_t queue_capacity = 0;
  bool busy = false;  // the engine thread is running a job
  BatchGauges batch;  // jobs running, batch size, per slot
  bool ready = false;  // the model is loaded
  int sessions = 0;  // conversations kept (--sessions)
  int parallel = 0;  // requests generated together at most (--parallel)
  int64_t max_context = 0;
  std::optional<StateCacheStats> state_cache;  // the prefix state cache (--state-cache), when on
  std::optional<GrammarCacheStats> grammar_cache;  // constrained answers' grammars, once one came
};

class Metrics {
 public:
  Metrics();

  // One HTTP exchange finished with `status` (the transport's logger calls this).
  void on_http(const std::string& path, int status);
  // A job finished on the engine thread (whatever the reason).
  void on_job(FinishReason finish, const GenerateStats& stats);
  void on_job_failed();
  void on_rejected_queue_full();

  struct Totals {
    uint64_t jobs = 0, jobs_cancelled = 0, jobs_failed = 0, rejected_queue_full = 0;
    uint64_t prompt_tokens = 0, reused_tokens = 0, prefilled_tokens = 0, generated_tokens = 0;
    double prefill_seconds = 0, decode_seconds = 0;
    uint64_t expert_hits = 0, expert_misses = 0, bytes_read = 0, experts_skipped = 0, experts_low_bit = 0;
    double last_decode_tok_s = 0, last_prefill_tok_s = 0;
  };
  Totals totals() const;

  std::string prometheus(const LiveGauges& live) const;

 private:
  mutable std::mutex mu_;
  std::chrono::steady_clock::time_point start_;
  Totals t_;
  std::map<std::pair<std::string, int>, uint64_t> http_;  // (path, status) -> count
};

}  // namespace swiftlet::server
