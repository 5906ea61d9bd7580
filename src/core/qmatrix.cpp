#include "core/qmatrix.h"

namespace swiftlet {

size_t QMatrix::row_bytes() const {
  switch (format) {
    case WeightFormat::F32: return size_t(cols) * 4;
    case WeightFormat::F16:
    case WeightFormat::BF16: return size_t(cols) * 2;
    case WeightFormat::Affine: return size_t(cols) * size_t(bits) / 8;
  }
  return 0;
}

size_t QMatrix::scale_row_bytes() const {
  return format == WeightFormat::Affine ? size_t(cols / group_size) * dtype_size(scale_dtype) : 0;
}

size_t QMatrix::total_bytes() const { return size_t(rows) * (row_bytes() + 2 * scale_row_bytes()); }

QMatrix QMatrix::row_slice(int64_t r0, int64_t n) const {
  QMatrix m = *this;
  m.rows = n;
  m.data = static_cast<const uint8_t*>(data) + size_t(r0) * row_bytes();
  if (format == WeightFormat::Affine) {
    m.scales = static_cast<const uint8_t*>(scales) + size_t(r0) * scale_row_bytes();
    m.biases = static_cast<const uint8_t*>(biases) + size_t(r0) * scale_row_bytes();
  }
  return m;
}

}  // namespace swiftlet
