#include "kernels/cpu/mixers.h"

#include "kernels/cpu/activations.h"

namespace swiftlet {

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
