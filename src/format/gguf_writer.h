// GGUF writing, for tests and test tools: metadata of any GGUF type and tensors of any ggml type
// whose bytes the caller has already laid out in blocks (format/gguf_quant.h quantises).
// Version 3, little-endian, general.alignment honoured (32 by default).
#pragma once

#include "format/gguf.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace swiftlet {

class GgufWriter {
 public:
  // Metadata, in the order added (a key added twice is a broken invariant).
  void set(const std::string& key, GgufValue v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, std::string v);
  void set_strings(const std::string& key, std::vector<std::string> v);
  void set_i32s(const std::string& key, const std::vector<int32_t>& v);

  // A tensor: `ne` in ggml order (row length first), `bytes` its blocks (size checked).
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne, std::string bytes);

  // The whole file's bytes; write() puts them in `path` (through a temporary file and a rename).
  std::string bytes() const;
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::string bytes;
  };
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace swiftlet
