// Opens a model from disk: a Hugging Face / MLX checkpoint directory, or a .qpack container
// (a directory with manifest.json, or a path ending in .qpack), and wires its dense weights and
// its expert source together.
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

struct LoadOptions {
  bool verify_experts = true;  // .qpack: check each expert's checksum when it is read
};

// Throws Error with a message naming the file and what to do.
std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& opts = {});

}  // namespace swiftlet
