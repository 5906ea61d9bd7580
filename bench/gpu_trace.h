// A kernel timeline of the GPU through CUPTI (bench/gpu_trace.cpp; built where CMake finds CUPTI,
// SWIFTLET_HAVE_CUPTI).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace swiftlet::bench {

struct KernelSpan {
  std::string name;      // demangled, without namespaces and parameters
  uint64_t start, end;   // ns, GPU timestamps
  int grid;              // blocks
};

// Records every kernel from trace_start to trace_stop (graph nodes included); throws on CUPTI errors.
void trace_start();
std::vector<KernelSpan> trace_stop();  // sorted by start
// Per kernel (and its predecessor): count, duration, gap after its predecessor's end (negative:
// started early, PDL), and what it adds to the step's critical path; largest first.
std::string trace_summary(const std::vector<KernelSpan>& spans, int steps);

}  // namespace swiftlet::bench
