// Small helpers shared by the subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace swiftlet::cli {

// "5,17,42" -> {5, 17, 42}. Throws Error naming the bad entry.
std::vector<int32_t> parse_id_list(const std::string& s, const char* flag);

}  // namespace swiftlet::cli
