// The version of this build (CMake's project version), for --version and the server's /props.
#pragma once

#include <string_view>

namespace swiftlet {

std::string_view version();

}  // namespace swiftlet
