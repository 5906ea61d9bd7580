// End-to-end: `swiftlet perplexity` (checked against NLLs computed here from `swiftlet tokenize`
// and `swiftlet logits`), --save-logits / --compare-logits, --trace-experts with `cachesim`, and
// `swiftlet bench --routing-trace` on the tiny synthetic model.
#include "experts/routing_trace.h"
#include "format/qpack.h"
#include "io/mapped_file.h"
#include "support/test_util.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using testing::CmdResult;

CmdResult sh(const std::string& args, bool stdout_only = false) {
  return testing::run_binary("swiftlet", args, stdout_only);
}

class RoutingCli : public ::testing::Test {
 protected:
  std::string path(const std::string& rel) const { return dir_ / rel; }
  testing::ScratchDir dir_;
};

const char* kText =
    "<|im_start|>user\nWhat is a dictionary?<|im_end|>\n<|im_start|>assistant\nA book of words and what they "
    "mean, in the order of the alphabet.<|im_end|>\n<|endoftext|>In the beginning God created the heaven and the "
    "earth. And the earth was without form, and void; and darkness was upon the face of the deep.<|endoftext|>";

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> v;
  std::istringstream in(s);
  for (int32_t x; in >> x;) v.push_back(x);
  return v;
}

TEST_F(RoutingCli, PerplexityIsTheMeanNllOfEachWindowsSecondHalf) {
  const std::string model = testing::tiny_qpack_with_tokenizer(), text = path("t.txt");
  std::ofstream(text) << kText;
  const int ctx = 16;
  CmdResult r = sh("tokenize " + testing::qwen3_tokenizer_json() + " --special --file " + text, true);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<int32_t> ids = parse_ids(r.out);
  ASSERT_GE(ids.size(), size_t(3 * ctx));
  const size_t windows = ids.size() / ctx;
  // The reference for the first 3 windows: each window's logits from `swiftlet logits` (a fresh
  // process per window), rows 8..14 scored, log-softmax in double here.
  double sum = 0;
  size_t n = 0;
  const std::string out = path("w.f32");
  for (size_t w = 0; w < 3; ++w) {
    std::string list;
    for (int j = 0; j < ctx; ++j) list += (j ? "," : "") + std::to_string(ids[w * ctx + size_t(j)]);
    r = sh("logits " + model + " --tokens " + list + " --out " + out + " --backend cpu-f32");
    ASSERT_EQ(r.status, 0) << r.out;
    const std::string b = read_text_file(out);
    const size_t V = b.size() / 4 / size_t(ctx);
    std::vector<float> lg(b.size() / 4);
    std::memcpy(lg.data(), b.data(), b.size());
    for (int j = ctx / 2; j <= ctx - 2; ++j) {
      const float* row = lg.data() + size_t(j) * V;
      double m = row[0], s = 0;
      for (size_t i = 0; i < V; ++i) m = std::max(m, double(row[i]));
      for (size_t i = 0; i < V; ++i) s += std::exp(double(row[i]) - m);
      sum += m + std::log(s) - double(row[ids[w * ctx + size_t(j) + 1]]);
      n++;
    }
  }
  r = sh("perplexity " + model + " --file " + text + " --ctx 16 --chunks 3 --json --backend cpu-f32", true);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["n_tokens"].get<size_t>(), ids.size());
  EXPECT_EQ(j["n_windows"].get<size_t>(), 3u);
  EXPECT_EQ(j["n_scored"].get<size_t>(), 3u * 7);
  EXPECT_EQ(n, 3u * 7);
  EXPECT_NEAR(j["nll_mean"].get<double>(), sum / double(n), 1e-5);
  EXPECT_NEAR(j["ppl"].get<double>(), std::exp(sum / double(n)), 1e-4 * std::exp(sum / double(n)));
  // Without --chunks: every full window, the partial one at the end left out.
  r = sh("perplexity " + model + " --file " + text + " --ctx 16 --json", true);
  ASSERT_EQ(r.status, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["n_windows"].get<size_t>(), windows);
  EXPECT_EQ(j["n_scored"].get<size_t>(), windows * 7);
  // Too short a text for one window: a message, not a crash.
  r = sh("perplexity " + model + " --file " + text + " --ctx 100000");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("fewer than one window"), std::string::npos) << r.out;
}

