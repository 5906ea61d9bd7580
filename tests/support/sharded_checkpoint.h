// Writes a checkpoint directory again as shards of at most about `max_bytes` each, in the order
// transformers' save_pretrained fills them (embeddings, layer by layer, the final norm and the
// head, so that a layer may straddle two shards), with model.safetensors.index.json and the
// config and tokenizer files copied: the shape of the hub's multi-shard repos, for tests.
#pragma once

#include "format/safetensors.h"
#include "format/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

namespace swiftlet::testing {

// Returns the shard file names.
inline std::vector<std::string> write_sharded(const std::string& src, const std::string& dst, size_t max_bytes) {
  namespace fs = std::filesystem;
  const TensorSet ts = TensorSet::open_dir(src);
  std::vector<std::tuple<long, std::string, const TensorView*>> order;
  for (const std::string& n : ts.names()) {
    long rank = 1L << 30;
    if (n.find("embed_tokens") != std::string::npos) rank = -1;
    if (const size_t at = n.find("layers."); at != std::string::npos) rank = std::stol(n.substr(at + 7));
    order.emplace_back(rank, n, &ts.get(n));
  }
  std::sort(order.begin(), order.end());
  std::vector<std::vector<const TensorView*>> shards(1);
  size_t bytes = 0;
  for (const auto& [rank, name, t] : order) {
    if (bytes > 0 && bytes + t->nbytes > max_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(t);
    bytes += t->nbytes;
  }
  fs::create_directories(dst);
  nlohmann::json map = nlohmann::json::object();
  std::vector<std::string> names;
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    std::vector<TensorToWrite> w;
    for (const TensorView* t : shards[i]) {
      w.push_back({t->name, t->dtype, t->shape, t->data});
      map[t->name] = name;
    }
    write_safetensors((fs::path(dst) / name).string(), w, {{"format", "pt"}});
    names.push_back(name);
  }
  std::ofstream((fs::path(dst) / "model.safetensors.index.json").string()) << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", map}}.dump(1);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(fs::path(src) / f)) fs::copy_file(fs::path(src) / f, fs::path(dst) / f, fs::copy_options::overwrite_existing);
  return names;
}

}  // namespace swiftlet::testing
