// The Gated DeltaNet token mixer's kernels (model-math.md 5.2-5.6), for the fast CPU backends:
// the causal conv + SiLU, q/k normalisation, the gated delta rule token by token (decode, 5.4)
// and in chunks of 64 with the WY/UT form (prefill, 5.5), and the gated RMSNorm.
// The *_reference functions are the scalar oracle (Backend::Reference runs them; the fast forms
// and the CUDA kernels are tested against them); the others are the fast forms, which fall back
// to them on a CPU without AVX2 or NEON.
#pragma once

#include <cstdint>

namespace swiftlet::gdn {

struct DeltaShape {
  int key_heads;    // Hk
  int value_heads;  // Hv (a multiple of Hk; value head h reads key head h / (Hv / Hk))
  int key_dim;      // Dk
  int value_dim;    // Dv
};

// T tokens of the delta rule's inputs and outputs. Row t of each array starts at t * stride.
struct DeltaBatch {
  int64_t T = 0;
  const float* q = nullptr;  // key head g at q + t * qkv_stride + g * Dk (normalised, scaled)
  const float* k = nullptr;  // key head g at k + t * qkv_stride + g * Dk (normalised)
  const float* v = nullptr;  // value head h at v + t * qkv_stride + h * Dv
  int64_t qkv_stride = 0;
  const float* g = nullptr;     // [t * gate_stride + h]: log decay (<= 0)
  const float* beta = nullptr;  // [t * gate_stride + h]
  int64_t gate_stride = 0;
  float* out = nullptr;  // value head h at out + t * out_stride + h * Dv
  int64_t out_stride = 0;
};

// S: [Hv][Dk][Dv] fp32, updated in place; out gets o_t = S_t^T q_t per token and value head.
// Plain scalar loops (the recurrence of 5.4 written out).
void delta_rule_reference(const DeltaShape& s, const DeltaBatch& b, float* S);
// Token by token with the five steps fused into two passes over each column block of S
// (one trip through memory per token); for decode.
void delta_rule_recurrent(const DeltaShape& s, const DeltaBatch& b, float* S);
// Chunks of 64 tokens in the WY/UT form (5.5): the same outputs and final state as the
// recurrence up to float rounding, with the work in matrix products; for prefill.
void delta_rule_chunked(const DeltaShape& s, const DeltaBatch& b, float* S);

// Causal depthwise conv1d (kernel K, weights w[C][K], no bias) + SiLU over T rows of x[T][C],
// in place. state[K-1][C] holds the raw rows before x (oldest first) and is advanced to the last
// K-1 raw rows (5.2).
void conv_silu(float* x, int64_t T, int64_t C, const float* w, int K, float* state);
void conv_silu_reference(float* x, int64_t T, int64_t C, const float* w, int K, float* state);
// x[n] <- x / sqrt(sum(x^2) + eps) * scale (5.3), for each of `heads` consecutive n-vectors.
void l2_norm_heads(float* x, int heads, int n, float eps, float scale);
void l2_norm_heads_reference(float* x, int heads, int n, float eps, float scale);
// o[n] <- w * o / sqrt(mean(o^2) + eps) * SiLU(z) (5.6), for each of `heads` n-vectors.
void gated_rms_norm(float* o, const float* z, const float* w, int heads, int n, float eps);
void gated_rms_norm_reference(float* o, const float* z, const float* w, int heads, int n, float eps);

}  // namespace swiftlet::gdn
