// Elementwise activations of the MoE blocks for the fast CPU backends: the SwiGLU product
// SiLU(g) * u of the routed and shared experts. Backend::Reference keeps the scalar loop
// (fast = false), which stays the oracle.
#pragma once

#include <cstdint>

namespace swiftlet::act {

// g[i] = SiLU(g[i]) * u[i] for i < n. With fast and AVX2, 8 at a time with a vector e^x
// (relative error ~2e-7): every element gets the same result wherever it sits in the array (the
// tail goes through the same vector code), so a token's result does not depend on how many
// tokens share the call.
void silu_mul(float* g, const float* u, int64_t n, bool fast);

}  // namespace swiftlet::act
