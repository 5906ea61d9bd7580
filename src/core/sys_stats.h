// Process-level measurements printed with the statistics.
#pragma once

#include <cstddef>

namespace swiftlet {

// Peak resident set size of this process so far (getrusage), in bytes.
size_t peak_rss_bytes();
// Resident set size now (/proc/self/statm), in bytes; 0 where unavailable.
size_t current_rss_bytes();

}  // namespace swiftlet
