// Synthetic models: random weights with the exact shapes of the released models (and small
// presets for tests and demos), written straight into a .qpack. These are the benchmark and
// demo models of a machine without the real weights.
//
// Weights are zero-mean with a random sign per quantisation group (environment.md: with
// constant-sign groups every token is routed to the same few experts after a few layers, which
// would make any expert cache look perfect). Values come from a fast PRNG (xoshiro256**) written
// directly as packed codes, so generation runs at disk speed.
#pragma once

#include "convert/repack.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace swiftlet {

struct SyntheticPreset {
  std::string name;
  std::string description;
  bool exact_shapes = false;  // a released model's shapes: its vocabulary size is kept
  nlohmann::ordered_json config;  // the Hugging Face config.json
};

const std::vector<SyntheticPreset>& synthetic_presets();
// Throws Error listing the presets when `name` is unknown.
const SyntheticPreset& find_synthetic_preset(const std::string& name);

// opts.tokenizer: a tokenizer.json to embed (with tokenizer_config.json / chat_template.jinja
// when they lie beside it); the vocabulary is sized to it.
std::unique_ptr<RepackSource> make_synthetic_source(const std::string& preset, const RepackOptions& opts);

inline RepackStats repack_synthetic(const std::string& preset, const RepackOptions& opts) {
  auto src = make_synthetic_source(preset, opts);
  return write_container(*src, opts);
}

// Generators, deterministic in `seed` (exposed for tests).
// MLX affine codes for a [rows, cols] matrix whose values have standard deviation ~`std` and mean
// ~0: uniform random codes, scale = +-std / std(codes) with a random sign per group, bias
// centring the codes. `scales`/`biases` are bf16.
void synth_affine(uint64_t seed, int64_t rows, int64_t cols, int bits, int group_size, float std,
                  uint8_t* packed, uint16_t* scales, uint16_t* biases);
// bf16 values with random sign and magnitude in [a, 2a) where the standard deviation is ~`std`.
void synth_bf16(uint64_t seed, size_t n, float std, uint16_t* out);

}  // namespace swiftlet
