#include "format/safetensors_writer.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace swiftlet {

namespace {
size_t nbytes_of(const TensorToWrite& t) {
  size_t n = dtype_size(t.dtype);
  for (int64_t d : t.shape) n *= size_t(d);
  return n;
}
}  // namespace

std::string safetensors_header(const std::vector<TensorToWrite>& tensors_in,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> tensors;
  for (const auto& t : tensors_in) tensors.push_back(&t);
  std::sort(tensors.begin(), tensors.end(), [](auto* a, auto* b) { return a->name < b->name; });
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  size_t off = 0;
  for (const auto* t : tensors) {
    size_t n = nbytes_of(*t);
    h[t->name] = {{"dtype", std::string(dtype_name(t->dtype))},
                  {"shape", t->shape},
                  {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string json = h.dump();
  while ((json.size() + 8) % 8 != 0) json.push_back(' ');
  uint64_t len = json.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  return out + json;
}

void write_safetensors(const std::string& path, std::vector<TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::string header = safetensors_header(tensors, metadata);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("cannot create '{}': {}", path, std::strerror(errno));
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const auto& t : tensors) {
    size_t n = nbytes_of(t);
    if (ok && n) ok = std::fwrite(t.data, 1, n, f) == n;
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    int e = errno;
    std::remove(path.c_str());
    fail("cannot write '{}': {} (disk full?)", path, std::strerror(e));
  }
}

}  // namespace swiftlet
