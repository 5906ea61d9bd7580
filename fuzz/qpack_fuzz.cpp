// The .qpack metadata files: manifest.json, packed_experts/layout.json and checksums.json. The
// first byte picks the file; a layout that validates against a small model's config must give
// projection views that stay inside one expert's blob.
#include "core/error.h"
#include "format/hf_config.h"
#include "format/qpack.h"
#include "fuzz_util.h"
#include "kernels/cpu/ops_ref.h"

#include <nlohmann/json.hpp>

#include <vector>

namespace {

const swiftlet::ModelConfig& tiny_config() {
  static const swiftlet::ModelConfig c =
      swiftlet::ModelConfig::load(swiftlet::fuzz::source_path("tests/data/fixtures/next_mlx4/config.json"));
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const nlohmann::json j = nlohmann::json::parse(data + 1, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    switch (data[0] % 3) {
      case 0: (void)swiftlet::QpackManifest::parse(j, "manifest.json").to_json(); break;
      case 1: (void)swiftlet::QpackChecksums::parse(j, "checksums.json"); break;
      case 2: {
        const swiftlet::QpackLayout l = swiftlet::QpackLayout::parse(j, "layout.json");
        const swiftlet::ModelConfig& c = tiny_config();
        l.validate(c, "layout.json");
        std::vector<uint8_t> blob(l.expert_stride);
        for (int p = 0; p < 3; ++p) {
          const swiftlet::QMatrix m = l.view(p, c, blob.data());
          std::vector<float> row(size_t(m.cols));
          swiftlet::ref::dequant_row(m, m.rows - 1, row.data());
        }
        break;
      }
    }
  } catch (const swiftlet::Error&) {
  }
  return 0;
}
