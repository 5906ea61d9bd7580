// End-to-end: the shipped trained model (models/toy.qpack) against transformers. The references in
// tests/data/trained come from tools/train/reference_from_qpack.py on the GPU machine: transformers
// in float64 on exactly the container's (dequantised) weights, greedy continuations from
// full-sequence forwards, texts decoded by Hugging Face's tokenizers.
#include "io/mapped_file.h"
#include "support/test_paths.h"
#include "support/test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <unistd.h>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using swiftlet::testing::CmdResult;
using swiftlet::testing::join_ids;
using swiftlet::testing::read_f32;
using swiftlet::testing::source_path;

constexpr size_t kVocab = 151669;

CmdResult run(const std::string& args, bool stdout_only = false) {
  return swiftlet::testing::run_binary("swiftlet", args, stdout_only);
}

std::string model() { return source_path("models/toy.qpack"); }

nlohmann::json reference() {
  return nlohmann::json::parse(read_text_file(source_path("tests/data/trained/reference.json")));
}

TEST(TrainedModel, GreedyContinuationsMatchTransformers) {
  auto ref = reference();
  ASSERT_GE(ref["prompts"].size(), 5u);
  for (const auto& p : ref["prompts"]) {
    auto want = p["greedy_ids"].get<std::vector<int32_t>>();
    CmdResult g = run("generate " + model() + " --ids " + join_ids(p["prompt_ids"].get<std::vector<int32_t>>(), ",") +
                          " --max-new " + std::to_string(want.size()) + " --greedy --print-ids --backend cpu-f32",
                      true);
    ASSERT_EQ(g.status, 0) << g.out;
    EXPECT_EQ(g.out, join_ids(want, " ") + "\n") << p["question"];
  }
}

TEST(TrainedModel, LastLogitsMatchTransformers) {
  auto ref = reference();
  const std::string out = (fs::temp_directory_path() / ("swiftlet_trained_" + std::to_string(::getpid()) + ".f32")).string();
  for (int i = 0; i < 2; ++i) {
    const auto& p = ref["prompts"][i];
    auto want = read_f32(source_path("tests/data/trained/logits_" + std::to_string(i) + ".f32"));
    ASSERT_EQ(want.size(), kVocab);
    for (const std::string mode : {" --backend reference", " --backend cpu-f32", " --decode --backend cpu-f32"}) {
      CmdResult r = run("logits " + model() + " --tokens " + join_ids(p["prompt_ids"].get<std::vector<int32_t>>(), ",") +
                        " --out " + out + mode);
      ASSERT_EQ(r.status, 0) << r.out;
      auto got = read_f32(out);
      ASSERT_EQ(got.size() % kVocab, 0u);
      const float* last = got.data() + got.size() - kVocab;
      float m = 0;
      for (size_t v = 0; v < kVocab; ++v) m = std::max(m, std::fabs(last[v] - want[v]));
      EXPECT_LT(m, 1e-3f) << "prompt " << i << mode;
    }
  }
  fs::remove(out);
}

// `generate --chat` renders the question with the chat template (thinking off: the template puts
// the empty thinking block into the prompt, which the model also produced itself) and prints the
// answer's text.
TEST(TrainedModel, ChatAnswerTextMatchesTransformers) {
  auto ref = reference();
  const std::string think = "<think>\n\n</think>\n\n", end = "<|im_end|>";
  int checked = 0;
  for (const auto& p : ref["prompts"]) {
    std::string text = p["text"];
    auto ids = p["greedy_ids"].get<std::vector<int32_t>>();
    if (text.rfind(think, 0) != 0) continue;  // the model thought aloud: not a plain answer
    // An answer that ends within the reference's tokens loses its end marker; one cut off by the
    // token limit is printed as far as it goes.
    const bool ended = text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
    const std::string answer = text.substr(think.size(), text.size() - think.size() - (ended ? end.size() : 0));
    // The template puts the empty thinking block (</think> and "\n\n" end it) into the prompt.
    const auto close = std::find(ids.begin(), ids.end(), 151668);
    ASSERT_LT(close + 2, ids.end()) << text;
    const auto answer_tokens = ids.end() - (close + 2);
    const std::string q = p["question"];
    CmdResult g = run("generate " + model() + " --chat --prompt '" + q + "' --greedy --backend cpu-f32 --max-new " +
                          std::to_string(answer_tokens),
                      true);
    ASSERT_EQ(g.status, 0) << g.out;
    EXPECT_EQ(g.out, answer + "\n") << q;
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

// The 4-bit container's perplexity on the first window of the test slice equals what transformers
// computed on the same weights (reference.json: slice.window_nll, the mean NLL of each window's
// scored half), within 0.5%.
TEST(TrainedModel, PerplexityOfTheTestSliceMatchesTransformers) {
  auto ref = reference();
  const double want = std::exp(ref["slice"]["window_nll"][0].get<double>());
  CmdResult r = run("perplexity " + model() + " --file " + source_path("tests/data/trained/test_slice.txt") +
                        " --ctx 512 --chunks 1 --backend cpu-f32 --json",
                    true);
  ASSERT_EQ(r.status, 0) << r.out;
  auto got = nlohmann::json::parse(r.out);
  EXPECT_EQ(got["n_scored"].get<int>(), 255);
  EXPECT_NEAR(got["ppl"].get<double>(), want, 0.005 * want);
}

}  // namespace
}  // namespace swiftlet
