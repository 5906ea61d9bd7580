// Whether the 8-lane kernels of the token mixers and the activations (simd_f8.h: attention_simd.cpp,
// delta_net_simd.cpp, activations_simd.cpp) are built for this architecture and run on this CPU:
// x86-64 with AVX2 and FMA, every aarch64 CPU (NEON). Elsewhere the scalar references run.
#pragma once

#if defined(__x86_64__) || defined(__aarch64__)
#define SWIFTLET_F8_KERNELS 1
#endif

namespace swiftlet::simd {

bool cpu_runs_f8();
// What the fast mixer forms run on this CPU: "avx2", "neon" or "scalar".
const char* f8_isa();

}  // namespace swiftlet::simd
