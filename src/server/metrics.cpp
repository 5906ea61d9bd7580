#include "server/metrics.h"

#include "core/sys_stats.h"

#include <fmt/format.h>

namespace swiftlet::server {

namespace {
// Prometheus label values escape backslash, double quote and newline.
std::string label_value(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}
}  // namespace

Metrics::Metrics() : start_(std::chrono::steady_clock::now()) {}

void Metrics::on_http(const std::string& path, int status) {
  // Only our routes get their own label: unknown paths would let clients grow the map.
  static const char* known[] = {"/", "/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions"};
  std::string p = "other";
  for (const char* k : known)
    if (path == k) p = k;
  std::lock_guard lock(mu_);
  ++http_[{p, status}];
}

void Metrics::on_job(FinishReason finish, const GenerateStats& s) {
  std::lock_guard lock(mu_);
  ++t_.jobs;
  if (finish == FinishReason::Cancelled) ++t_.jobs_cancelled;
  t_.prompt_tokens += uint64_t(s.prompt_tokens);
  t_.reused_tokens += uint64_t(s.reused_tokens);
  t_.prefilled_tokens += uint64_t(s.prefilled_tokens);
  t_.generated_tokens += uint64_t(s.generated_tokens);
  t_.prefill_seconds += s.prefill_seconds;
  t_.decode_seconds += s.decode_seconds;
  t_.expert_hits += s.experts.hits;
  t_.expert_misses += s.experts.misses;
  t_.bytes_read += s.experts.bytes_read;
  if (s.decode_tok_s() > 0) t_.last_decode_tok_s = s.decode_tok_s();
  if (s.prefill_tok_s() > 0) t_.last_prefill_tok_s = s.prefill_tok_s();
}

void Metrics::on_job_failed() {
  std::lock_guard lock(mu_);
  ++t_.jobs_failed;
}

void Metrics::on_rejected_queue_full() {
  std::lock_guard lock(mu_);
  ++t_.rejected_queue_full;
}

Metrics::Totals Metrics::totals() const {
  std::lock_guard lock(mu_);
  return t_;
}

std::string Metrics::prometheus(const LiveGauges& live) const {
  Totals t;
  std::map<std::pair<std::string, int>, uint64_t> http;
  {
    std::lock_guard lock(mu_);
    t = t_;
    http = http_;
  }
  const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string out;
  out += "# HELP swiftlet_http_requests_total HTTP requests answered, by route and status.\n"
         "# TYPE swiftlet_http_requests_total counter\n";
  for (const auto& [key, n] : http)
    out += fmt::format("swiftlet_http_requests_total{{path=\"{}\",status=\"{}\"}} {}\n", label_value(key.first),
                       key.second, n);
  metric(out, "swiftlet_requests_total", "counter", "Generation requests the engine ran.", double(t.jobs));
  metric(out, "swiftlet_requests_cancelled_total", "counter",
         "Generations stopped early because the client went away.", double(t.jobs_cancelled));
  metric(out, "swiftlet_requests_failed_total", "counter", "Generations that failed with an error.",
         double(t.jobs_failed));
  metric(out, "swiftlet_requests_rejected_total", "counter", "Requests refused with 429 because the queue was full.",
         double(t.rejected_queue_full));
  metric(out, "swiftlet_queue_length", "gauge", "Requests waiting for the engine.", double(live.queue_length));
  metric(out, "swiftlet_queue_capacity", "gauge", "Most requests that may wait (--max-queue).",
         double(live.queue_capacity));
  metric(out, "swiftlet_requests_running", "gauge", "Requests being generated now (0 or 1).", live.busy ? 1 : 0);
  metric(out, "swiftlet_model_ready", "gauge", "1 once the model is loaded.", live.ready ? 1 : 0);
  metric(out, "swiftlet_sessions", "gauge", "Conversations kept for prefix reuse (--parallel).", live.sessions);
  metric(out, "swiftlet_context_tokens", "gauge", "Context length per conversation (--ctx).",
         double(live.max_context));
  metric(out, "swiftlet_prompt_tokens_total", "counter", "Prompt tokens of all requests.", double(t.prompt_tokens));
  metric(out, "swiftlet_prompt_tokens_reused_total", "counter",
         "Prompt tokens whose state was kept from an earlier request (prefix reuse).", double(t.reused_tokens));
  metric(out, "swiftlet_prompt_tokens_prefilled_total", "counter", "Prompt tokens run through the model.",
         double(t.prefilled_tokens));
  metric(out, "swiftlet_generated_tokens_total", "counter", "Tokens generated.", double(t.generated_tokens));
  metric(out, "swiftlet_prefix_cache_hit_ratio", "gauge", "Reused prompt tokens / prompt tokens, since start.",
         t.prompt_tokens ? double(t.reused_tokens) / double(t.prompt_tokens) : 0.0);
  metric(out, "swiftlet_prefill_seconds_total", "counter", "Time spent prefilling prompts.", t.prefill_seconds);
  metric(out, "swiftlet_decode_seconds_total", "counter", "Time spent generating tokens.", t.decode_seconds);
  metric(out, "swiftlet_decode_tokens_per_second", "gauge", "Decode speed of the last request.",
         t.last_decode_tok_s);
  metric(out, "swiftlet_prefill_tokens_per_second", "gauge", "Prefill speed of the last request.",
         t.last_prefill_tok_s);
  metric(out, "swiftlet_expert_cache_hits_total", "counter", "Routed experts served from memory.",
         double(t.expert_hits));
  metric(out, "swiftlet_expert_cache_misses_total", "counter", "Routed experts read from disk.",
         double(t.expert_misses));
  metric(out, "swiftlet_expert_cache_hit_ratio", "gauge", "Expert cache hits / lookups, since start.",
         t.expert_hits + t.expert_misses ? double(t.expert_hits) / double(t.expert_hits + t.expert_misses) : 0.0);
  metric(out, "swiftlet_disk_read_bytes_total", "counter", "Expert bytes read from disk.", double(t.bytes_read));
  metric(out, "swiftlet_resident_memory_bytes", "gauge", "Resident set size now.", double(current_rss_bytes()));
  metric(out, "swiftlet_peak_resident_memory_bytes", "gauge", "Peak resident set size.", double(peak_rss_bytes()));
  metric(out, "swiftlet_uptime_seconds", "gauge", "Seconds since the server started.", uptime);
  return out;
}

}  // namespace swiftlet::server
