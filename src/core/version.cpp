#include "core/version.h"

namespace swiftlet {

std::string_view version() { return SWIFTLET_VERSION; }

}  // namespace swiftlet
