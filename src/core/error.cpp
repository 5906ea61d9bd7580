#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace swiftlet {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "swiftlet: internal error at %s:%d: check '%s' failed: %s\n", file, line,
               expr, msg.c_str());
  std::abort();
}

}  // namespace swiftlet
