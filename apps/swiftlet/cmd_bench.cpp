// swiftlet bench MODEL [--cache default,1G,budget:3G,all] [--io uring,serial] [--predict off,on]
//   [--on-miss exact,skip:0.05] [--prompt-tokens N] [--decode N] [--disk-seconds S] [--memory-mb N]
//   [--routing-trace FILE] [--json]
// Streaming benchmark: for every combination of cache setting, IO mode and prediction it runs a
// fresh process (so peak RSS is that configuration's own) that prefills a fixed prompt and
// decodes greedily, then prints one table with what the issue asks for: peak RSS, prefill and
// decode tok/s, hit rate, bytes read per token, achieved read rate, share of decode time spent
// waiting on IO, and the disk-bound decode rate (bytes that must come from disk per token at
// the measured hit rate / the disk's random-read rate, measured in the same run).
// --routing-trace replays recorded routing (a --trace-experts file of a real model) instead of the
// model's own router, mapped onto its layers and experts as docs/routing-trace.md describes.
// --streams 1,2,4 measures batched decoding instead (Forward::decode_batch, docs/log/batching.md):
// in each configuration's process, N sequences with prompts of their own decode together, for
// every N listed, each N against the others in the same process (taking turns step by step when
// the cache holds every expert); it prints aggregate and per-stream decode tok/s, the experts a
// step acquires and the time per step by part. With --gpu the batches run on the GPU
// (gpu_decode_batch; each batch size prefills its own streams, whose states live in their passes;
// a step of one stream and one of the largest batch are also profiled by part).
#include "bench_measure.h"
#include "bench_modes.h"
#include "cli_util.h"
#include "commands.h"

#include "core/error.h"
#include "core/sys_stats.h"
#include "core/thread_pool.h"
#include "experts/expert_reader.h"
#include "experts/routing_trace.h"
#include "format/qpack.h"
#include "kernels/cpu/kernels.h"
#include "model/qwen3_hybrid.h"
#include "runtime/engine.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <sstream>

