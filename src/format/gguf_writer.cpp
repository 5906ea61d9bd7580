#include "format/gguf_writer.h"

#include "core/error.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace swiftlet {

namespace {

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

// One scalar of type t from the value's fields (ints from `i`, floats from `f`).
void put_scalar(std::string& out, GgufType t, int64_t i, uint64_t u, double f, const std::string& s) {
  switch (t) {
    case GgufType::U8:
      put<uint8_t>(out, uint8_t(i));
      break;
    case GgufType::I8:
      put<int8_t>(out, int8_t(i));
      break;
    case GgufType::U16:
      put<uint16_t>(out, uint16_t(i));
      break;
    case GgufType::I16:
      put<int16_t>(out, int16_t(i));
      break;
    case GgufType::U32:
      put<uint32_t>(out, uint32_t(i));
      break;
    case GgufType::I32:
      put<int32_t>(out, int32_t(i));
      break;
    case GgufType::U64:
      put<uint64_t>(out, u ? u : uint64_t(i));
      break;
    case GgufType::I64:
      put<int64_t>(out, i);
      break;
    case GgufType::Bool:
      put<uint8_t>(out, i ? 1 : 0);
      break;
    case GgufType::F32:
      put<float>(out, float(f));
      break;
    case GgufType::F64:
      put<double>(out, f);
      break;
    case GgufType::String:
      put_string(out, s);
      break;
    case GgufType::Array:
      SWIFTLET_CHECK(false, "no arrays of arrays");
  }
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue v) {
  for (const auto& kv : kv_) SWIFTLET_CHECK(kv.first != key, "GGUF key {} set twice", key);
  kv_.emplace_back(key, std::move(v));
}

void GgufWriter::set_u32(const std::string& key, uint32_t v) {
  GgufValue x;
  x.type = GgufType::U32;
  x.i = v;
  x.u = v;
  set(key, std::move(x));
}
void GgufWriter::set_i32(const std::string& key, int32_t v) {
  GgufValue x;
  x.type = GgufType::I32;
  x.i = v;
  set(key, std::move(x));
}
void GgufWriter::set_u64(const std::string& key, uint64_t v) {
  GgufValue x;
  x.type = GgufType::U64;
  x.u = v;
  x.i = int64_t(v);
  set(key, std::move(x));
}
void GgufWriter::set_f32(const std::string& key, float v) {
  GgufValue x;
  x.type = GgufType::F32;
  x.f = v;
  set(key, std::move(x));
}
void GgufWriter::set_bool(const std::string& key, bool v) {
  GgufValue x;
  x.type = GgufType::Bool;
  x.i = v;
  set(key, std::move(x));
}
void GgufWriter::set_string(const std::string& key, std::string v) {
  GgufValue x;
  x.type = GgufType::String;
  x.s = std::move(v);
  set(key, std::move(x));
}
void GgufWriter::set_strings(const std::string& key, std::vector<std::string> v) {
  GgufValue x;
  x.type = GgufType::Array;
  x.elem = GgufType::String;
  x.strings = std::move(v);
  set(key, std::move(x));
}
void GgufWriter::set_i32s(const std::string& key, const std::vector<int32_t>& v) {
  GgufValue x;
  x.type = GgufType::Array;
  x.elem = GgufType::I32;
  x.ints.assign(v.begin(), v.end());
  set(key, std::move(x));
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne, std::string bytes) {
  const auto info = ggml_type_info(uint32_t(type));
  SWIFTLET_CHECK(info && !ne.empty(), "bad GGUF tensor {}", name);
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  SWIFTLET_CHECK(ne[0] % info->block == 0 && size_t(n / info->block) * info->block_bytes == bytes.size(),
                 "GGUF tensor {}: {} bytes for {} elements of {}", name, bytes.size(), n, info->name);
  tensors_.push_back({name, type, std::move(ne), std::move(bytes)});
}

std::string GgufWriter::bytes() const {
  uint64_t align = 32;
  for (const auto& [k, v] : kv_)
    if (k == "general.alignment") align = v.u ? v.u : uint64_t(v.i);
  std::string out = "GGUF";
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_.size());
  for (const auto& [k, v] : kv_) {
    put_string(out, k);
    put<uint32_t>(out, uint32_t(v.type));
    if (v.type != GgufType::Array) {
      put_scalar(out, v.type, v.i, v.u, v.f, v.s);
      continue;
    }
    put<uint32_t>(out, uint32_t(v.elem));
    put<uint64_t>(out, v.array_size());
    for (int64_t i : v.ints) put_scalar(out, v.elem, i, 0, 0, {});
    for (double f : v.floats) put_scalar(out, v.elem, 0, 0, f, {});
    for (const std::string& s : v.strings) put_scalar(out, v.elem, 0, 0, 0, s);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, uint32_t(t.ne.size()));
    for (int64_t d : t.ne) put<int64_t>(out, d);
    put<uint32_t>(out, uint32_t(t.type));
    put<uint64_t>(out, offset);
    offset += (t.bytes.size() + align - 1) / align * align;
  }
  for (const Tensor& t : tensors_) {
    out.resize((out.size() + align - 1) / align * align, '\0');
    out += t.bytes;
  }
  return out;
}

void GgufWriter::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    const std::string b = bytes();
    f.write(b.data(), std::streamsize(b.size()));
    if (!f.flush()) {
      std::remove(tmp.c_str());
      fail("cannot write '{}'", tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("cannot rename '{}' to '{}': {}", tmp, path, ec.message());
}

}  // namespace swiftlet
