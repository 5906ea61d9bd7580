// swiftlet_write_gguf: a model (checkpoint directory or container) written as the GGUF file
// llama.cpp's converter would make of it (tests/support/gguf_export.h), for running the same
// weights through llama.cpp (tools/reference/llama_cpp_gguf.sh).
//   swiftlet_write_gguf MODEL OUT.gguf [--type f32|f16|bf16|q8_0|q4_0|q4_1] [--tokenizer] [--ssm-in]
#include "support/gguf_export.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>

int main(int argc, char** argv) {
  CLI::App app{"swiftlet_write_gguf: write a model as llama.cpp's converter would"};
  std::string model, out, type = "f32";
  swiftlet::testing::GgufWriteOptions o;
  app.add_option("model", model, "checkpoint directory or .qpack container")->required();
  app.add_option("out", out, "the GGUF file to write")->required();
  app.add_option("--type", type, "type of the weight matrices")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"}));
  app.add_flag("--tokenizer", o.tokenizer, "the model's tokenizer as tokenizer.ggml.* (else ids only)");
  app.add_flag("--ssm-in", o.fused_qkvz, "Qwen3-Next: the older fused ssm_in instead of attn_qkv + attn_gate");
  CLI11_PARSE(app, argc, argv);
  const std::map<std::string, swiftlet::GgmlType> types = {
      {"f32", swiftlet::GgmlType::F32},   {"f16", swiftlet::GgmlType::F16},   {"bf16", swiftlet::GgmlType::BF16},
      {"q8_0", swiftlet::GgmlType::Q8_0}, {"q4_0", swiftlet::GgmlType::Q4_0}, {"q4_1", swiftlet::GgmlType::Q4_1}};
  o.matrices = types.at(type);
  try {
    swiftlet::testing::write_as_gguf(model, out, o);
  } catch (const swiftlet::Error& e) {
    std::fprintf(stderr, "swiftlet_write_gguf: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
