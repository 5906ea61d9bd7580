#include "format/safetensors.h"

#include "core/error.h"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>

namespace swiftlet {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_str() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

uint64_t safetensors_head_bytes(const uint8_t* first8) {
  uint64_t n;
  std::memcpy(&n, first8, 8);
  return n > kMaxHeaderBytes ? UINT64_MAX : 8 + n;
}

SafetensorsFile::SafetensorsFile(const std::string& path, Residency mode) : file_(path, mode) {
  parse(file_.data(), file_.size());
}

SafetensorsFile::SafetensorsFile(const std::string& path, uint64_t size, std::string head)
    : file_(MappedFile::reserve(path, size_t(size))), head_(std::move(head)) {
  if (head_.size() < 8 || head_.size() < safetensors_head_bytes(reinterpret_cast<const uint8_t*>(head_.data())) ||
      head_.size() > size)
    fail("'{}': the {} first bytes given do not hold its safetensors header (file of {} bytes)", path,
         head_.size(), size);
  parse(reinterpret_cast<const uint8_t*>(head_.data()), size_t(size));
}

void SafetensorsFile::attach() {
  file_.attach();
  if (!head_.empty() && std::memcmp(file_.data(), head_.data(), head_.size()) != 0) {
    file_.detach();
    fail("'{}' does not start with the header announced for it (changed since?)", path());
  }
}

void SafetensorsFile::detach() { file_.detach(); }

void SafetensorsFile::parse(const uint8_t* head, size_t size) {
  const std::string& path = file_.path();
  if (size < 8)
    fail("'{}' is not a safetensors file: {} bytes, too short for a header (truncated download?)",
         path, size);
  uint64_t header_len;
  std::memcpy(&header_len, head, 8);
  if (header_len == 0 || header_len > kMaxHeaderBytes || header_len > size - 8)
    fail("'{}' has a corrupt safetensors header: header length {} for a file of {} bytes "
         "(truncated or not a safetensors file)", path, header_len, size);
  const char* hbegin = reinterpret_cast<const char*>(head + 8);
  json header = json::parse(hbegin, hbegin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    fail("'{}' has a corrupt safetensors header: not a JSON object", path);

  const uint8_t* data = file_.data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_object())
        for (auto& [k, v] : entry.items())
          if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    auto bad = [&, &name = name](const std::string& why) {
      fail("'{}': tensor '{}' has a corrupt header entry: {}", path, name, why);
    };
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      bad("needs dtype, shape and data_offsets");
    const auto& jd = entry["dtype"];
    const auto& js = entry["shape"];
    const auto& jo = entry["data_offsets"];
    if (!jd.is_string() || !js.is_array() || !jo.is_array() || jo.size() != 2)
      bad("wrong field types");
    TensorView t;
    t.name = name;
    t.dtype = parse_dtype(jd.get<std::string>());
    uint64_t numel = 1;
    for (const auto& d : js) {
      if (!d.is_number_unsigned()) bad("shape entries must be non-negative integers");
      uint64_t v = d.get<uint64_t>();
      if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / v) bad("shape overflows");
      numel *= v;
      t.shape.push_back(int64_t(v));
    }
    if (!jo[0].is_number_unsigned() || !jo[1].is_number_unsigned()) bad("offsets must be integers");
    uint64_t begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
    if (begin > end || end > data_size)
      bad(fmt::format("data offsets [{}, {}) outside the {} data bytes of the file (truncated?)",
                      begin, end, data_size));
    if (numel > std::numeric_limits<uint64_t>::max() / dtype_size(t.dtype) ||
        numel * dtype_size(t.dtype) != end - begin)
      bad(fmt::format("shape {} x {} needs {} bytes but the offsets give {}", t.shape_str(),
                      dtype_name(t.dtype), numel * dtype_size(t.dtype), end - begin));
    // The kernels read tensors in place, as arrays of their element type.
    if (const uint64_t at = 8 + header_len + begin; at % dtype_size(t.dtype) != 0)
      bad(fmt::format("its data starts at byte {} of the file, not a multiple of its {}-byte {} "
                      "elements; the safetensors library aligns every tensor: save the file again "
                      "with it (or download it again)", at, dtype_size(t.dtype), dtype_name(t.dtype)));
    t.data = data + begin;
    t.nbytes = end - begin;
    t.file = &file_.path();
    tensors_.push_back(std::move(t));
  }
  // No two tensors may share bytes.
  std::vector<const TensorView*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->data < b->data; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i - 1]->data + order[i - 1]->nbytes > order[i]->data)
      fail("'{}' has a corrupt safetensors header: tensors '{}' and '{}' overlap", path,
           order[i - 1]->name, order[i]->name);
  std::sort(tensors_.begin(), tensors_.end(), [](auto& a, auto& b) { return a.name < b.name; });
}

