#include "bench_modes.h"

#include "model/miss_policy.h"

#include <algorithm>
#include <sstream>

namespace swiftlet::cli {

std::vector<std::string> on_miss_settings(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const std::string name = parse_miss_policy(item).name();
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  if (out.empty()) out.push_back("exact");
  return out;
}

std::string on_miss_label(const std::string& setting) { return parse_miss_policy(setting).label(); }

}  // namespace swiftlet::cli
