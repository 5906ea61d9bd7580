// One dispatch point for the CPU kernels: the scalar reference (the oracle) or the fast ones,
// chosen at run time (--backend).
#pragma once

#include "kernels/cpu/qmatrix.h"

#include <cstdint>
#include <string_view>

namespace swiftlet {

enum class Backend { Reference, Cpu };

struct Kernels {
  // Y[t, rows] = W X[t, cols] for t < n.
  void (*matmul)(const QMatrix& w, const float* x, int64_t n, float* y);
  // out[0..cols) = row r of W.
  void (*dequant_row)(const QMatrix& w, int64_t r, float* out);
  const char* name;
};

const Kernels& kernels_for(Backend b);
// "reference" or "cpu"; throws Error otherwise.
Backend parse_backend(std::string_view s);

}  // namespace swiftlet