namespace swiftlet::cli {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct BenchOptions {
  ModelFlags model;
  std::string cache = "default", io = "uring,serial", predict = "off,1";
  std::string routing_trace;
  std::string streams;  // --streams: batch sizes to compare (empty: the streaming benchmark)
  int prompt_tokens = 32, decode = 64;
  double disk_seconds = 3;
  // The memory bandwidth is read over this many MiB before the runs, and over up to a quarter
  // of it (at most 256 MiB) in each run after its decode.
  double memory_mb = 1024;
  bool json = false, child = false, warm = false;
};

size_t run_memory_bytes(const BenchOptions& o) {
  return size_t(std::min(256.0, o.memory_mb / 4) * 1048576);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<int32_t> bench_prompt(int n, int vocab) {
  std::mt19937 rng(2024);
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int32_t(rng() % uint32_t(std::min(vocab, 100000))));
  return ids;
}

// One configuration, in this process: prints one JSON object on stdout.
void run_child(const BenchOptions& o) {
  const auto t_load = Clock::now();
  Engine engine(o.model.engine_options());
  const double load_s = since(t_load);
  const size_t rss_loaded = current_rss_bytes();
  std::optional<RoutingTrace> trace;
  std::optional<TraceRouteOverride> replay;
  SessionOptions so;
  if (!o.routing_trace.empty()) {
    trace = read_routing_trace(o.routing_trace);
    const ModelConfig& c = engine.config();
    replay.emplace(*trace, c.num_layers, c.num_experts, c.num_experts_per_tok);
    so.route_override = &*replay;
  }
  auto session = engine.new_session(so);
  const ExpertSource* src = engine.model().experts;
  const std::vector<int32_t> prompt = bench_prompt(o.prompt_tokens, int(engine.config().vocab_size));
  GenerateRequest req;
  req.prompt = prompt;
  req.sampling.temperature = 0;
  req.max_new_tokens = o.decode;
  if (o.warm) {
    // A first pass fills the cache; the measured pass below then reads only what did not fit.
    session->generate(req);
    session = engine.new_session(so);
  }
  const ExpertStats s0 = src->expert_stats();
  const auto t0 = Clock::now();
  session->prepare(prompt);
  const double prefill_s = since(t0);
  const ExpertStats s1 = src->expert_stats();
  // The CPU pass's profile and prediction counters (zero on the GPU, which has its own profile).
  auto cpu_profile = [&] { return session->cpu_forward() ? session->cpu_forward()->profile() : Forward::Profile{}; };
  const Forward::Profile prefill_profile = cpu_profile();

  const GenerateResult res = session->generate(req);
  const GenerateStats& g = res.stats;
  const ExpertStats& e = g.experts;
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the generated ids
  for (int32_t id : res.tokens) h = (h ^ uint64_t(uint32_t(id))) * 1099511628211ull;
  Forward::Profile p = cpu_profile();
  const double steps = std::max<double>(1, double(g.generated_tokens - 1));
  auto per_token_ms = [&](double a, double b) { return (a - b) / steps * 1e3; };
  const double pt = std::max<double>(1, double(prompt.size()));
  const Forward::Profile& pp = prefill_profile;
  const json prefill = {{"attention_ms", pp.attention / pt * 1e3},
                        {"delta_net_ms", pp.delta_net / pt * 1e3},
                        {"router_shared_ms", pp.router_shared / pt * 1e3},
                        {"expert_compute_ms", pp.expert_compute / pt * 1e3},
                        {"expert_acquire_ms", pp.expert_acquire / pt * 1e3},
                        {"lm_head_ms", pp.lm_head / pt * 1e3},
                        {"total_ms", prefill_s / pt * 1e3}};
  const json profile = {{"attention_ms", per_token_ms(p.attention, prefill_profile.attention)},
                        {"delta_net_ms", per_token_ms(p.delta_net, prefill_profile.delta_net)},
                        {"router_shared_ms", per_token_ms(p.router_shared, prefill_profile.router_shared)},
                        {"expert_compute_ms", per_token_ms(p.expert_compute, prefill_profile.expert_compute)},
                        {"expert_acquire_ms", per_token_ms(p.expert_acquire, prefill_profile.expert_acquire)},
                        {"lm_head_ms", per_token_ms(p.lm_head, prefill_profile.lm_head)},
                        {"total_ms", g.decode_seconds / steps * 1e3}};
  // Weight bytes one decoded token reads: every resident matrix but the embedding table (one
  // row), and top-k experts per layer.
  const Model& m = engine.model();
  const QpackContainer qc = QpackContainer::open(o.model.model);
  const bool tied = m.weights.lm_head.data == m.weights.embed_tokens.data;
  const uint64_t touched = engine.loaded().memory.resident - (tied ? 0 : m.weights.embed_tokens.total_bytes()) +
                           uint64_t(m.config.num_experts_per_tok) * uint64_t(m.config.num_layers) * qc.layout.payload();
  const PredictionStats pred = session->prediction_stats();
  const MemoryPlan& plan = engine.loaded().memory;
  json j = {{"peak_rss", peak_rss_bytes()},
            {"load_s", load_s},
            {"rss_after_load", rss_loaded},
            {"prefill_tok_s", prefill_s > 0 ? double(prompt.size()) / prefill_s : 0.0},
            {"prefill_bytes", s1.bytes_read - s0.bytes_read},
            {"decode_tokens", g.generated_tokens},
            {"decode_s", g.decode_seconds},
            {"decode_tok_s", g.decode_tok_s()},
            {"hits", e.hits},
            {"misses", e.misses},
            {"evictions", e.evictions},
            {"bytes_read", e.bytes_read},
            {"read_s", e.read_seconds},
            {"wait_s", e.wait_seconds},
            {"verify_s", e.verify_seconds},
            {"predicted", e.predicted},
            {"predicted_used", e.predicted_used},
            {"skipped", e.skipped},
            {"low_bit", e.low_bit},
            {"prediction_accuracy", pred.accuracy()},
            {"cache_budget", e.cache_budget},
            {"cache_experts", plan.cache_experts},
            {"tokens_hash", fmt::format("{:016x}", h)},
            {"profile", profile},
            {"prefill_profile", prefill},
            {"bytes_touched_per_token", touched},
            {"tokens", res.tokens},
            {"on_gpu", g.on_gpu}};
  if (g.on_gpu)
    j["gpu"] = {{"hits", g.gpu.hits},
                {"misses", g.gpu.misses},
                {"bytes_uploaded", g.gpu.bytes_uploaded},
                {"upload_gb_s", g.gpu.upload_gb_s()},
                {"dense_bytes", g.gpu.dense_bytes},
                {"cache_bytes", g.gpu.cache_bytes},
                {"all_resident", g.gpu.all_resident}};
  // The memory bandwidth again, from this process right after its decode (the host's bandwidth
  // drifts; the parent takes the best figure of all as the bound). Peak RSS is recorded above,
  // so this buffer does not count in it.
  j["memory_gb_s"] = measure_memory_bandwidth(run_memory_bytes(o));
  std::printf("%s\n", j.dump().c_str());
}

// Maps each stream's positions onto a region of its own of a routing trace: the positions a
// batch holds are distinct (the streams' prompts differ in length), so a table set before each
// call tells which stream a position belongs to. Without it streams one position apart would
// replay the trace one token apart, and each would find the experts the other just used.
class StreamRouteOverride final : public RouteOverride {
 public:
  explicit StreamRouteOverride(RouteOverride& inner) : inner_(inner) {}
  // The trace offset of every position of the next call (replaces the previous table).
  void set(std::vector<std::pair<int64_t, int64_t>> pos_offset) { table_ = std::move(pos_offset); }
  void route(int layer, int64_t pos, std::span<int32_t> experts) override {
    inner_.route(layer, pos + offset(pos), experts);
  }
  bool predict(int layer, int64_t pos, std::span<int32_t> experts) override {
    return inner_.predict(layer, pos + offset(pos), experts);
  }

