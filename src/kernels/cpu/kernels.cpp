#include "kernels/cpu/kernels.h"

#include "core/error.h"
#include "kernels/cpu/ops_ref.h"

namespace swiftlet {

const Kernels& kernels_for(Backend b) {
  static const Kernels reference{&ref::matmul, &ref::dequant_row, "reference"};
  // The fast CPU kernels fall back to the reference until SIMD versions land.
  static const Kernels cpu{&ref::matmul, &ref::dequant_row, "cpu"};
  return b == Backend::Reference ? reference : cpu;
}

Backend parse_backend(std::string_view s) {
  if (s == "reference") return Backend::Reference;
  if (s == "cpu") return Backend::Cpu;
  fail("unknown backend '{}' (use 'cpu' or 'reference')", s);
}

}  // namespace swiftlet
