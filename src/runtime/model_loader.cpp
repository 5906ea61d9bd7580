#include "runtime/model_loader.h"

#include "core/error.h"
#include "experts/qpack_experts.h"
#include "experts/tensor_experts.h"
#include "format/qpack.h"
#include "format/safetensors.h"

#include <filesystem>

namespace swiftlet {

namespace fs = std::filesystem;

LoadedModel::~LoadedModel() = default;

namespace {

// A .qpack: resident tensors from model.safetensors (MLX names and conventions), routed experts
// streamed from packed_experts/.
std::unique_ptr<LoadedModel> load_qpack(const std::string& path, const LoadOptions& opts) {
  const QpackContainer qc = QpackContainer::open(path);
  auto lm = std::make_unique<LoadedModel>();
  lm->path = path;
  lm->model.config = qc.config;
  lm->tensors = std::make_unique<TensorSet>(TensorSet::open_files({qc.path("model.safetensors")}));
  const NameScheme names = NameScheme::detect(*lm->tensors, lm->model.config);
  lm->model.weights = load_dense_weights(*lm->tensors, lm->model.config, names);
  lm->experts = std::make_unique<QpackExperts>(qc, opts.verify_experts);
  lm->model.experts = lm->experts.get();
  return lm;
}

}  // namespace

std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& opts) {
  if (!fs::exists(path)) fail("model '{}' does not exist", path);
  if (looks_like_qpack(path)) return load_qpack(path, opts);
  if (!fs::is_directory(path))
    fail("model '{}' is not a directory; pass a checkpoint directory holding config.json and "
         "*.safetensors", path);
  const std::string cfg_path = (fs::path(path) / "config.json").string();
  if (!fs::exists(cfg_path)) fail("'{}' has no config.json; is it a model directory?", path);
  auto lm = std::make_unique<LoadedModel>();
  lm->path = path;
  lm->model.config = ModelConfig::load(cfg_path);
  lm->tensors = std::make_unique<TensorSet>(TensorSet::open_dir(path));
  const NameScheme names = NameScheme::detect(*lm->tensors, lm->model.config);
  lm->model.weights = load_dense_weights(*lm->tensors, lm->model.config, names);
  lm->experts = std::make_unique<TensorExperts>(*lm->tensors, lm->model.config, names);
  lm->model.experts = lm->experts.get();
  return lm;
}

}  // namespace swiftlet