 private:
  int64_t offset(int64_t pos) const {
    for (const auto& [p, off] : table_)
      if (p == pos) return off;
    return table_.empty() ? 0 : table_.front().second;  // a prompt: one stream, its offset
  }
  RouteOverride& inner_;
  std::vector<std::pair<int64_t, int64_t>> table_;
};

std::vector<int> parse_streams(const std::string& list) {
  std::vector<int> out;
  for (const std::string& s : split(list)) {
    char* end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (end == s.c_str() || *end != 0 || v < 1 || v > 64)
      fail("--streams takes batch sizes from 1 to 64, comma-separated (e.g. 1,2,4), not '{}'", s);
    out.push_back(int(v));
  }
  if (out.empty()) fail("--streams needs at least one batch size (e.g. 1,2,4)");
  return out;
}

int32_t argmax_of(const float* row, int64_t n) { return int32_t(std::max_element(row, row + n) - row); }

// --streams, one configuration, in this process: prefills the largest batch's sequences once
// (stream i: its own pseudo-random prompt of prompt_tokens + i tokens), then for each batch size
// N decodes copies of the first N of them together for --decode steps. Prints one JSON object.
void run_streams_child(const BenchOptions& o) {
  const std::vector<int> sizes = parse_streams(o.streams);
  const int max_n = *std::max_element(sizes.begin(), sizes.end());
  const auto t_load = Clock::now();
  const EngineOptions eo = o.model.engine_options();
  Engine engine(eo);
  const double load_s = since(t_load);
  const std::shared_ptr<GpuModel> gpu = engine.gpu_model();
  if (gpu && !o.routing_trace.empty()) fail("--routing-trace replays routing on the CPU only: leave out --gpu");
  const Model& m = engine.model();
  const ModelConfig& c = engine.config();
  const int64_t V = c.vocab_size;
  Forward fwd(m, engine.backend());
  fwd.set_miss_policy(eo.on_miss);
  std::optional<RoutingTrace> trace;
  std::optional<TraceRouteOverride> replay;
  std::optional<StreamRouteOverride> per_stream;
  if (!o.routing_trace.empty()) {
    trace = read_routing_trace(o.routing_trace);
    replay.emplace(*trace, c.num_layers, c.num_experts, c.num_experts_per_tok);
    per_stream.emplace(*replay);
  }
  fwd.set_routing({.route_override = per_stream ? &*per_stream : nullptr, .predict_next = eo.predict_next});
  const int64_t trace_len = trace ? int64_t(trace->size()) : 0;
  auto offset_of = [&](int i) { return trace_len * i / max_n; };
  const ExpertSource* src = m.experts;

  // Prefill every stream once; each batch size starts from copies of these states. (On the GPU,
  // whose states live in each stream's pass, every batch size prefills its own streams.)
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SessionState> start;
  std::vector<int32_t> first;
  std::vector<float> logits;
  const auto t_prefill = Clock::now();
  int64_t prefilled = 0;
  for (int i = 0; i < max_n; ++i) {
    std::vector<int32_t> prompt = bench_prompt(o.prompt_tokens + i, int(V));
    std::mt19937 rng(uint32_t(7 + i));
    for (int32_t& id : prompt) id = int32_t((uint32_t(id) + rng()) % uint32_t(std::min<int64_t>(V, 100000)));
    prompts.push_back(prompt);
    if (gpu) continue;
    if (per_stream) per_stream->set({{0, offset_of(i)}});
    start.push_back(SessionState::create(c));
    fwd.run(start.back(), prompt, LogitsMode::Last, logits);
    first.push_back(argmax_of(logits.data(), V));
    prefilled += int64_t(prompt.size());
  }
  double prefill_s = since(t_prefill);

  // One batch size: its own Forward (buffers, profile) and copies of the first n streams; on the
  // GPU its own pass per stream and one for the batch.
  struct Run {
    int n;
    std::unique_ptr<Forward> fwd;
    std::unique_ptr<ForwardPass> runner;
    std::vector<std::unique_ptr<ForwardPass>> passes;
    std::vector<ForwardPass*> pass_ptr;
    std::vector<SessionState> st;
    std::vector<SessionState*> ptr;
    std::vector<int32_t> next;
    std::vector<std::vector<int32_t>> out;
    std::vector<float> logits;
    double secs = 0;
    ExpertStats io;  // hits, misses, bytes_read, wait_seconds summed over its steps
  };
  auto make_run = [&](int n) {
    Run r;
    r.n = n;
    r.out.resize(size_t(n));
    if (gpu) {
      r.runner = make_gpu_forward(gpu);
      const auto t0 = Clock::now();
      for (int i = 0; i < n; ++i) {
        r.passes.push_back(make_gpu_forward(gpu));
        r.pass_ptr.push_back(r.passes.back().get());
        r.st.push_back(SessionState::create(c));
        r.passes.back()->run(r.st.back(), prompts[size_t(i)], LogitsMode::Last, logits);
        r.passes.back()->release_buffers();
        r.next.push_back(argmax_of(logits.data(), V));
        prefilled += int64_t(prompts[size_t(i)].size());
      }
      prefill_s += since(t0);
      for (SessionState& x : r.st) r.ptr.push_back(&x);
      return r;
    }
    r.fwd = std::make_unique<Forward>(m, engine.backend());
    r.fwd->set_miss_policy(eo.on_miss);
    r.fwd->set_routing({.route_override = per_stream ? &*per_stream : nullptr, .predict_next = eo.predict_next});
    r.st.assign(start.begin(), start.begin() + n);
    for (SessionState& x : r.st) r.ptr.push_back(&x);
    r.next.assign(first.begin(), first.begin() + n);
    return r;
  };
  auto step = [&](Run& r) {
    if (per_stream) {
      std::vector<std::pair<int64_t, int64_t>> table;
      for (int i = 0; i < r.n; ++i) table.emplace_back(r.st[size_t(i)].pos, offset_of(i));
      per_stream->set(std::move(table));
    }
    const ExpertStats e0 = src->expert_stats();
    const auto t0 = Clock::now();
    if (r.runner)
      gpu_decode_batch(*r.runner, r.pass_ptr, r.ptr, r.next, r.logits);
    else
      r.fwd->decode_batch(r.ptr, r.next, r.logits);
    r.secs += since(t0);
    const ExpertStats e1 = src->expert_stats();
    r.io.hits += e1.hits - e0.hits;
    r.io.misses += e1.misses - e0.misses;
    r.io.bytes_read += e1.bytes_read - e0.bytes_read;
    r.io.wait_seconds += e1.wait_seconds - e0.wait_seconds;
    for (int i = 0; i < r.n; ++i) {
      r.next[size_t(i)] = argmax_of(r.logits.data() + int64_t(i) * V, V);
      r.out[size_t(i)].push_back(r.next[size_t(i)]);
    }
  };
  auto result = [&](const Run& r) {
    const Forward::Profile p = r.fwd ? r.fwd->profile() : Forward::Profile{};
    const double steps = double(o.decode);
    auto ms = [&](double v) { return v / steps * 1e3; };
    json hashes = json::array();
    for (const auto& toks : r.out) {
      uint64_t h = 1469598103934665603ull;
      for (int32_t id : toks) h = (h ^ uint64_t(uint32_t(id))) * 1099511628211ull;
      hashes.push_back(fmt::format("{:016x}", h));
    }
    return json{{"streams", r.n},
                {"steps", o.decode},
                {"seconds", r.secs},
                {"aggregate_tok_s", double(r.n) * steps / r.secs},
                {"per_stream_tok_s", steps / r.secs},
                {"hits", r.io.hits},
                {"misses", r.io.misses},
                {"bytes_read", r.io.bytes_read},
                {"wait_s", r.io.wait_seconds},
                {"acquired_per_step", double(r.io.hits + r.io.misses) / steps},
                {"profile",
                 {{"attention_ms", ms(p.attention)},
                  {"delta_net_ms", ms(p.delta_net)},
                  {"router_shared_ms", ms(p.router_shared)},
                  {"expert_compute_ms", ms(p.expert_compute)},
                  {"expert_acquire_ms", ms(p.expert_acquire)},
                  {"lm_head_ms", ms(p.lm_head)},
                  {"total_ms", r.secs / steps * 1e3}}},
                {"stream_hashes", hashes}};
  };
  // A first pass of the largest batch reads every expert the measured passes use (each stream
  // decodes the same tokens in any batch).
  if (o.warm) {
    Run w = make_run(max_n);
    for (int s = 0; s < o.decode; ++s) step(w);
  }
  // When the cache keeps every expert it reads, the batch sizes take turns step by step, so a
  // change in what else this machine runs falls on all of them alike. A smaller cache runs them
  // one after another: taking turns, one batch would find the experts another just read.
  const int cap = src->capacity();
  const bool interleave = cap == 0 || int64_t(cap) >= int64_t(c.num_layers) * c.num_experts;
  std::vector<Run> runs;
  for (int n : sizes) runs.push_back(make_run(n));
  if (interleave) {
    for (int s = 0; s < o.decode; ++s)
      for (Run& r : runs) step(r);
  } else {
    for (Run& r : runs)
      for (int s = 0; s < o.decode; ++s) step(r);
  }
  json rows = json::array();
  for (const Run& r : runs) rows.push_back(result(r));
  // On the GPU, where a step goes, part by part, for one stream (a pass of its own, prefilled again)
  // and for the largest batch (a few more of its steps, layer by layer): a few steps with a timing
  // event after each part (stderr), so each part's time at N streams can be set against one's.
  if (gpu && std::find(sizes.begin(), sizes.end(), 1) != sizes.end()) {
    std::unique_ptr<ForwardPass> one = make_gpu_forward(gpu, /*profile=*/true);
    SessionState st = SessionState::create(c);
    one->run(st, prompts[0], LogitsMode::Last, logits);
    for (int s = 0; s < std::min(o.decode, 8); ++s) {
      const int32_t next = argmax_of(logits.data(), V);
      one->run(st, std::span(&next, 1), LogitsMode::Last, logits);
    }
    std::fprintf(stderr, "GPU time of a 1-stream step by part (profiled, launch by launch):\n%s\n",
                 gpu_decode_profile(*one).c_str());
  }
  if (gpu && !runs.empty() && runs.back().n > 1) {
    Run& r = runs.back();
    r.runner = make_gpu_forward(gpu, /*profile=*/true);
    for (int s = 0; s < std::min(o.decode, 8); ++s) step(r);
    std::fprintf(stderr, "GPU time of a %d-stream step by part (profiled, launch by launch):\n%s\n", r.n,
                 gpu_decode_profile(*r.runner).c_str());
  }

  const QpackContainer qc = QpackContainer::open(o.model.model);
  const bool tied = m.weights.lm_head.data == m.weights.embed_tokens.data;
  const uint64_t dense = engine.loaded().memory.resident - (tied ? 0 : m.weights.embed_tokens.total_bytes());
  const ExpertStats es = src->expert_stats();
  json j = {{"load_s", load_s},
            {"peak_rss", peak_rss_bytes()},
            {"prefill_tok_s", double(prefilled) / prefill_s},
            {"dense_bytes", dense},
            {"expert_bytes", qc.layout.payload()},
            {"cache_budget", es.cache_budget},
            {"interleaved", interleave},
            {"rows", rows}};
  j["memory_gb_s"] = measure_memory_bandwidth(run_memory_bytes(o));
  std::printf("%s\n", j.dump().c_str());
}

// "cpu (avx512-vnni)": the backend and, for the fast CPU kernels, the instruction set they run.
std::string backend_name(const ModelFlags& m) {
  if (m.backend == "reference") return m.backend;
  return fmt::format("{} ({})", m.backend, isa_name(cpu_isa()));
}

std::string pred_name(int depth) { return depth == 0 ? "off" : fmt::format("+{}", depth); }

std::string child_args(const BenchOptions& o, const std::string& cache, const std::string& io, int predict,
                       const std::string& on_miss) {
  const ModelFlags& m = o.model;
  std::string a = fmt::format("bench '{}' --child --backend {} --io {} --prompt-tokens {} --decode {}", m.model,
                              m.backend, io, o.prompt_tokens, o.decode);
  if (m.threads > 0) a += fmt::format(" --threads {}", m.threads);
  if (m.isa != "auto") a += " --isa " + m.isa;
  if (m.no_verify) a += " --no-verify";
  if (o.memory_mb != BenchOptions{}.memory_mb) a += fmt::format(" --memory-mb {}", o.memory_mb);
  a += " --resident " + m.resident;
  a += fmt::format(" --predict-next {} --on-miss {}", predict, on_miss);
  if (o.warm) a += " --warm";
  if (!o.routing_trace.empty()) a += fmt::format(" --routing-trace '{}'", o.routing_trace);
  if (!o.streams.empty()) a += fmt::format(" --streams {}", o.streams);
  if (m.chunked_prefill) a += " --chunked-prefill";
  if (m.gpu) a += " --gpu";
  if (!m.gpu_cache_gb.empty()) a += " --gpu-cache-gb " + m.gpu_cache_gb;
  if (cache == "all") a += " --cache-gb all";
  else if (cache.rfind("budget:", 0) == 0) a += " --ram-budget " + cache.substr(7);
  else if (cache != "default") a += fmt::format(" --cache-mb {}", double(parse_bytes(cache, "--cache")) / 1e6);
  return a;
}

json run_config(const BenchOptions& o, const std::string& cache, const std::string& io, int predict,
                const std::string& on_miss) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) fail("cannot find this executable (/proc/self/exe)");
  self[n] = 0;
  const std::string cmd = fmt::format("'{}' {}", self, child_args(o, cache, io, predict, on_miss));
  std::fprintf(stderr, "bench: %s\n", cmd.c_str());
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) fail("cannot run '{}'", cmd);
  std::string out;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  const int st = ::pclose(p);
  if (st != 0) fail("the benchmark run '{}' failed (status {}); its error is above", cmd, st);
  json j = json::parse(out, nullptr, false);
  if (j.is_discarded()) fail("the benchmark run '{}' printed no result", cmd);
  j["cache"] = cache;
  j["io"] = io;
  j["predict"] = predict;
  j["on_miss"] = on_miss;
  j["mode"] = on_miss_label(on_miss);
  return j;
}

