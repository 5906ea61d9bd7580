// Paths for tests: the source tree (test data) and the built executables.
#pragma once

#include <string>

namespace swiftlet::testing {

inline std::string source_path(const std::string& rel) { return std::string(SWIFTLET_SOURCE_DIR) + "/" + rel; }
inline std::string bin_path(const std::string& name) { return std::string(SWIFTLET_BIN_DIR) + "/" + name; }
inline std::string fixture_dir(const std::string& name) { return source_path("tests/data/fixtures/" + name); }

}  // namespace swiftlet::testing
