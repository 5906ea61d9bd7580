#include "kernels/cpu/mixers.h"

#include "kernels/cpu/activations.h"
#include "kernels/cpu/simd_cpu.h"
#if defined(__x86_64__)
#include "kernels/cpu/matmul_avx2.h"
#endif

namespace swiftlet {

namespace simd {

bool cpu_runs_f8() {
#if defined(__x86_64__)
  static const bool runs = avx2::cpu_has_avx2();
  return runs;
#elif SWIFTLET_F8_KERNELS
  return true;  // NEON: every aarch64 CPU
#else
  return false;
#endif
}

const char* f8_isa() {
  if (!cpu_runs_f8()) return "scalar";
#if defined(__aarch64__)
  return "neon";
#else
  return "avx2";
#endif
}

}  // namespace simd

const MixerKernels& mixers_for(Backend b) {
  static const MixerKernels reference{&attn::attend_reference,         &attn::sigmoid_gate_reference,
                                      &gdn::conv_silu_reference,       &gdn::l2_norm_heads_reference,
                                      &gdn::delta_rule_reference,      &gdn::delta_rule_reference,
                                      &gdn::gated_rms_norm_reference,  &act::silu_mul_reference,
                                      "reference"};
  static const MixerKernels fast{&attn::attend,         &attn::sigmoid_gate,         &gdn::conv_silu,
                                 &gdn::l2_norm_heads,   &gdn::delta_rule_recurrent,  &gdn::delta_rule_chunked,
                                 &gdn::gated_rms_norm,  &act::silu_mul,              "fast"};
  return b == Backend::Reference ? reference : fast;
}

}  // namespace swiftlet
