// Paths for tests: the source tree (test data) and the built executables.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace swiftlet::testing {

inline std::string source_path(const std::string& rel) { return fmt::format("{}/{}", SWIFTLET_SOURCE_DIR, rel); }
inline std::string bin_path(const std::string& name) { return fmt::format("{}/{}", SWIFTLET_BIN_DIR, name); }
inline std::string fixture_dir(const std::string& name) { return source_path("tests/data/fixtures/" + name); }

// The reference fixtures present (those with a reference.json), sorted.
inline std::vector<std::string> fixture_names() {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  const std::string root = source_path("tests/data/fixtures");
  if (!fs::exists(root)) return out;
  for (const auto& e : fs::directory_iterator(root))
    if (fs::exists(e.path() / "reference.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace swiftlet::testing
