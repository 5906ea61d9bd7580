// Opens a model from disk: a Hugging Face / MLX checkpoint directory (later also a .qpack)
// and wires its dense weights and its expert source together.
#pragma once

#include "model/qwen3_hybrid.h"

#include <memory>
#include <string>

namespace swiftlet {

class TensorSet;

struct LoadedModel {
  std::string path;
  std::unique_ptr<TensorSet> tensors;
  std::unique_ptr<ExpertSource> experts;
  Model model;
  ~LoadedModel();
};

// Throws Error with a message naming the file and what to do.
std::unique_ptr<LoadedModel> load_model(const std::string& path);

}  // namespace swiftlet
