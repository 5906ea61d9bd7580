#include "model/session_state.h"

#include "format/hf_config.h"

#include <algorithm>

namespace swiftlet {

SessionState SessionState::create(const ModelConfig& c) {
  SessionState s;
  s.layers.resize(size_t(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    if (!c.is_linear_layer(i)) continue;
    s.layers[size_t(i)].conv.assign(size_t((c.linear_conv_kernel_dim - 1) * c.conv_dim()), 0.0f);
    s.layers[size_t(i)].ssm.assign(size_t(c.linear_num_value_heads) * c.linear_key_head_dim *
                                       c.linear_value_head_dim, 0.0f);
  }
  return s;
}

void SessionState::reset() {
  pos = 0;
  tokens.clear();
  for (auto& l : layers) {
    l.k.clear();
    l.v.clear();
    std::fill(l.conv.begin(), l.conv.end(), 0.0f);
    std::fill(l.ssm.begin(), l.ssm.end(), 0.0f);
  }
}

size_t SessionState::bytes() const {
  size_t n = tokens.size() * sizeof(int32_t);
  for (const auto& l : layers) n += (l.k.size() + l.v.size() + l.conv.size() + l.ssm.size()) * 4;
  return n;
}

}  // namespace swiftlet
