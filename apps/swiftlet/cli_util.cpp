#include "cli_util.h"

#include "core/error.h"

#include <charconv>

namespace swiftlet::cli {

std::vector<int32_t> parse_id_list(const std::string& s, const char* flag) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int32_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v < 0)
      fail("{}: '{}' is not a non-negative token id (expected a list like 5,17,42)", flag, item);
    ids.push_back(v);
    i = j + 1;
  }
  if (ids.empty()) fail("{}: no token ids given", flag);
  return ids;
}

}  // namespace swiftlet::cli
