// Broken checkpoints give clear errors naming the file and tensor, never a crash.
#include "runtime/model_loader.h"

#include "core/error.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "io/mapped_file.h"
#include "support/test_paths.h"
#include "support/test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;

class BrokenCheckpoint : public ::testing::Test {
 protected:
  std::string copy_fixture(const std::string& name) {
    fs::copy(swiftlet::testing::fixture_dir(name), dir_.path(), fs::copy_options::recursive);
    return dir_.str();
  }
  std::string load_error(const std::string& path) {
    return swiftlet::testing::error_of([&] { load_model(path); });
  }
  swiftlet::testing::ScratchDir dir_;
};

TEST_F(BrokenCheckpoint, TruncatedFile) {
  std::string d = copy_fixture("next_8l");
  const fs::path f = fs::path(d) / "model.safetensors";
  fs::resize_file(f, fs::file_size(f) - 1000);
  std::string e = load_error(d);
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, CorruptHeader) {
  std::string d = copy_fixture("next_8l");
  std::fstream f(fs::path(d) / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.write("XXXX", 4);  // the JSON header no longer parses
  f.close();
  std::string e = load_error(d);
  EXPECT_NE(e.find("corrupt safetensors header"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, MissingTensor) {
  std::string d = copy_fixture("next_8l");
  const std::string file = (fs::path(d) / "model.safetensors").string();
  const std::string dropped = "model.layers.2.linear_attn.A_log";
  {
    std::string bytes = read_text_file(file);  // keep the data alive while rewriting
    fs::remove(file);
    const std::string tmp = (fs::path(d) / "orig.bin").string();
    std::ofstream(tmp, std::ios::binary) << bytes;
    SafetensorsFile src(tmp);
    std::vector<TensorToWrite> keep;
    for (const auto& t : src.tensors())
      if (t.name != dropped) keep.push_back({t.name, t.dtype, t.shape, t.data});
    write_safetensors(file, keep);
  }
  fs::remove(fs::path(d) / "orig.bin");
  std::string e = load_error(d);
  EXPECT_NE(e.find("missing tensor '" + dropped + "'"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, WrongShape) {
  std::string d = copy_fixture("next_8l");
  const fs::path cfg = fs::path(d) / "config.json";
  auto j = nlohmann::json::parse(read_text_file(cfg.string()));
  j["num_experts"] = 9;
  std::ofstream(cfg) << j.dump();
  std::string e = load_error(d);
  EXPECT_NE(e.find("model.layers.0.mlp.gate.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("has shape [8, 64] but the config implies [9, 64]"), std::string::npos) << e;
}

TEST_F(BrokenCheckpoint, MissingShardAndConfig) {
  std::string d = copy_fixture("next_tied_sharded");
  fs::remove(fs::path(d) / "model-00002-of-00004.safetensors");
  std::string e = load_error(d);
  EXPECT_NE(e.find("model-00002-of-00004.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  fs::remove(fs::path(d) / "config.json");
  EXPECT_NE(load_error(d).find("no config.json"), std::string::npos);
  EXPECT_NE(load_error(d + "/nope").find("does not exist"), std::string::npos);
}

TEST_F(BrokenCheckpoint, UnsupportedModelTypeIsRefusedByName) {
  std::string d = copy_fixture("next_8l");
  const fs::path cfg = fs::path(d) / "config.json";
  auto j = nlohmann::json::parse(read_text_file(cfg.string()));
  j["model_type"] = "mixtral";
  std::ofstream(cfg) << j.dump();
  EXPECT_NE(load_error(d).find("model_type 'mixtral' is not supported"), std::string::npos);
}

}  // namespace
}  // namespace swiftlet