// --streams: one table of every configuration's batch sizes, each against its configuration's
// first batch size (measured in the same process), and whether each stream decoded the same tokens
// in every batch it was part of.
void report_streams(const BenchOptions& o, const QpackContainer& qc, const std::string& routing, json& rows,
                    double membw, double disk) {
  bool same = true;
  std::string table = fmt::format(
      "{:<12} {:<6} {:<5} {:>3} {:>9} {:>9} {:>6} {:>6} {:>8} {:>6} {:>8} {:>7} {:>6} | {:>6} {:>6} {:>6} {:>6} {:>6} "
      "{:>6} {:>7}  {}\n",
      "cache", "io", "pred", "N", "aggregate", "perstream", "xagg", "xper", "experts", "hit%", "MB read", "IOwait",
      "%mem", "attn", "gdn", "rt+sh", "expert", "wait", "lmhead", "step", "mode");
  table += fmt::format(
      "{:<12} {:<6} {:<5} {:>3} {:>9} {:>9} {:>6} {:>6} {:>8} {:>6} {:>8} {:>7} {:>6} | {:>6} {:>6} {:>6} {:>6} {:>6} "
      "{:>6} {:>7}\n",
      "", "", "", "", "tok/s", "tok/s", "", "", "/step", "", "/step", "%", "", "ms", "ms", "ms", "ms", "ms", "ms", "ms");
  for (json& cfg : rows) {
    std::string cache = cfg["cache"].get<std::string>();
    if (cache == "default") cache = fmt::format("def {:.2f}G", double(cfg["cache_budget"].get<uint64_t>()) / 1e9);
    const json& runs = cfg["rows"];
    const double base_agg = runs[0]["aggregate_tok_s"].get<double>();
    const double base_per = runs[0]["per_stream_tok_s"].get<double>();
    std::vector<std::string> hashes;
    for (const json& r : runs) {
      const json& h = r["stream_hashes"];
      for (size_t i = 0; i < h.size(); ++i) {
        if (i >= hashes.size()) hashes.push_back(h[i].get<std::string>());
        else same = same && hashes[i] == h[i].get<std::string>();
      }
      const double steps = double(r["steps"].get<int64_t>());
      const uint64_t hits = r["hits"], misses = r["misses"];
      const double acquired = r["acquired_per_step"].get<double>();
      // Weight bytes a step reads: the dense matrices once, each acquired expert once.
      const double bytes = double(cfg["dense_bytes"].get<uint64_t>()) + acquired * double(cfg["expert_bytes"].get<uint64_t>());
      const double mem_bound = membw * 1e9 / bytes * double(r["streams"].get<int>());
      const double agg = r["aggregate_tok_s"].get<double>();
      const json& pf = r["profile"];
      // On the GPU the host's memory bound and the CPU pass's parts do not apply: "-".
      auto cpu_only = [&](double v) { return o.model.gpu ? std::string("-") : fmt::format("{:.1f}", v); };
      table += fmt::format(
          "{:<12} {:<6} {:<5} {:>3} {:>9.2f} {:>9.2f} {:>6.2f} {:>6.2f} {:>8.1f} {:>6.1f} {:>8.1f} {:>7.1f} {:>6} | "
          "{:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7.1f}  {}\n",
          cache, cfg["io"].get<std::string>(), pred_name(cfg["predict"].get<int>()), r["streams"].get<int>(), agg,
          r["per_stream_tok_s"].get<double>(), agg / base_agg, r["per_stream_tok_s"].get<double>() / base_per,
          acquired, hits + misses ? 100.0 * double(hits) / double(hits + misses) : 0.0,
          double(r["bytes_read"].get<uint64_t>()) / 1e6 / steps, 100.0 * r["wait_s"].get<double>() / r["seconds"].get<double>(),
          cpu_only(100.0 * agg / mem_bound), cpu_only(pf["attention_ms"].get<double>()),
          cpu_only(pf["delta_net_ms"].get<double>()), cpu_only(pf["router_shared_ms"].get<double>()),
          cpu_only(pf["expert_compute_ms"].get<double>()), cpu_only(pf["expert_acquire_ms"].get<double>()),
          cpu_only(pf["lm_head_ms"].get<double>()), pf["total_ms"].get<double>(), cfg["mode"].get<std::string>());
    }
  }
  if (o.json) {
    json all = {{"model", o.model.model}, {"routing", routing}, {"memory_gb_s", membw}, {"disk_gb_s", disk},
                {"streams", rows}, {"same_tokens", same}};
    std::printf("%s\n", all.dump(1).c_str());
    return;
  }
  std::printf("model %s: %d layers x %d experts, top-%d, %llu bytes per expert\n", o.model.model.c_str(),
              qc.config.num_layers, qc.config.num_experts, qc.config.num_experts_per_tok,
              (unsigned long long)qc.layout.payload());
  std::printf(
      "batched decoding (--streams %s): stream i prefills its own prompt of %d + i tokens, then N streams "
      "decode %d tokens each greedily, one decode_batch a step; backend %s%s\n",
      o.streams.c_str(), o.prompt_tokens, o.decode, o.model.gpu ? "gpu" : backend_name(o.model).c_str(),
      o.warm ? "; measured after a first pass of the largest batch filled the cache" : "");
  std::printf("routing: %s%s\n", routing.c_str(),
              o.routing_trace.empty() ? "" : " (stream i replays its own region of the trace, from i / (largest N) of its length on)");
  std::printf("xagg, xper: aggregate and per-stream tok/s over the first N's of the same configuration (same process); "
              "experts/step: routed experts acquired a step (the union of the streams' choices, all layers); %%mem: "
              "aggregate over the memory bound (%.1f GB/s / (dense weights + acquired experts) x N); disk %.2f GB/s\n\n",
              membw, disk);
  std::printf("%s\n", table.c_str());
  for (const json& cfg : rows)
    std::printf("%s: the batch sizes ran %s\n", cfg["cache"].get<std::string>().c_str(),
                cfg.value("interleaved", false) ? "in turns, one step each (the cache holds every expert)"
                                                : "one after another (the cache is smaller than the model)");
  std::printf("each stream decoded the same tokens in every batch it was in: %s\n", same ? "yes" : "NO");
}

