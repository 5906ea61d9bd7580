// The token mixers' and the MoE activation's kernels as one table, the twin of `Kernels` for the
// products: the scalar references (the oracle: Backend::Reference, the fast forms' tests and
// the CUDA kernels' tests) or the fast forms, chosen once per Forward (--backend).
#pragma once

#include "kernels/cpu/attention.h"
#include "kernels/cpu/delta_net.h"
#include "kernels/cpu/kernels.h"

#include <cstdint>

namespace swiftlet {

struct MixerKernels {
  // Causal attention over the KV cache (attention.h).
  void (*attend)(const attn::AttnShape& s, const attn::AttnBatch& b);
  // o[i] *= sigmoid(gate[i]) (the attention output gate).
  void (*sigmoid_gate)(float* o, const float* gate, int64_t n);
  // The Gated DeltaNet's parts (delta_net.h): causal conv + SiLU, the q / k norms, the delta
  // rule token by token, in chunks of 64 for prompts (the reference has no chunked form: it runs
  // token by token there too), the gated RMSNorm.
  void (*conv_silu)(float* x, int64_t T, int64_t C, const float* w, int K, float* state);
  void (*l2_norm_heads)(float* x, int heads, int n, float eps, float scale);
  void (*delta_rule)(const gdn::DeltaShape& s, const gdn::DeltaBatch& b, float* S);
  void (*delta_rule_chunked)(const gdn::DeltaShape& s, const gdn::DeltaBatch& b, float* S);
  void (*gated_rms_norm)(float* o, const float* z, const float* w, int heads, int n, float eps);
  // g[i] = SiLU(g[i]) * u[i] (activations.h).
  void (*silu_mul)(float* g, const float* u, int64_t n);
  const char* name;
};

// The references for Backend::Reference, the fast forms for the others.
const MixerKernels& mixers_for(Backend b);

}  // namespace swiftlet
