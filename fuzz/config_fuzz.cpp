// config.json of both families: parsed and validated, or Error; the derived sizes of an accepted
// config are computed without overflow traps.
#include "core/error.h"
#include "format/hf_config.h"

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const swiftlet::ModelConfig c = swiftlet::ModelConfig::parse(j, "config.json");
    volatile int64_t sink = c.q_proj_rows() + c.kv_dim() + c.conv_dim() + c.num_full_layers() +
                            c.rotary_dim() + c.linear_state_bytes();
    (void)sink;
    for (int i = 0; i < c.num_layers; ++i) (void)c.is_linear_layer(i);
  } catch (const swiftlet::Error&) {
  }
  return 0;
}
