// swiftlet bench --on-miss exact,skip:0.05,...: the miss policies (model/miss_policy.h) to compare,
// each in its own process, and how a row of the tables names its mode ("exact" or "lossy (skip:W)").
#pragma once

#include <string>
#include <vector>

namespace swiftlet::cli {

// The settings of a comma-separated list, each checked (throws Error naming the accepted forms)
// and spelled as MissPolicy::name() spells it; duplicates dropped. Empty list: {"exact"}.
std::vector<std::string> on_miss_settings(const std::string& list);

// "exact" or "lossy (skip:0.05)" for a setting that on_miss_settings returned.
std::string on_miss_label(const std::string& setting);

}  // namespace swiftlet::cli
