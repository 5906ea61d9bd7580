// Every logits row of one prompt through the scalar reference backend, from a model on disk (a
// container or a checkpoint directory): what the model tests compare with their references.
#pragma once

#include "model/forward_pass.h"
#include "model/session_state.h"
#include "runtime/model_loader.h"

#include <cstdint>
#include <string>
#include <vector>

namespace swiftlet::testing {

inline std::vector<float> reference_prefill(const std::string& model, const std::vector<int32_t>& tokens) {
  auto lm = load_model(model);
  Forward fwd(lm->model, Backend::Reference);
  SessionState st = SessionState::create(lm->model.config);
  std::vector<float> logits;
  fwd.run(st, tokens, LogitsMode::All, logits);
  return logits;
}

}  // namespace swiftlet::testing
