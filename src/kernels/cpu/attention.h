// Causal softmax attention with grouped KV heads over the KV cache (model-math.md 4.4),
// for the fast CPU backends: fp32 dot products and weighted V sums in 8-lane vectors (AVX2 or NEON), each K and V row
// read once for all the query heads that share it, scratch reused between calls.
// attend_reference and sigmoid_gate_reference are the scalar oracle (Backend::Reference runs
// them; the fast forms and the CUDA kernels are tested against them).
#pragma once

#include <cstdint>

namespace swiftlet::attn {

struct AttnShape {
  int heads;     // query heads; head j reads KV head j / (heads / kv_heads)
  int kv_heads;
  int head_dim;
};

// T query rows at positions pos0 .. pos0 + T - 1; row t attends to cache rows 0 .. pos0 + t.
// q: head j of row t at q + t * q_stride + j * head_dim (normed, roped, not scaled).
// K, V: cache row s, KV head j at K + s * kv_stride + j * head_dim.
// out: head j of row t at out + t * out_stride + j * head_dim.
struct AttnBatch {
  int64_t T = 0, pos0 = 0;
  const float* q = nullptr;
  int64_t q_stride = 0;
  const float* K = nullptr;
  const float* V = nullptr;
  int64_t kv_stride = 0;
  float scale = 1.0f;  // applied to q . k
  float* out = nullptr;
  int64_t out_stride = 0;
};

// A decoded row's cache rows are split over the threads (flash-decoding: per-part max and sum,
// merged); prefilled rows use the same split in turn, so a row's result does not depend on
// whether it was prefilled or decoded (prefix reuse stays bit-exact).
void attend(const AttnShape& s, const AttnBatch& b);
// Scalar, double-precision dots (as the reference forward pass).
void attend_reference(const AttnShape& s, const AttnBatch& b);
// o[i] *= sigmoid(gate[i]) for i < n (the output gate, model-math.md 4.5).
void sigmoid_gate(float* o, const float* gate, int64_t n);
void sigmoid_gate_reference(float* o, const float* gate, int64_t n);

}  // namespace swiftlet::attn