void run_bench(const BenchOptions& o) {
  if (o.child) return o.streams.empty() ? run_child(o) : run_streams_child(o);
  if (o.decode < 2) fail("--decode must be at least 2 tokens");
  if (!looks_like_qpack(o.model.model)) fail("swiftlet bench measures expert streaming: give it a .qpack container");
  const QpackContainer qc = QpackContainer::open(o.model.model);
  std::string routing = "the model's own router";
  if (!o.routing_trace.empty()) {
    const RoutingTrace t = read_routing_trace(o.routing_trace);  // refused here, before any run
    routing = fmt::format("replayed from {} ({} tokens, {} layers x {} experts, top-{}{})", o.routing_trace, t.size(),
                          t.layers, t.experts, t.top_k, t.has_predictions ? ", with its next-layer guesses" : "");
  }
  for (const std::string& c : split(o.cache))
    if (c != "default" && c != "all" && c.rfind("budget:", 0) != 0) parse_bytes(c, "--cache");
  for (const std::string& io : split(o.io)) parse_io_mode(io);
  if (o.model.isa != "auto") set_cpu_isa(parse_isa(o.model.isa));  // refused here, before any run
  if (!o.streams.empty()) {
    parse_streams(o.streams);  // refused here, before any run
  }
  const std::vector<std::string> on_miss = on_miss_settings(o.model.on_miss);  // refused here, before any run

  // The disk first: random reads of whole experts, as decode does them.
  const int k = std::max(1, qc.config.num_experts_per_tok);
  // This disk's rate varies from minute to minute: it is measured before and after the runs and
  // the best figure is the bound (the strictest one).
  std::fprintf(stderr, "bench: measuring random expert reads for %g s each...\n", o.disk_seconds);
  double disk_qd1 = measure_disk(qc, IoMode::Serial, 1, o.disk_seconds);
  double disk_qdk = measure_disk(qc, IoMode::Uring, k, o.disk_seconds);
  double disk_qd32 = measure_disk(qc, IoMode::Uring, 32, o.disk_seconds);
  if (o.model.threads > 0) ThreadPool::set_global_threads(o.model.threads);
  const double membw_before = measure_memory_bandwidth(size_t(o.memory_mb * 1048576));

  json rows = json::array();
  for (const std::string& cache : split(o.cache))
    for (const std::string& io : split(o.io))
      for (const std::string& pr : split(o.predict)) {
        const int depth = pr == "off" ? 0 : pr == "on" ? 1 : std::atoi(pr.c_str());
        if (depth < 0 || depth > 4 || (depth == 0 && pr != "off" && pr != "0"))
          fail("--predict takes off, on or a number of layers ahead (1-4), not '{}'", pr);
        if (depth > 0 && io == "serial") continue;  // serial mode reads nothing ahead
        for (const std::string& m : on_miss) rows.push_back(run_config(o, cache, io, depth, m));
      }

  std::fprintf(stderr, "bench: measuring random expert reads again...\n");
  disk_qd1 = std::max(disk_qd1, measure_disk(qc, IoMode::Serial, 1, o.disk_seconds));
  disk_qdk = std::max(disk_qdk, measure_disk(qc, IoMode::Uring, k, o.disk_seconds));
  disk_qd32 = std::max(disk_qd32, measure_disk(qc, IoMode::Uring, 32, o.disk_seconds));
  const double disk = std::max({disk_qd1, disk_qdk, disk_qd32});
  // Memory bandwidth: the best of the parent's measurement before the runs and each run's own
  // right after its decode (the strictest bound).
  double membw = membw_before;
  for (const json& r : rows) membw = std::max(membw, r["memory_gb_s"].get<double>());
  if (!o.streams.empty()) return report_streams(o, qc, routing, rows, membw, disk);
  const uint64_t stride = qc.layout.expert_stride;
  // Exact rows must all generate the same tokens; a lossy row is compared with them.
  std::string first_hash;
  for (const json& r : rows)
    if (first_hash.empty() && r["on_miss"] == "exact") first_hash = r["tokens_hash"].get<std::string>();
  bool same = true;
  std::string lossy_same;
  std::string table = fmt::format(
      "{:<12} {:<6} {:<5} {:>6} {:>8} {:>9} {:>8} {:>6} {:>9} {:>8} {:>7} {:>9} {:>7} {:>6} {:>6}  {}\n", "cache",
      "io", "pred", "load", "peakRSS", "prefill", "decode", "hit%", "MB/token", "read", "IOwait", "disk-bnd", "%bound",
      "pacc", "skip", "mode");
  table += fmt::format("{:<12} {:<6} {:<5} {:>6} {:>8} {:>9} {:>8} {:>6} {:>9} {:>8} {:>7} {:>9} {:>7} {:>6} {:>6}\n",
                       "", "", "", "s", "GB", "tok/s", "tok/s", "", "", "GB/s", "%", "tok/s", "", "%", "/tok");
  std::string compute = fmt::format(
      "{:<12} {:<6} {:<5} {:>8} {:>9} {:>6} | {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7}  {}\n", "cache", "io", "pred",
      "decode", "mem-bnd", "%mem", "attn", "gdn", "rt+sh", "expert", "wait", "lmhead", "token", "mode");
  compute += fmt::format("{:<12} {:<6} {:<5} {:>8} {:>9} {:>6} | {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7}\n", "", "",
                         "", "tok/s", "tok/s", "", "ms", "ms", "ms", "ms", "ms", "ms", "ms");
  std::string prefill_rows = fmt::format("{:<12} {:<6} {:<5} {:>8} | {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7}  {}\n",
                                         "cache", "io", "pred", "prefill", "attn", "gdn", "rt+sh", "expert", "wait",
                                         "lmhead", "token", "mode");
  for (json& r : rows) {
    const double decode_s = r["decode_s"].get<double>();
    const double per_token = double(r["bytes_read"].get<uint64_t>()) / double(r["decode_tokens"].get<int64_t>());
    const double bound = per_token > 0 ? disk * 1e9 / per_token : 0;
    const double tok_s = r["decode_tok_s"].get<double>();
    const uint64_t hits = r["hits"], misses = r["misses"];
    const double read_s = r["read_s"].get<double>();
    r["disk_bound_tok_s"] = bound;
    if (r["on_miss"] == "exact") same = same && r["tokens_hash"] == first_hash;
    else if (!first_hash.empty())
      lossy_same += fmt::format("{}{} {}: {}", lossy_same.empty() ? "" : ", ", r["cache"].get<std::string>(),
                                r["on_miss"].get<std::string>(), r["tokens_hash"] == first_hash ? "same" : "differ");
    std::string cache = r["cache"].get<std::string>();
    if (cache == "default") cache = fmt::format("def {:.2f}G", double(r["cache_budget"].get<uint64_t>()) / 1e9);
    table += fmt::format(
        "{:<12} {:<6} {:<5} {:>6.2f} {:>8.2f} {:>9.2f} {:>8.2f} {:>6.1f} {:>9.1f} {:>8.2f} {:>7.1f} {:>9.2f} {:>7.1f} {:>6} "
        "{:>6.1f}  {}\n",
        cache, r["io"].get<std::string>(), pred_name(r["predict"].get<int>()), r["load_s"].get<double>(),
        double(r["peak_rss"].get<uint64_t>()) / 1e9, r["prefill_tok_s"].get<double>(), tok_s,
        hits + misses ? 100.0 * double(hits) / double(hits + misses) : 0.0, per_token / 1e6,
        read_s > 0 ? double(r["bytes_read"].get<uint64_t>()) / 1e9 / read_s : 0.0,
        decode_s > 0 ? 100.0 * r["wait_s"].get<double>() / decode_s : 0.0, bound,
        bound > 0 ? 100.0 * tok_s / bound : 0.0,
        r["predict"].get<int>() ? fmt::format("{:.0f}", 100 * r["prediction_accuracy"].get<double>()) : "-",
        double(r.value("skipped", uint64_t(0))) / double(r["decode_tokens"].get<int64_t>()), r["mode"].get<std::string>());
    const double mem_bound = membw * 1e9 / double(r["bytes_touched_per_token"].get<uint64_t>());
    r["memory_bound_tok_s"] = mem_bound;
    const json& pp = r["prefill_profile"];
    prefill_rows += fmt::format(
        "{:<12} {:<6} {:<5} {:>8.2f} | {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f} {:>7.2f}  {}\n", cache,
        r["io"].get<std::string>(), pred_name(r["predict"].get<int>()), r["prefill_tok_s"].get<double>(),
        pp["attention_ms"].get<double>(), pp["delta_net_ms"].get<double>(), pp["router_shared_ms"].get<double>(),
        pp["expert_compute_ms"].get<double>(), pp["expert_acquire_ms"].get<double>(), pp["lm_head_ms"].get<double>(),
        pp["total_ms"].get<double>(), r["mode"].get<std::string>());
    const json& pf = r["profile"];
    compute += fmt::format(
        "{:<12} {:<6} {:<5} {:>8.2f} {:>9.2f} {:>6.1f} | {:>6.1f} {:>6.1f} {:>6.1f} {:>6.1f} {:>6.1f} {:>6.1f} {:>7.1f}  {}\n",
        cache, r["io"].get<std::string>(), pred_name(r["predict"].get<int>()), tok_s, mem_bound,
        100.0 * tok_s / mem_bound, pf["attention_ms"].get<double>(), pf["delta_net_ms"].get<double>(),
        pf["router_shared_ms"].get<double>(), pf["expert_compute_ms"].get<double>(),
        pf["expert_acquire_ms"].get<double>(), pf["lm_head_ms"].get<double>(), pf["total_ms"].get<double>(),
        r["mode"].get<std::string>());
  }
  if (o.json) {
    json all = {{"model", o.model.model}, {"routing", routing}, {"expert_stride", stride}, {"memory_gb_s", membw}, {"memory_gb_s_before", membw_before}, {"disk_gb_s_qd1", disk_qd1},
                {"disk_gb_s_qdk", disk_qdk}, {"disk_gb_s_qd32", disk_qd32}, {"rows", rows},
                {"same_tokens", same}};
    std::printf("%s\n", all.dump(1).c_str());
    return;
  }
  std::printf("model %s: %d layers x %d experts, top-%d, %llu bytes per expert read\n", o.model.model.c_str(),
              qc.config.num_layers, qc.config.num_experts, k, (unsigned long long)stride);
  std::printf("prompt %d tokens, then %d tokens decoded greedily; backend %s; dense weights: %s%s\n", o.prompt_tokens,
              o.decode, backend_name(o.model).c_str(), o.model.resident.c_str(),
              o.warm ? "; measured on a second pass (the first one filled the cache)" : "");
  std::printf("routing: %s\n", routing.c_str());
  std::printf("disk, random whole-expert reads (O_DIRECT), best of before and after the runs: %.2f GB/s one at a "
              "time (pread), %.2f GB/s with %d in flight (io_uring), %.2f GB/s with 32 in flight\n",
              disk_qd1, disk_qdk, k, disk_qd32);
  std::printf("disk bound = %.2f GB/s / bytes read per decoded token at the hit rate measured\n\n", disk);
  std::printf("%s\n", table.c_str());
  std::string after;
  for (const json& r : rows) after += fmt::format("{}{:.1f}", after.empty() ? "" : ", ", r["memory_gb_s"].get<double>());
  std::printf("compute: memory read bandwidth %.1f GB/s = best of %.1f before the runs and %s right after each "
              "run's decode; memory bound = that / weight bytes one token reads (dense matrices + top-k experts per "
              "layer). Decode time per token by part:\n\n%s\n",
              membw, membw_before, after.c_str(), compute.c_str());
  std::printf("prefill time per prompt token by part (ms):\n\n%s\n", prefill_rows.c_str());
  std::string gpu_rows;
  for (const json& r : rows) {
    if (!r.value("on_gpu", false)) continue;
    const json& gj = r["gpu"];
    const uint64_t gh = gj["hits"], gm = gj["misses"];
    gpu_rows += fmt::format("{:<12} {:<6} {:<5} {:>8.2f} {:>9.2f} {:>9.2f} {:>7.1f} {:>10.1f} {:>10.2f}\n",
                            r["cache"].get<std::string>(), r["io"].get<std::string>(),
                            pred_name(r["predict"].get<int>()), r["decode_tok_s"].get<double>(),
                            double(gj["dense_bytes"].get<uint64_t>()) / 1e9,
                            double(gj["cache_bytes"].get<uint64_t>()) / 1e9,
                            gh + gm ? 100.0 * double(gh) / double(gh + gm) : 0.0,
                            double(gj["bytes_uploaded"].get<uint64_t>()) / 1e6 /
                                double(std::max<int64_t>(1, r["decode_tokens"].get<int64_t>())),
                            gj["upload_gb_s"].get<double>());
  }
  if (!gpu_rows.empty())
    std::printf("GPU runs (the CPU profile above does not apply to them): VRAM used by the dense weights and the "
                "expert cache, the VRAM cache's hit rate, and uploads from the host per generated token:\n\n"
                "%-12s %-6s %-5s %8s %9s %9s %7s %10s %10s\n%s\n",
                "cache", "io", "pred", "decode", "denseGB", "cacheGB", "hit%", "upMB/tok", "upGB/s", gpu_rows.c_str());
  std::printf("every exact configuration generated the same %d tokens: %s\n", o.decode, same ? "yes" : "NO");
  if (!lossy_same.empty()) std::printf("lossy configurations against the exact tokens: %s\n", lossy_same.c_str());
  if (o.routing_trace.empty())
    std::printf("note: random-weight models route almost uniformly, so these hit rates are a worst case; real "
                "models reuse experts far more (replay a real model's routing with --routing-trace).\n");
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "expert-streaming benchmark: prefill + decode at several cache settings");
  o->model.add(cmd);
  cmd->add_option("--cache", o->cache,
                  "cache settings to compare, comma-separated: default, all, a size (1.5G, 800M) or budget:SIZE "
                  "(a --ram-budget)");
  cmd->add_option("--io-modes", o->io, "IO modes to compare (uring,serial)");
  cmd->add_option("--predict", o->predict, "next-layer prediction to compare: off, on (1 layer ahead) or layers ahead, e.g. off,1,2");
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "prompt length (fixed pseudo-random ids)");
  cmd->add_option("--decode", o->decode, "tokens to decode");
  cmd->add_option("--disk-seconds", o->disk_seconds, "seconds per disk read-rate measurement");
  cmd->add_option("--memory-mb", o->memory_mb,
                  "MiB read to measure the memory bandwidth (default 1024; each run reads a quarter, at most 256); "
                  "keep it well above the last-level cache")
      ->check(CLI::Range(1.0, 1048576.0));
  cmd->add_flag("--json", o->json, "print the results as JSON");
  cmd->add_option("--routing-trace", o->routing_trace,
                  "route with the experts recorded in this --trace-experts file instead of the model's router "
                  "(layers and experts mapped as docs/routing-trace.md says)");
  cmd->add_option("--streams", o->streams,
                  "batched decoding instead: batch sizes to compare, e.g. 1,2,4 (N sequences with prompts of their "
                  "own decoded together by one Forward::decode_batch a step, each N in the same process)");
  cmd->add_flag("--warm", o->warm, "run each configuration twice and measure the second pass (cache filled)");
  cmd->add_flag("--child", o->child, "(internal) run one configuration and print its JSON")->group("");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace swiftlet::cli
