// Phase timestamps of the decode kernels, a development tool (cmake -DSWIFTLET_GPU_PROBE=ON; off
// by default, and then probe() is empty). Thread 0 of each block of a kernel of kind `kind` writes
// %globaltimer and clock64 at mark m into the buffer probe_begin() (matvec.cu) installs;
// probe_end() reports per mark when the blocks passed it. The last launch of a kind in the step is
// what remains. Without relocatable device code each translation unit that probes has a pointer of
// its own (g_probe, internal linkage), which probe_begin sets through probe_install_* functions.
// Not part of the API.
#pragma once

namespace swiftlet::cuda {

enum ProbeKind { kProbeAct, kProbeDown, kProbeProduct, kProbeDeltaNet, kProbeKinds };

#ifdef SWIFTLET_GPU_PROBE
constexpr int kProbeBlocks = 256, kProbeMarks = 16;
void probe_install_deltanet(unsigned long long* buf);  // deltanet.cu
void probe_install_experts(unsigned long long* buf);   // moe_experts_sm90.cu
namespace {
__device__ unsigned long long* g_probe;  // [kind][block][kProbeMarks timers, kProbeMarks clocks]
__device__ __forceinline__ void probe(int kind, int mark) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && g_probe && blockIdx.x < kProbeBlocks) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    unsigned long long* b = g_probe + (size_t(kind) * kProbeBlocks + blockIdx.x) * 2 * kProbeMarks;
    b[mark] = t;
    b[kProbeMarks + mark] = clock64();
  }
}
}  // namespace
#else
namespace {
__device__ __forceinline__ void probe(int, int) {}
}  // namespace
#endif

}  // namespace swiftlet::cuda
