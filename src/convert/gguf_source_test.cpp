// swiftlet-repack --from-gguf: the committed Hugging Face fixtures written as GGUF files the way
// llama.cpp's convert_hf_to_gguf.py writes them (its renames and transforms, applied here from
// the description of that script: norms + 1, A_log -> -exp(A_log), conv1d squeezed, Qwen3-Next's
// in_proj_qkvz split, Qwen3.5's value heads tiled, experts stacked), converted back, and run:
// the logits must be transformers' (the fixtures' own references).
#include "convert/repack.h"

#include "convert/gguf_tokenizer.h"

#include "core/dtype.h"
#include "core/error.h"
#include "experts/tensor_experts.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/safetensors.h"
#include "model/forward_pass.h"
#include "kernels/cpu/ops_ref.h"
#include "model/weights.h"
#include "core/zstd_frame.h"
#include "tokenizer/tokenizer.h"
#include "runtime/model_loader.h"
#include "support/gguf_export.h"
#include "support/reference_logits.h"
#include "support/test_paths.h"
#include "support/test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using swiftlet::testing::error_of;
using swiftlet::testing::fixture_dir;
using swiftlet::testing::max_abs_diff;
using swiftlet::testing::read_f32;
using swiftlet::testing::ScratchDir;

using swiftlet::testing::GgufWriteOptions;
using swiftlet::testing::add_tokenizer;
using swiftlet::testing::write_as_gguf;

std::vector<float> prefill(const std::string& model, const std::vector<int32_t>& tokens) {
  return swiftlet::testing::reference_prefill(model, tokens);
}

float rms_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i] - b[i]) * double(a[i] - b[i]);
  return float(std::sqrt(s / double(std::max<size_t>(1, a.size()))));
}

RepackOptions opts(const std::string& out, int bits) {
  RepackOptions o;
  o.output = out;
  o.bits = bits;
  return o;
}

struct Case {
  std::string fixture;
  bool fused_qkvz;
};

class GgufRepack : public ::testing::TestWithParam<Case> {};

// Done-when: a GGUF of the fixture converts at --bits 16 to transformers' logits.
TEST_P(GgufRepack, F32GgufGivesTransformersLogits) {
  const Case k = GetParam();
  if (!fs::exists(fixture_dir(k.fixture) + "/reference.json")) GTEST_SKIP() << "fixture missing";
  ScratchDir tmp;
  write_as_gguf(fixture_dir(k.fixture), tmp / "m.gguf", {GgmlType::F32, k.fused_qkvz});
  repack_from_gguf(tmp / "m.gguf", opts(tmp / "m.qpack", 16));
  const auto ref = nlohmann::json::parse(read_text_file(fixture_dir(k.fixture) + "/reference.json"));
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  const std::vector<float> got = prefill(tmp / "m.qpack", tokens);
  EXPECT_LT(max_abs_diff(got, read_f32(fixture_dir(k.fixture) + "/prefill_logits.f32")), 1e-3f);
  EXPECT_LT(max_abs_diff(got, prefill(fixture_dir(k.fixture), tokens)), 1e-4f);
}

INSTANTIATE_TEST_SUITE_P(Gguf, GgufRepack,
                         ::testing::Values(Case{"next_8l", false}, Case{"next_8l", true}, Case{"q35_text_tied", false}),
                         [](const auto& info) {
                           return info.param.fixture + (info.param.fused_qkvz ? "_ssm_in" : "");
                         });

