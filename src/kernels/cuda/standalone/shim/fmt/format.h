// Stand-in for the small part of {fmt} that core/error.h uses, for the standalone CUDA test build
// on machines without libfmt-dev (build.sh). Replaces each "{}" by the next argument; no specs.
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

namespace fmt {

template <typename... Args>
struct basic_format_string {
  std::string_view str;
  template <typename S, typename = std::enable_if_t<std::is_convertible_v<const S&, std::string_view>>>
  constexpr basic_format_string(const S& s) : str(s) {}
};
template <typename... Args>
using format_string = basic_format_string<std::type_identity_t<Args>...>;

namespace detail {
inline void put(std::ostringstream& os, std::string_view& f) { os << f; }
template <typename T, typename... Rest>
void put(std::ostringstream& os, std::string_view& f, const T& v, const Rest&... rest) {
  const size_t at = f.find("{}");
  if (at == std::string_view::npos) {
    os << f;
    return;
  }
  os << f.substr(0, at) << v;
  f.remove_prefix(at + 2);
  put(os, f, rest...);
}
}  // namespace detail

template <typename... Args>
std::string format(format_string<Args...> f, Args&&... args) {
  std::ostringstream os;
  std::string_view rest = f.str;
  detail::put(os, rest, args...);
  return os.str();
}

}  // namespace fmt