TEST_F(RoutingCli, CompareLogitsAgainstASavedRun) {
  const std::string model = testing::tiny_qpack_with_tokenizer(), text = path("t.txt"), lp = path("base.lp");
  std::ofstream(text) << kText;
  CmdResult r = sh("perplexity " + model + " --file " + text + " --ctx 16 --chunks 3 --save-logits " + lp, true);
  ASSERT_EQ(r.status, 0) << r.out;
  // 48-byte header + 3 windows x 7 tokens x (12 + 2 bytes x vocabulary).
  const uint64_t V = uint64_t(QpackContainer::open(model).config.vocab_size);
  EXPECT_EQ(fs::file_size(lp), 48 + 21 * (12 + 2 * V));
  // The same model against itself: no divergence, the same top token everywhere.
  r = sh("perplexity " + model + " --file " + text + " --ctx 16 --chunks 3 --json --compare-logits " + lp, true);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_LT(j["compare"]["kl_mean"].get<double>(), 1e-6);
  EXPECT_LT(j["compare"]["kl_max"].get<double>(), 1e-5);
  EXPECT_EQ(j["compare"]["top1_agreement"].get<double>(), 1.0);
  EXPECT_NEAR(j["compare"]["base_ppl"].get<double>(), j["ppl"].get<double>(), 1e-3 * j["ppl"].get<double>());
  // fp32 activations instead of the default int8 ones: a small but nonzero divergence.
  r = sh("perplexity " + model + " --file " + text + " --ctx 16 --chunks 3 --json --backend cpu-f32 "
         "--compare-logits " + lp, true);
  ASSERT_EQ(r.status, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["compare"]["kl_max"].get<double>(), 1e-9);
  EXPECT_LT(j["compare"]["kl_mean"].get<double>(), 1e-2);
  // Another window count: refused with what differs.
  r = sh("perplexity " + model + " --file " + text + " --ctx 16 --chunks 2 --compare-logits " + lp);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("use the same text, --ctx and --chunks"), std::string::npos) << r.out;
}

TEST_F(RoutingCli, TraceThenCacheSimAndReplayInBench) {
  const std::string model = testing::tiny_qpack_with_tokenizer(), tr = path("gen.trace");
  CmdResult r = sh("generate " + model + " --ids 5,17,42,7,1000,3,9,11 -n 12 --greedy --print-ids --trace-experts " + tr);
  ASSERT_EQ(r.status, 0) << r.out;
  // The prompt, then every generated token but the last (it is not fed back).
  // The ids are the first line of stdout; stderr (merged in) starts with the expert cache's line.
  size_t generated = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("swiftlet:", 0) != 0) {
      generated = parse_ids(line).size();
      break;
    }
  const size_t fed = 8 + generated - 1;
  EXPECT_NE(r.out.find(fmt::format("expert trace: {} tokens written", fed)), std::string::npos) << r.out;
  const RoutingTrace t = read_routing_trace(tr);
  ASSERT_EQ(t.size(), fed);
  ASSERT_GE(t.size(), 11u) << "the model stopped too early for the bench check below";
  EXPECT_TRUE(t.has_predictions);  // --predict-next 1 is the default on a streamed model

  // 100% of the experts: everything stays, so the hits are the accesses less the distinct experts.
  std::set<std::pair<int, int>> distinct;
  for (size_t i = 0; i < t.size(); ++i)
    for (int l = 0; l < t.layers; ++l)
      for (uint16_t e : t.experts_of(i, l)) distinct.insert({l, e});
  const double accesses = double(t.size() * size_t(t.layers) * size_t(t.top_k));
  r = sh("cachesim " + tr + " --sizes 50,100 --csv", true);
  ASSERT_EQ(r.status, 0) << r.out;
  std::istringstream csv(r.out);
  std::string header, half, full;
  std::getline(csv, header);
  std::getline(csv, half);
  std::getline(csv, full);
  EXPECT_EQ(header, "size_pct,slots,lfu,lfu-global,lru,layer,belady");
  std::vector<double> cols;
  std::stringstream fs_(full);
  for (std::string c; std::getline(fs_, c, ',');) cols.push_back(std::stod(c));
  ASSERT_EQ(cols.size(), 7u);
  EXPECT_EQ(cols[1], double(t.layers * t.experts));
  for (int p = 2; p < 7; ++p) EXPECT_NEAR(cols[size_t(p)], 1.0 - double(distinct.size()) / accesses, 1e-6) << p;
  r = sh("cachesim " + tr + " --sizes 101");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--sizes"), std::string::npos) << r.out;
  r = sh("cachesim " + model);
  EXPECT_EQ(r.status, 1);

  // Replayed in bench (prompt 8, 4 decoded: up to 3 decode steps at positions 8..10) with every
  // expert cached: the decode's misses are the experts of those records not used by records 0..7.
  r = sh("bench " + model + " --routing-trace " + tr + " --cache all --io-modes uring --predict off --prompt-tokens 8 "
         "--decode 4 --disk-seconds 0.1 --memory-mb 8 --json", true);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const size_t steps = j["rows"][0]["decode_tokens"].get<size_t>() - 1;
  std::set<std::pair<int, int>> before, decode;
  for (size_t i = 0; i < 8 + steps; ++i)
    for (int l = 0; l < t.layers; ++l)
      for (uint16_t e : t.experts_of(i, l)) (i < 8 ? before : decode).insert({l, e});
  size_t fresh = 0;
  for (const auto& k : decode) fresh += before.count(k) ? 0 : 1;
  EXPECT_EQ(j["rows"][0]["misses"].get<size_t>(), fresh);
  EXPECT_EQ(j["rows"][0]["hits"].get<size_t>() + fresh, steps * size_t(t.layers * t.top_k));
  EXPECT_NE(j["routing"].get<std::string>().find("replayed from"), std::string::npos);

  // chat: two turns, every token it ran (the second turn prefills only its own tokens).
  const std::string ct = path("chat.trace");
  r = sh("chat " + model + " Hi \"And then?\" -n 3 --greedy --trace-experts " + ct);
  ASSERT_EQ(r.status, 0) << r.out;
  const RoutingTrace c = read_routing_trace(ct);
  EXPECT_NE(r.out.find(fmt::format("expert trace: {} tokens written", c.size())), std::string::npos) << r.out;
  EXPECT_GT(c.size(), 10u);  // the chat template alone is longer
  EXPECT_EQ(c.positions[0], 0);
}