void TensorSet::add(std::unique_ptr<SafetensorsFile> f) {
  files_.push_back(std::move(f));
  for (const auto& t : files_.back()->tensors()) {
    auto [it, inserted] = by_name_.emplace(t.name, &t);
    if (!inserted) fail("tensor '{}' appears in both '{}' and '{}'", t.name, *it->second->file, files_.back()->path());
  }
}

TensorSet TensorSet::of_files(std::vector<std::unique_ptr<SafetensorsFile>> files, const std::string& source) {
  TensorSet set;
  for (auto& f : files) set.add(std::move(f));
  set.source_ = source;
  return set;
}

TensorSet TensorSet::open_files(const std::vector<std::string>& paths, Residency mode) {
  TensorSet set;
  for (const auto& p : paths) set.add(std::make_unique<SafetensorsFile>(p, mode));
  return set;
}

SafetensorsIndex read_safetensors_index(const std::string& dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  json j = json::parse(read_text_file(index.string()), nullptr, false);
  if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail("'{}' is not a valid safetensors index (needs a weight_map object)", index.string());
  SafetensorsIndex out;
  for (auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) fail("'{}': weight_map entry for '{}' is not a file name", index.string(), name);
    const std::string f = file.get<std::string>();
    out.weight_map.emplace_back(name, f);
    if (std::find(out.shards.begin(), out.shards.end(), f) == out.shards.end()) out.shards.push_back(f);
  }
  return out;
}

TensorSet TensorSet::open_index(const std::string& dir,
                                const std::function<std::unique_ptr<SafetensorsFile>(const std::string&)>& open_shard) {
  const SafetensorsIndex idx = read_safetensors_index(dir);
  TensorSet set;
  for (const auto& f : idx.shards) set.add(open_shard((fs::path(dir) / f).string()));
  for (const auto& [name, file] : idx.weight_map) {
    const TensorView* t = set.find(name);
    const std::string f = (fs::path(dir) / file).string();
    if (!t || *t->file != f)
      fail("'{}' says tensor '{}' is in '{}' but that file does not hold it",
           (fs::path(dir) / "model.safetensors.index.json").string(), name, f);
  }
  set.source_ = dir;
  return set;
}

TensorSet TensorSet::open_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) fail("'{}' is not a directory", dir);
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    return open_index(dir, [&](const std::string& f) {
      if (!fs::exists(f)) fail("shard '{}' named by '{}' is missing (incomplete download?)", f, index.string());
      return std::make_unique<SafetensorsFile>(f);
    });
  }
  TensorSet set;
  if (fs::exists(fs::path(dir) / "model.safetensors")) {
    set = open_files({(fs::path(dir) / "model.safetensors").string()});
  } else {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty()) fail("no .safetensors files in '{}'", dir);
    set = open_files(files);
  }
  set.source_ = dir;
  return set;
}

const TensorView* TensorSet::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorView& TensorSet::get(const std::string& name) const {
  const TensorView* t = find(name);
  if (!t) fail("missing tensor '{}' in '{}' (incomplete or wrong checkpoint?)", name, source_);
  return *t;
}

std::vector<std::string> TensorSet::names() const {
  std::vector<std::string> out;
  for (const auto& [n, t] : by_name_) out.push_back(n);
  return out;
}

}  // namespace swiftlet
