// swiftlet cachesim TRACE [--sizes 2,5,10,20,40,60] [--policies lfu,lfu-global,lru,layer,belady] [--json|--csv]
// Hit rate of expert caches of several sizes (a share of all layers x experts) replayed over a
// routing trace (experts/cache_sim.h), plus the trace's locality: how many of a token's experts
// the previous token used, and how often next-layer prediction was right (when recorded).
#include "cli_util.h"
#include "commands.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "experts/cache_sim.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>

namespace swiftlet::cli {

namespace {
using json = nlohmann::json;

struct CacheSimOptions {
  std::string trace, sizes = "2,5,10,15,20,30,40,50,60", policies = "lfu,lfu-global,lru,layer,belady";
  bool json = false, csv = false;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void run_cachesim(const CacheSimOptions& o) {
  if (o.json && o.csv) fail("give --json or --csv, not both");
  std::vector<double> pcts;
  for (std::string s : split_list(o.sizes)) {
    if (!s.empty() && s.back() == '%') s.pop_back();
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != s.size() || !(v > 0 && v <= 100))
      fail("--sizes: '{}' is not a share of all experts in percent (0-100], e.g. 2,5,10%", s);
    pcts.push_back(v);
  }
  if (pcts.empty()) fail("--sizes: no sizes given");
  std::vector<CachePolicy> policies;
  for (const std::string& p : split_list(o.policies)) policies.push_back(parse_cache_policy(p));
  if (policies.empty()) fail("--policies: none given");

  const RoutingTrace t = read_routing_trace(o.trace);
  if (t.size() == 0) fail("the routing trace '{}' holds no tokens", o.trace);
  const int64_t all = int64_t(t.layers) * t.experts;
  std::vector<int64_t> slots;
  for (double p : pcts) slots.push_back(std::max<int64_t>(1, std::llround(p / 100.0 * double(all))));
  // Every (size, policy) is independent: spread them over the threads.
  std::vector<CacheSimResult> res(pcts.size() * policies.size());
  ThreadPool::global().parallel_for(int64_t(res.size()), [&](int64_t i) {
    res[size_t(i)] = simulate_cache(t, policies[size_t(i) % policies.size()], slots[size_t(i) / policies.size()]);
  });
  const TraceLocality loc = trace_locality(t);

  auto cell = [&](size_t s, size_t p) -> const CacheSimResult& { return res[s * policies.size() + p]; };
  if (o.csv) {
    std::printf("size_pct,slots");
    for (CachePolicy p : policies) std::printf(",%s", cache_policy_name(p));
    std::printf("\n");
    for (size_t s = 0; s < pcts.size(); ++s) {
      std::printf("%g,%lld", pcts[s], (long long)slots[s]);
      for (size_t p = 0; p < policies.size(); ++p)
        std::printf(cell(s, p).feasible ? ",%.6f" : ",", cell(s, p).hit_rate());
      std::printf("\n");
    }
    return;
  }
  if (o.json) {
    json rows = json::array();
    for (size_t s = 0; s < pcts.size(); ++s)
      for (size_t p = 0; p < policies.size(); ++p) {
        const CacheSimResult& r = cell(s, p);
        json row = {{"size_pct", pcts[s]}, {"slots", slots[s]}, {"policy", cache_policy_name(policies[p])},
                    {"feasible", r.feasible}};
        if (r.feasible) {
          row["hits"] = r.hits;
          row["misses"] = r.misses;
          row["hit_rate"] = r.hit_rate();
        }
        rows.push_back(row);
      }
    json j = {{"trace", o.trace},
              {"tokens", t.size()},
              {"layers", t.layers},
              {"experts", t.experts},
              {"top_k", t.top_k},
              {"reuse_next_token", loc.reuse_next_token},
              {"rows", rows}};
    if (loc.predicted_steps) {
      j["prediction_accuracy"] = loc.prediction_accuracy;  // recall
      j["prediction_precision"] = loc.prediction_precision;
      j["prediction_new_recall"] = loc.new_expert_recall;
      j["prediction_new_precision"] = loc.new_expert_precision;
      j["predicted_steps"] = loc.predicted_steps;
    }
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  std::printf("trace %s: %zu tokens, %d layers x %d experts, top-%d\n", o.trace.c_str(), t.size(), t.layers,
              t.experts, t.top_k);
  std::printf("a token's experts also used by the previous token (same layer): %.1f%%\n", 100 * loc.reuse_next_token);
  if (loc.predicted_steps)
    std::printf("next-layer prediction (%llu steps with a guess): recall %.1f%% (routed experts guessed), "
                "precision %.1f%% (guesses routed);\n  over experts the previous token did not use: recall "
                "%.1f%%, precision %.1f%%\n",
                (unsigned long long)loc.predicted_steps, 100 * loc.prediction_accuracy, 100 * loc.prediction_precision,
                100 * loc.new_expert_recall, 100 * loc.new_expert_precision);
  else
    std::printf("next-layer prediction: not recorded (trace a decoding run with --predict-next)\n");
  std::printf("\nhit rate by cache size (share of all %lld experts; decode order, cold start):\n\n%8s %8s",
              (long long)all, "size%", "experts");
  for (CachePolicy p : policies) std::printf(" %8s", cache_policy_name(p));
  std::printf("\n");
  for (size_t s = 0; s < pcts.size(); ++s) {
    std::printf("%8g %8lld", pcts[s], (long long)slots[s]);
    for (size_t p = 0; p < policies.size(); ++p)
      std::printf(" %8s", cell(s, p).feasible ? fmt::format("{:.1f}%", 100 * cell(s, p).hit_rate()).c_str() : "-");
    std::printf("\n");
  }
  std::printf("\nlfu: the engine's policy (ExpertCache, layer shares); lfu-global: its ranking over all layers; "
              "layer: strict per-layer pools of it; belady: offline optimum; "
              "-: the cache (or a layer's pool) holds fewer than top-%d experts\n", t.top_k);
}
}  // namespace

void add_cachesim_command(CLI::App& app) {
  auto o = std::make_shared<CacheSimOptions>();
  auto* cmd = app.add_subcommand("cachesim", "expert-cache hit rates replayed over a routing trace (--trace-experts)");
  cmd->add_option("trace", o->trace, "routing trace written by --trace-experts")->required();
  cmd->add_option("--sizes", o->sizes, "cache sizes in percent of all experts, comma-separated");
  cmd->add_option("--policies", o->policies, "lfu (the engine's), lfu-global (no layer shares), lru, layer (per-layer pools), belady (optimum)");
  cmd->add_flag("--json", o->json, "print the results as JSON");
  cmd->add_flag("--csv", o->csv, "print a CSV table (size_pct, slots, one hit-rate column per policy)");
  cmd->callback([o] { run_cachesim(*o); });
}

}  // namespace swiftlet::cli