// The cost of each GGUF type, and of re-quantising it into the container, on the trained model
// (models/toy.qpack: real weights, so the logits show quantisation error rather than the random
// fixtures' router flips). Largest logit difference over the first reference prompt against the
// container the GGUF was written from, and against the GGUF's own dequantised weights (--bits
// 16): what re-quantising at --bits 8 and 4 adds. docs/gguf.md has the table.
TEST(GgufRepackTypes, EachTypeConvertsAndRequantisesWithinItsError) {
  const std::string toy = swiftlet::testing::source_path("models/toy.qpack");
  const auto ref =
      nlohmann::json::parse(read_text_file(swiftlet::testing::source_path("tests/data/trained/reference.json")));
  const auto tokens = ref["prompts"][0]["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<float> want = prefill(toy, tokens);
  struct Bound {
    GgmlType type;
    float own, bits8, bits4;  // limits on the three differences
  };
  // Limits: 1.5 x the differences measured when the test was written (printed below).
  for (const Bound& b : {Bound{GgmlType::F32, 1e-4f, 2.0f, 2.4f}, Bound{GgmlType::Q8_0, 0.7f, 0.7f, 2.5f},
                         Bound{GgmlType::Q4_0, 3.0f, 0.3f, 3.2f}, Bound{GgmlType::Q4_1, 5.0f, 1.7f, 3.2f}}) {
    ScratchDir tmp;
    write_as_gguf(toy, tmp / "m.gguf", {b.type, false, b.type == GgmlType::F32});
    repack_from_gguf(tmp / "m.gguf", opts(tmp / "16.qpack", 16));
    if (b.type == GgmlType::F32) {  // the tokenizer and template come along
      const Tokenizer tok = Tokenizer::from_file(Tokenizer::file_in(tmp / "16.qpack"));
      EXPECT_EQ(tok.encode("Hello world! This is a test of the tokenizer."),
                (std::vector<int32_t>{9707, 1879, 0, 1096, 374, 264, 1273, 315, 279, 45958, 13}));
      EXPECT_TRUE(fs::exists(tmp / "16.qpack/chat_template.jinja"));
    }
    const std::vector<float> dequantised = prefill(tmp / "16.qpack", tokens);
    const float own = max_abs_diff(dequantised, want);
    float diff[2], rms[3] = {rms_diff(dequantised, want), 0, 0};
    for (int bits : {8, 4}) {
      repack_from_gguf(tmp / "m.gguf", opts(tmp / fmt::format("{}.qpack", bits), bits));
      const std::vector<float> got = prefill(tmp / fmt::format("{}.qpack", bits), tokens);
      diff[bits == 4] = max_abs_diff(got, dequantised);
      rms[bits == 4 ? 2 : 1] = rms_diff(got, dequantised);
    }
    const std::string type = ggml_type_name(uint32_t(b.type));
    std::printf(
        "toy %-5s max|rms: vs the container %.5f|%.5f; --bits 8 vs the GGUF %.5f|%.5f; --bits 4 vs "
        "the GGUF %.5f|%.5f\n",
        type.c_str(), own, rms[0], diff[0], rms[1], diff[1], rms[2]);
    EXPECT_LT(own, b.own) << type;
    EXPECT_LT(diff[0], b.bits8) << type;
    EXPECT_LT(diff[1], b.bits4) << type;
  }
}

// --bits 16 keeps a float GGUF's own type: the bytes pass through exactly.
TEST(GgufRepackTypes, Bits16KeepsTheFloatType) {
  const std::string fx = fixture_dir("next_8l");
  if (!fs::exists(fx + "/reference.json")) GTEST_SKIP() << "fixture missing";
  ScratchDir tmp;
  write_as_gguf(fx, tmp / "m.gguf", {GgmlType::F16, false});
  repack_from_gguf(tmp / "m.gguf", opts(tmp / "m.qpack", 16));
  const GgufFile g(tmp / "m.gguf");
  const TensorSet ts = TensorSet::open_files({tmp / "m.qpack/model.safetensors"});
  const TensorView& q = ts.get("model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(q.dtype, DType::F16);
  const GgufTensor* src = g.find_tensor("blk.3.attn_q.weight");
  ASSERT_NE(src, nullptr);
  ASSERT_EQ(q.nbytes, src->nbytes);
  EXPECT_EQ(std::memcmp(q.data, src->data, q.nbytes), 0);
}

TEST(GgufRepackErrors, OtherArchitecturesTypesAndMissingKeysAreRefusedByName) {
  ScratchDir tmp;
  GgufWriter llama;
  llama.set_string("general.architecture", "llama");
  llama.write(tmp / "llama.gguf");
  EXPECT_NE(error_of([&] {
              open_gguf_source(tmp / "llama.gguf", opts(tmp / "o", 4));
            }).find("architecture 'llama'; swiftlet converts qwen3next"),
            std::string::npos);

  GgufWriter iq;
  iq.set_string("general.architecture", "qwen3next");
  iq.add_tensor("blk.0.ffn_down_exps.weight", GgmlType::IQ2_XS, {256, 1}, std::string(74, '\0'));
  iq.write(tmp / "iq.gguf");
  EXPECT_EQ(error_of([&] { open_gguf_source(tmp / "iq.gguf", opts(tmp / "o", 4)); }),
            "tensor blk.0.ffn_down_exps.weight has type IQ2_XS, which swiftlet cannot read; convert from "
            "safetensors or a Q4_K/Q5_K/Q6_K/Q8_0 GGUF");

  GgufWriter bare;
  bare.set_string("general.architecture", "qwen35moe");
  bare.add_tensor("token_embd.weight", GgmlType::F32, {4, 2}, std::string(32, '\0'));
  bare.write(tmp / "bare.gguf");
  EXPECT_NE(error_of([&] {
              open_gguf_source(tmp / "bare.gguf", opts(tmp / "o", 4));
            }).find("lacks the metadata key 'qwen35moe.embedding_length'"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(tmp / "o"));
}

// Done-when: the tokenizer rebuilt from the GGUF's metadata gives the original's ids on the
// tokenizer goldens (made with Hugging Face tokenizers), and the chat template comes along.
TEST(GgufRepackTokenizer, RebuiltTokenizerMatchesTheGoldens) {
  const std::string toy = swiftlet::testing::source_path("models/toy.qpack");
  ScratchDir tmp;
  GgufWriter w;
  add_tokenizer(w, toy);
  w.write(tmp / "tok.gguf");
  const GgufFile f(tmp / "tok.gguf");
  const Tokenizer tok = Tokenizer::from_json_string(gguf_tokenizer_json(f));
  const auto goldens =
      nlohmann::json::parse(read_text_file(swiftlet::testing::source_path("tests/data/tokenizer/qwen3_goldens.json")));
  EXPECT_EQ(tok.vocab_size(), goldens["vocab_size"].get<int32_t>());
  int checked = 0, failures = 0;
  for (const auto& c : goldens["encode"]) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want_plain =
        (c.contains("ids_plain") ? c["ids_plain"] : c["ids"]).get<std::vector<int32_t>>();
    if (tok.encode(text) != want && ++failures <= 10) ADD_FAILURE() << c["name"];
    if (tok.encode(text, false) != want_plain && ++failures <= 10) ADD_FAILURE() << c["name"] << " (plain)";
    ++checked;
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GE(checked, 400);
  const auto orig = nlohmann::json::parse(read_text_file(toy + "/tokenizer_config.json"));
  EXPECT_EQ(gguf_chat_template(f), orig["chat_template"].get<std::string>());
  const auto cfg = nlohmann::json::parse(gguf_tokenizer_config(f));
  EXPECT_EQ(cfg["eos_token"], "<|im_end|>");
  EXPECT_EQ(cfg["pad_token"], "<|endoftext|>");
  EXPECT_EQ(cfg["chat_template"], orig["chat_template"]);
}

TEST(GgufRepackTokenizer, OtherTokenizersAreRefusedByName) {
  ScratchDir tmp;
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "llama");
  w.write(tmp / "spm.gguf");
  EXPECT_NE(error_of([&] { gguf_tokenizer_json(GgufFile(tmp / "spm.gguf")); }).find("tokenizer.ggml.model is 'llama'"),
            std::string::npos);
  GgufWriter p;
  p.set_string("tokenizer.ggml.model", "gpt2");
  p.set_string("tokenizer.ggml.pre", "llama-bpe");
  p.set_strings("tokenizer.ggml.tokens", {"a"});
  p.set_strings("tokenizer.ggml.merges", {});
  p.write(tmp / "pre.gguf");
  EXPECT_NE(
      error_of([&] { gguf_tokenizer_json(GgufFile(tmp / "pre.gguf")); }).find("tokenizer.ggml.pre is 'llama-bpe'"),
      std::string::npos);
}

// A copy of a GGUF file with one tensor's dimensions replaced (same bytes).
void rewrite_with_shape(const std::string& in, const std::string& out, const std::string& name,
                        std::vector<int64_t> ne) {
  const GgufFile f(in);
  GgufWriter w;
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  for (const GgufTensor& t : f.tensors())
    w.add_tensor(t.name, GgmlType(t.type), t.name == name ? ne : t.ne,
                 std::string(reinterpret_cast<const char*>(t.data), t.nbytes));
  w.write(out);
}

// Refused when the source opens, before anything is written.
TEST(GgufRepackErrors, ATransposedOrMissingTensorIsRefusedByName) {
  const std::string fx = fixture_dir("next_8l");
  if (!fs::exists(fx + "/reference.json")) GTEST_SKIP() << "fixture missing";
  ScratchDir tmp;
  write_as_gguf(fx, tmp / "m.gguf", {});
  const GgufFile good(tmp / "m.gguf");
  const GgufTensor& o = *good.find_tensor("blk.3.attn_output.weight");
  rewrite_with_shape(tmp / "m.gguf", tmp / "t.gguf", o.name, {o.ne[1], o.ne[0]});
  const std::string e = error_of([&] { open_gguf_source(tmp / "t.gguf", opts(tmp / "t.qpack", 4)); });
  EXPECT_NE(e.find("tensor blk.3.attn_output.weight has shape"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(tmp / "t.qpack"));
  // Without the gate of Qwen3-Next's DeltaNet input (and no older fused ssm_in): both named.
  {
    const GgufFile f(tmp / "m.gguf");
    GgufWriter w;
    for (const auto& [k, v] : f.metadata()) w.set(k, v);
    for (const GgufTensor& t : f.tensors())
      if (t.name != "blk.0.attn_gate.weight")
        w.add_tensor(t.name, GgmlType(t.type), t.ne, std::string(reinterpret_cast<const char*>(t.data), t.nbytes));
    w.write(tmp / "missing.gguf");
  }
  const std::string m = error_of([&] { open_gguf_source(tmp / "missing.gguf", opts(tmp / "m.qpack", 4)); });
  EXPECT_NE(m.find("has neither tensor blk.0.attn_gate.weight nor blk.0.ssm_in.weight"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(tmp / "m.qpack"));
}

// The executable: converts a GGUF; a file that is not one fails with the reason and writes nothing.
TEST(GgufCli, RepackFromGguf) {
  const std::string fx = fixture_dir("next_8l");
  if (!fs::exists(fx + "/reference.json")) GTEST_SKIP() << "fixture missing";
  ScratchDir tmp;
  write_as_gguf(fx, tmp / "m.gguf", {GgmlType::Q8_0, false});
  const auto ok = swiftlet::testing::run_binary(
      "swiftlet-repack", "--from-gguf " + (tmp / "m.gguf") + " --output " + (tmp / "m.qpack") + " --bits 8 -q");
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_TRUE(fs::exists(tmp / "m.qpack/manifest.json"));
  const auto bad = swiftlet::testing::run_binary("swiftlet-repack",
                                                 "--from-gguf " + fx + "/config.json --output " + (tmp / "bad.qpack"));
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_NE(bad.out.find("is not a GGUF file"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(tmp / "bad.qpack"));
}

}  // namespace
}  // namespace swiftlet
