// Writing safetensors files (resident weights of a .qpack, test checkpoints).
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace swiftlet {

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // numel(shape) * dtype_size(dtype) bytes, must outlive the write
};

// Builds the header (tensors sorted by name, data packed in that order, header padded with
// spaces to a multiple of 8 bytes). Returns the header bytes including the 8-byte length.
std::string safetensors_header(const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// Writes a complete file. Throws Error on IO failure (the partial file is removed).
void write_safetensors(const std::string& path, std::vector<TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace swiftlet
