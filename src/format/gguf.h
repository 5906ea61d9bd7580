// GGUF reading (llama.cpp's model files, versions 2 and 3; ggml's docs/gguf.md): a file's header,
// its typed key-value metadata (arrays included), its tensor table and the tensors' bytes in the
// mapped file. Everything is checked before it is used: every count against the bytes left to
// hold it (no allocation is sized by a count the file has not paid for), every tensor's shape,
// type, alignment and bytes inside the file, no two tensors sharing bytes. A file that fails any
// check throws Error naming the file and what is wrong.
#pragma once

#include "io/mapped_file.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace swiftlet {

// ggml's tensor types (ggml.h `enum ggml_type`), by their numbers in the file. Every type with a
// known block layout is listed, readable or not, so the reader can check any file's sizes and
// the converter can refuse a tensor by its type's name.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct GgmlTypeInfo {
  std::string_view name;   // "Q4_K"
  int64_t block = 0;       // elements per block (1 for plain types)
  size_t block_bytes = 0;  // bytes per block
};
// The layout of type number `t`, or nullopt for a number ggml does not (or no longer) define.
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t t);
// "Q4_K", or "type 31" for an unknown number.
std::string ggml_type_name(uint32_t t);

// Metadata value types (gguf.h `enum gguf_type`).
enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// One metadata value. Scalars: integers (and bools) in `i` (or `u` for U64 beyond int64), floats
// in `f`, strings in `s`. Arrays: `elem` is the element type and the elements sit in `ints`,
// `floats` or `strings` by that type (arrays of arrays are refused: llama.cpp writes none).
struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType elem = GgufType::U8;  // arrays only
  int64_t i = 0;
  uint64_t u = 0;  // the raw value of unsigned integers (U64 may exceed int64)
  double f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;

  bool is_integer() const;  // U8..I64 and Bool
  bool is_float() const { return type == GgufType::F32 || type == GgufType::F64; }
  size_t array_size() const;
};

struct GgufTensor {
  std::string name;
  uint32_t type = 0;        // a GgmlType number, one ggml_type_info() knows
  std::vector<int64_t> ne;  // ggml order: ne[0] is the row (innermost, contiguous) length
  uint64_t offset = 0;      // from the start of the file
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  const std::string* file = nullptr;  // for messages

  int64_t numel() const;
  // Row-major shape, outermost first (ne reversed), as safetensors and swiftlet name shapes.
  std::vector<int64_t> shape() const;
  std::string shape_str() const;  // "[rows, cols]" in row-major order
  std::string type_name() const { return ggml_type_name(type); }
};

class GgufFile {
 public:
  // Maps and validates `path`. Throws Error naming the file on any problem.
  explicit GgufFile(const std::string& path, Residency mode = Residency::Map);

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // where the tensor data starts
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // in file order
  const GgufTensor* find_tensor(const std::string& name) const;

  // Metadata lookups. The get_* forms throw Error naming the file and key when the key is
  // missing or of another type; the find form returns null when absent.
  const GgufValue* find(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;  // floats, or integers as floats
  const std::string& get_string(const std::string& key) const;
  const std::vector<std::string>& get_strings(const std::string& key) const;
  const std::vector<int64_t>& get_ints(const std::string& key) const;

 private:
  const GgufValue& get(const std::string& key, const char* want) const;
  MappedFile file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> by_name_;
};

// A model's GGUF files: one file, or every part of a split model (NAME-00001-of-0000N.gguf, as
// llama.cpp's gguf-split writes them; the first part's metadata describes the model).
class GgufModel {
 public:
  // `path`: a .gguf file (any part of a split model opens every part) or a directory holding one
  // model's file or parts (vision projectors, mmproj*.gguf, are skipped). Throws Error for a
  // missing part, a part count that disagrees with split.count, or a tensor in two parts.
  static GgufModel open(const std::string& path);

  const GgufFile& meta() const { return *files_.front(); }
  const std::vector<std::unique_ptr<GgufFile>>& files() const { return files_; }
  const GgufTensor* find(const std::string& name) const;
  // Throws Error naming the model when absent.
  const GgufTensor& get(const std::string& name) const;
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::unique_ptr<GgufFile>> files_;
  std::map<std::string, const GgufTensor*> by_name_;
};

}  // namespace swiftlet