// bench --streams: each batch size in the same process, every stream decoding the same tokens in
// every batch (decode_batch is bit-exact), a step of one stream acquiring top-k experts a layer
// and a step of three the union of theirs; a bad list is refused with a message.
TEST_F(RoutingCli, BenchStreamsComparesBatchSizesInOneProcess) {
  const std::string model = testing::tiny_qpack_with_tokenizer();
  const ModelConfig c = QpackContainer::open(model).config;
  CmdResult r = sh("bench " + model + " --streams 1,3 --cache all --warm --io-modes uring --predict off "
                   "--prompt-tokens 4 --decode 3 --disk-seconds 0.1 --memory-mb 8 --json",
                   true);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["same_tokens"].get<bool>());
  ASSERT_EQ(j["streams"].size(), 1u);
  const auto& cfg = j["streams"][0];
  EXPECT_TRUE(cfg["interleaved"].get<bool>());  // --cache all keeps every expert
  const auto& rows = cfg["rows"];
  ASSERT_EQ(rows.size(), 2u);
  const double one_step = double(c.num_layers * c.num_experts_per_tok);
  EXPECT_EQ(rows[0]["streams"].get<int>(), 1);
  EXPECT_EQ(rows[0]["acquired_per_step"].get<double>(), one_step);
  EXPECT_EQ(rows[1]["streams"].get<int>(), 3);
  EXPECT_GE(rows[1]["acquired_per_step"].get<double>(), one_step);
  EXPECT_LE(rows[1]["acquired_per_step"].get<double>(), 3 * one_step);
  EXPECT_EQ(rows[1]["stream_hashes"].size(), 3u);
  EXPECT_EQ(rows[0]["stream_hashes"][0], rows[1]["stream_hashes"][0]);
  EXPECT_EQ(rows[1]["misses"].get<size_t>(), 0u);  // --warm read them all first
  EXPECT_NEAR(rows[1]["aggregate_tok_s"].get<double>(), 3 * rows[1]["per_stream_tok_s"].get<double>(), 1e-9);

  r = sh("bench " + model + " --streams 1,0 --disk-seconds 0.1 --memory-mb 8");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--streams takes batch sizes"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace swiftlet
