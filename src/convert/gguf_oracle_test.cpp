// llama.cpp as the oracle of what a GGUF file means. tests/data/gguf holds llama.cpp's logits for
// GGUF files of the synthetic presets tiny-256 (qwen3next) and tiny-256-q35 (qwen35moe), whose
// matrices have rows of 256 values so that llama.cpp's K-quant types apply to all of them, and
// the K-quant files llama-quantize made (tools/reference/llama_cpp_gguf.sh; tests/data/gguf/README.md).
// swiftlet's conversion of each file at --bits 16 (the file's own weights, dequantised) must give
// llama.cpp's logits up to llama.cpp's rounding of the activations: its CPU products round them to
// bf16 or 8 bits, so the bound is a share of the logits' range, far below what a wrong tensor
// transform or block layout gives.
#include "convert/repack.h"
#include "convert/synthetic.h"

#include "core/error.h"
#include "support/gguf_export.h"
#include "support/reference_logits.h"
#include "support/test_paths.h"
#include "support/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using swiftlet::testing::read_f32;
using swiftlet::testing::reference_prefill;
using swiftlet::testing::ScratchDir;
using swiftlet::testing::source_path;

std::string data(const std::string& name) { return source_path("tests/data/gguf/" + name); }

std::vector<int32_t> prompt() {
  std::vector<int32_t> ids;
  std::stringstream ss(read_text_file(data("ids.txt")));
  for (std::string t; std::getline(ss, t, ',');) ids.push_back(int32_t(std::stoi(t)));
  return ids;
}

// Largest |got - want| over the largest |want|.
double relative_diff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double d = 0, m = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    d = std::max(d, double(std::fabs(got[i] - want[i])));
    m = std::max(m, double(std::fabs(want[i])));
  }
  return d / std::max(m, 1e-30);
}

// The GGUF file converted at `bits` into `container` (replacing it); its logits for the prompt.
std::vector<float> converted(const std::string& gguf, int bits, const std::string& container) {
  RepackOptions o;
  o.output = container;
  o.bits = bits;
  o.force = true;
  repack_from_gguf(gguf, o);
  return reference_prefill(container, prompt());
}

// The file converted into `container` at --bits 16: its logits against llama.cpp's.
double against_llama(const std::string& gguf, const std::string& golden, const std::string& container) {
  return relative_diff(converted(gguf, 16, container), read_f32(data(golden)));
}

constexpr double kBound = 0.03;  // of the logits' range; llama.cpp's activation rounding
// Re-quantising a K-quant file into the container's formats, 1.5 x what was measured (docs/gguf.md).
constexpr double kBits8Bound = 0.02, kBits4Bound = 0.33;

// Float matrices: the transforms of both families (fused and tiled inputs, A_log, conv, norms,
// stacked experts) as llama.cpp reads them. The files are written here as for the oracle run.
TEST(GgufOracle, FloatFilesOfBothFamiliesGiveLlamaCppsLogits) {
  for (const std::string preset : {"tiny-256", "tiny-256-q35"}) {
    ScratchDir tmp;
    RepackOptions o;
    o.output = tmp / "synthetic.qpack";
    o.bits = 16;
    repack_synthetic(preset, o);
    for (const auto& [type, name] : {std::pair{GgmlType::BF16, "BF16"}, std::pair{GgmlType::F16, "F16"}}) {
      swiftlet::testing::write_as_gguf(tmp / "synthetic.qpack", tmp / "m.gguf", {type, false, false});
      const double d = against_llama(tmp / "m.gguf", preset + "-" + name + ".llama.f32", tmp / "m.qpack");
      std::printf("%s %s: largest difference from llama.cpp %.4f of the logits' range\n", preset.c_str(), name, d);
      EXPECT_LT(d, kBound) << preset << " " << name;
    }
  }
}

// Files llama-quantize wrote: its K-quant mixtures (Q4_K, Q5_K and Q6_K blocks) decoded as llama.cpp
// decodes them, and the cost of re-quantising them at --bits 8 and 4.
TEST(GgufOracle, LlamaQuantizedFilesGiveLlamaCppsLogits) {
  ScratchDir tmp;
  int files = 0;
  for (const auto& e : fs::directory_iterator(source_path("tests/data/gguf"))) {
    const std::string name = e.path().filename().string();
    if (!name.ends_with(".gguf")) continue;
    ++files;
    const std::string stem = name.substr(0, name.size() - 5);
    const std::vector<float> own = converted(e.path().string(), 16, tmp / "m.qpack");
    const double d = relative_diff(own, read_f32(data(stem + ".llama.f32")));
    // Re-quantised into the container's 8 and 4 bits: what that adds to the file's own weights.
    double requant[2];
    for (int bits : {8, 4}) requant[bits == 4] = relative_diff(converted(e.path().string(), bits, tmp / "r.qpack"), own);
    std::printf("%s: largest difference from llama.cpp %.4f of the logits' range; --bits 8 adds %.4f, --bits 4 %.4f\n",
                stem.c_str(), d, requant[0], requant[1]);
    EXPECT_LT(d, kBound) << name;
    EXPECT_LT(requant[0], kBits8Bound) << name;
    EXPECT_LT(requant[1], kBits4Bound) << name;
  }
  EXPECT_GT(files, 0) << "no GGUF files in tests/data/gguf";
}

}  // namespace
}  // namespace swiftlet
