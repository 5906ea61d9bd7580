#include "model/session_state.h"

#include "core/error.h"
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

size_t StateSnapshot::bytes() const {
  size_t n = 0;
  for (const auto& c : conv) n += c.size() * 4;
  for (const auto& c : ssm) n += c.size() * 4;
  return n;
}

StateSnapshot SessionState::snapshot() const {
  StateSnapshot s;
  s.pos = pos;
  for (const auto& l : layers) {
    s.conv.push_back(l.conv);
    s.ssm.push_back(l.ssm);
  }
  return s;
}

void SessionState::restore(const StateSnapshot& s) {
  SWIFTLET_CHECK(s.pos <= pos && s.conv.size() == layers.size(), "snapshot at {} does not fit state at {}", s.pos, pos);
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerState& l = layers[i];
    if (!l.k.empty()) {
      const size_t per_pos = l.k.size() / size_t(pos);
      l.k.resize(size_t(s.pos) * per_pos);
      l.v.resize(size_t(s.pos) * per_pos);
    }
    l.conv = s.conv[i];
    l.ssm = s.ssm[i];
  }
  pos = s.pos;
  tokens.resize(size_t(s.pos));
}

bool SessionState::fits(const ModelConfig& c) const {
  if (layers.size() != size_t(c.num_layers) || tokens.size() != size_t(pos)) return false;
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerState& l = layers[size_t(i)];
    if (c.is_linear_layer(i)) {
      if (l.conv.size() != size_t((c.linear_conv_kernel_dim - 1) * c.conv_dim()) ||
          l.ssm.size() != size_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim)
        return false;
    } else if (l.k.size() != size_t(pos * c.kv_dim()) || l.v.size() != l.k.size()) {
      return false;
    }
  }
  return true;
}

size_t SessionState::bytes() const {
  size_t n = tokens.size() * sizeof(int32_t);
  for (const auto& l : layers) n += (l.k.size() + l.v.size() + l.conv.size() + l.ssm.size()) * 4;
  return n;
}

}  // namespace swiftlet
