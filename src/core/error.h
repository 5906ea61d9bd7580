// Two tiers of errors (docs/DEVELOPERS.md):
//  - swiftlet::Error: a recoverable problem with the user's input (a file, a request, a flag).
//    Its message says what is wrong and what to do. Thrown, caught once at the boundary
//    (a main(), the server's route wrapper) and turned into a message / exit code / HTTP 4xx.
//  - SWIFTLET_CHECK: a broken invariant of our own code. Prints and aborts.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace swiftlet {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace swiftlet

#define SWIFTLET_CHECK(cond, ...)                                                         \
  do {                                                                                     \
    if (!(cond)) ::swiftlet::check_failed(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)
