// safetensors reading: one file, or a whole checkpoint directory (single file or sharded
// with model.safetensors.index.json). Headers are validated before any tensor is used:
// offsets in bounds and matching shape x dtype, no overlaps, sane header length.
#pragma once

#include "core/dtype.h"
#include "io/mapped_file.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace swiftlet {

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  const std::string* file = nullptr;  // the file it lives in, for messages

  int64_t numel() const;
  int64_t dim(int i) const { return shape.at(size_t(i)); }
  std::string shape_str() const;  // "[512, 2048]"
};

// The bytes a safetensors file's header takes (the 8-byte length and the JSON), from its first
// 8 bytes.
uint64_t safetensors_head_bytes(const uint8_t* first8);

class SafetensorsFile {
 public:
  // Maps and validates the file. Throws Error naming the file (and tensor) on any problem.
  explicit SafetensorsFile(const std::string& path, Residency mode = Residency::Map);
  // A file known by its first bytes (`head`, at least its header) and its size before it is on
  // disk (a shard still to be downloaded): the views point into a reserved address range, read
  // only between attach() and detach().
  SafetensorsFile(const std::string& path, uint64_t size, std::string head);
  // Maps the file, now on disk, over the views' range; throws Error unless it has the announced
  // size and header.
  void attach();
  void detach();  // the file may be deleted afterwards
  bool attached() const { return file_.attached(); }

  const std::string& path() const { return file_.path(); }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  void parse(const uint8_t* head, size_t size);

  MappedFile file_;
  std::string head_;  // reserved files: the announced first bytes
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint's model.safetensors.index.json: which shard (a file name in the checkpoint's folder)
// holds each tensor. Throws Error naming the file when it is not a valid index.
struct SafetensorsIndex {
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> shard, as listed
  std::vector<std::string> shards;                               // each shard once, first seen first
};
SafetensorsIndex read_safetensors_index(const std::string& dir);

// All tensors of a checkpoint directory by name.
class TensorSet {
 public:
  // Opens `dir`: model.safetensors.index.json if present (every shard it names must exist and
  // hold the tensors it lists), else model.safetensors, else every *.safetensors file.
  static TensorSet open_dir(const std::string& dir);
  static TensorSet open_files(const std::vector<std::string>& paths, Residency mode = Residency::Map);
  // The checkpoint of `dir`'s model.safetensors.index.json, each shard it names (a path in `dir`)
  // opened by `open_shard`, which may reserve it rather than map it (SafetensorsFile's reserving
  // constructor).
  static TensorSet open_index(const std::string& dir,
                              const std::function<std::unique_ptr<SafetensorsFile>(const std::string&)>& open_shard);

  // The tensors of `files` (opened or reserved), named `source` in messages.
  static TensorSet of_files(std::vector<std::unique_ptr<SafetensorsFile>> files, const std::string& source);

  // The files, in the order they were opened.
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  const TensorView* find(const std::string& name) const;
  // Throws Error("missing tensor NAME in DIR ...") when absent.
  const TensorView& get(const std::string& name) const;
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  std::vector<std::string> names() const;
  const std::string& source() const { return source_; }

 private:
  void add(std::unique_ptr<SafetensorsFile> f);

  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> by_name_;
};

}  // namespace swiftlet
