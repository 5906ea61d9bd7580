// DataError, a kind of swiftlet::Error (core/error.h): the model's own files failed while in use
// (an expert that cannot be read, or fails its checksum). Not the request's fault: the server
// answers 500 for it, where other Errors during a request are the request's (400).
#pragma once

#include "core/error.h"

namespace swiftlet {

class DataError : public Error {
 public:
  explicit DataError(const std::string& what) : Error(what) {}
};

template <typename... Args>
[[noreturn]] void fail_data(fmt::format_string<Args...> f, Args&&... args) {
  throw DataError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace swiftlet
