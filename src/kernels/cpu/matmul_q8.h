// The int8-activation products for affine weights, whatever the instruction set: the prepared
// activations every kernel reads (x86: matmul_q8_avx2.cpp lays them out; Arm: matmul_q8_neon.cpp,
// the same values in the same order) and the weight formats they take.
#pragma once

#include "core/qmatrix.h"

#include <cstdint>
#include <vector>

namespace swiftlet::q8 {

// Each block of 64 values of x is quantised to int8 with its own scale d = amax / 127 (q =
// x * (1 / d) rounded to nearest even), laid out to meet the packed weight bytes directly: for
// 4-bit weights out[m] = q[2m], out[32 + m] = q[2m + 1] (byte m of a block's 32 packed bytes holds
// element 2m in its low nibble, 2m + 1 in its high one); for 8-bit weights out[m] = q[m]. The
// bias term uses the exact fp32 block sums. Per-token arrays of block factors are zero-padded to a
// multiple of 8 blocks (nbp) so the kernels read them 8 (or 4) at a time. The prepare functions
// only grow the buffers: keep one per thread.
struct PreparedQ8 {
  std::vector<int8_t> xq;   // [n][cols] permuted to the weight byte order
  std::vector<float> d;     // [n][nbp] activation scale per block of 64
  std::vector<float> xsum;  // [n][nbp] exact sum of x per block
  std::vector<float> qsum;  // [n][nbp] 128 * sum of xq per block (8-bit weights' offset)
};

// Affine, 4 or 8 bits, group a multiple of 64.
inline bool supported(const QMatrix& w) {
  return w.format == WeightFormat::Affine && (w.bits == 4 || w.bits == 8) && w.group_size % 64 == 0 &&
         w.cols % w.group_size == 0;
}

}  // namespace swiftlet::q8
