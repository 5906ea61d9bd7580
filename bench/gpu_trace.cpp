// The kernel timeline of GPU decode steps through CUPTI's activity API (concurrent-kernel records:
// start and end of every kernel, graph nodes included, without serialising them), summarised per
// kernel: how long each runs, and how much it adds to the step (its end minus its predecessor's
// end). Built into swiftlet_bench_gpu_decode where CMake finds CUPTI.
#include "gpu_trace.h"

#include <cupti.h>

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

namespace swiftlet::bench {
namespace {

std::mutex g_mu;
std::vector<KernelSpan> g_spans;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  throw std::runtime_error(std::string("CUPTI: ") + what + ": " + (msg ? msg : "error"));
}

// "swiftlet::cuda::(anonymous namespace)::tc_matvec_kernel<4, 16>(...)" -> "tc_matvec_kernel<4, 16>".
std::string short_name(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : mangled;
  for (size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(p, 23);
  if (const size_t p = s.find('('); p != std::string::npos) s.resize(p);  // the parameters
  if (const size_t p = s.rfind("::", s.find('<')); p != std::string::npos) s = s.substr(p + 2);
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = size_t(8) << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = kBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    g_spans.push_back({short_name(k->name), k->start, k->end, k->gridX * k->gridY * k->gridZ});
  }
  std::free(buffer);
}

}  // namespace

void trace_start() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_spans.clear();
  }
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable");
}

std::vector<KernelSpan> trace_stop() {
  check(cuptiActivityFlushAll(1), "flush");
  check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disable");
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<KernelSpan> out = std::move(g_spans);
  g_spans.clear();
  std::sort(out.begin(), out.end(), [](const KernelSpan& a, const KernelSpan& b) { return a.start < b.start; });
  return out;
}

std::string trace_summary(const std::vector<KernelSpan>& spans, int steps) {
  if (spans.empty() || steps < 1) return "no kernels traced\n";
  // A kernel is known by its name and its predecessor's (one matvec kernel runs qkvz, out_proj,
  // router and lm_head).
  struct Row {
    int order = 0;
    int64_t n = 0;
    double dur_us = 0, adds_us = 0, start_gap_us = 0;
    int grid = 0;
  };
  std::map<std::string, Row> rows;
  double total_adds = 0, total_dur = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const KernelSpan& k = spans[i];
    const std::string key = k.name + (i ? "  after " + spans[i - 1].name : "");
    Row& r = rows[key];
    if (r.n == 0) r.order = int(rows.size());
    ++r.n;
    r.grid = k.grid;
    const double dur = double(k.end - k.start) / 1e3;
    // What this kernel adds to the step: its end past its predecessor's (the idle gap before it
    // included; nothing where it ends first).
    const double adds = i ? std::max(0.0, (double(k.end) - double(spans[i - 1].end)) / 1e3) : dur;
    const double gap = i ? (double(k.start) - double(spans[i - 1].end)) / 1e3 : 0.0;
    r.dur_us += dur;
    r.adds_us += adds;
    r.start_gap_us += gap;
    total_adds += adds;
    total_dur += dur;
  }
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.adds_us > b.second.adds_us; });
  const double span_us = double(spans.back().end - spans.front().start) / 1e3;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "kernel timeline (CUPTI), %d steps: %zu kernels, %.1f us a step end to end; per step: kernels "
                "running %.1f us in all, their critical-path share %.1f us\n",
                steps, spans.size(), span_us / steps, total_dur / steps, total_adds / steps);
  out += line;
  std::snprintf(line, sizeof line, "%-70s %6s %6s %9s %9s %9s %9s\n", "kernel (after its predecessor)", "n/step",
                "grid", "dur us", "gap us", "adds us", "us/step");
  out += line;
  for (const auto& [key, r] : sorted) {
    const double n = double(r.n);
    std::snprintf(line, sizeof line, "%-70.70s %6.1f %6d %9.2f %9.2f %9.2f %9.1f\n", key.c_str(), n / steps, r.grid,
                  r.dur_us / n, r.start_gap_us / n, r.adds_us / n, r.adds_us / steps);
    out += line;
  }
  return out;
}

}  // namespace swiftlet::bench
