// Elementwise activations of the MoE blocks: the SwiGLU product SiLU(g) * u of the routed and
// shared experts, its scalar reference (the oracle) and the fast form (kernels/cpu/mixers.h
// chooses).
#pragma once

#include <cstdint>

namespace swiftlet::act {

// g[i] = SiLU(g[i]) * u[i] for i < n. With AVX2 or NEON, 8 at a time with a vector e^x (relative error
// ~2e-7): every element gets the same result wherever it sits in the array (the tail goes
// through the same vector code), so a token's result does not depend on how many tokens share
// the call. Without either: the reference.
void silu_mul(float* g, const float* u, int64_t n);
void silu_mul_reference(float* g, const float* u, int64_t n);

}  // namespace swiftlet::act
