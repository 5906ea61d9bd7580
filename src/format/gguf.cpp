#include "format/gguf.h"

#include "core/error.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>

namespace swiftlet {

namespace {

// Block layouts from ggml's type traits: elements per block and bytes per block.
constexpr std::array kTypes = {
    std::pair{GgmlType::F32, GgmlTypeInfo{"F32", 1, 4}},
    std::pair{GgmlType::F16, GgmlTypeInfo{"F16", 1, 2}},
    std::pair{GgmlType::Q4_0, GgmlTypeInfo{"Q4_0", 32, 18}},
    std::pair{GgmlType::Q4_1, GgmlTypeInfo{"Q4_1", 32, 20}},
    std::pair{GgmlType::Q5_0, GgmlTypeInfo{"Q5_0", 32, 22}},
    std::pair{GgmlType::Q5_1, GgmlTypeInfo{"Q5_1", 32, 24}},
    std::pair{GgmlType::Q8_0, GgmlTypeInfo{"Q8_0", 32, 34}},
    std::pair{GgmlType::Q8_1, GgmlTypeInfo{"Q8_1", 32, 36}},
    std::pair{GgmlType::Q2_K, GgmlTypeInfo{"Q2_K", 256, 84}},
    std::pair{GgmlType::Q3_K, GgmlTypeInfo{"Q3_K", 256, 110}},
    std::pair{GgmlType::Q4_K, GgmlTypeInfo{"Q4_K", 256, 144}},
    std::pair{GgmlType::Q5_K, GgmlTypeInfo{"Q5_K", 256, 176}},
    std::pair{GgmlType::Q6_K, GgmlTypeInfo{"Q6_K", 256, 210}},
    std::pair{GgmlType::Q8_K, GgmlTypeInfo{"Q8_K", 256, 292}},
    std::pair{GgmlType::IQ2_XXS, GgmlTypeInfo{"IQ2_XXS", 256, 66}},
    std::pair{GgmlType::IQ2_XS, GgmlTypeInfo{"IQ2_XS", 256, 74}},
    std::pair{GgmlType::IQ3_XXS, GgmlTypeInfo{"IQ3_XXS", 256, 98}},
    std::pair{GgmlType::IQ1_S, GgmlTypeInfo{"IQ1_S", 256, 50}},
    std::pair{GgmlType::IQ4_NL, GgmlTypeInfo{"IQ4_NL", 32, 18}},
    std::pair{GgmlType::IQ3_S, GgmlTypeInfo{"IQ3_S", 256, 110}},
    std::pair{GgmlType::IQ2_S, GgmlTypeInfo{"IQ2_S", 256, 82}},
    std::pair{GgmlType::IQ4_XS, GgmlTypeInfo{"IQ4_XS", 256, 136}},
    std::pair{GgmlType::I8, GgmlTypeInfo{"I8", 1, 1}},
    std::pair{GgmlType::I16, GgmlTypeInfo{"I16", 1, 2}},
    std::pair{GgmlType::I32, GgmlTypeInfo{"I32", 1, 4}},
    std::pair{GgmlType::I64, GgmlTypeInfo{"I64", 1, 8}},
    std::pair{GgmlType::F64, GgmlTypeInfo{"F64", 1, 8}},
    std::pair{GgmlType::IQ1_M, GgmlTypeInfo{"IQ1_M", 256, 56}},
    std::pair{GgmlType::BF16, GgmlTypeInfo{"BF16", 1, 2}},
    std::pair{GgmlType::TQ1_0, GgmlTypeInfo{"TQ1_0", 256, 54}},
    std::pair{GgmlType::TQ2_0, GgmlTypeInfo{"TQ2_0", 256, 66}},
    std::pair{GgmlType::MXFP4, GgmlTypeInfo{"MXFP4", 32, 17}},
};

// ggml's limit on a tensor's dimensions (GGML_MAX_DIMS).
constexpr uint32_t kMaxDims = 4;
// The most elements a metadata array may have: the tokenizer's arrays are the largest
// (~250 000 entries); the bound keeps an array of bytes from growing 8-fold in memory.
constexpr uint64_t kMaxArray = 1u << 24;

// Bytes a value of scalar type t takes, 0 for strings and arrays (variable), -1 if unknown.
int scalar_bytes(uint32_t t) {
  switch (GgufType(t)) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::Bool:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    case GgufType::String:
    case GgufType::Array:
      return 0;
  }
  return -1;
}

// Reads little-endian values from [p, end), every read checked against the bytes left.
class Cursor {
 public:
  Cursor(const uint8_t* begin, size_t size, const std::string& path)
      : begin_(begin), p_(begin), end_(begin + size), path_(path) {}

  size_t pos() const { return size_t(p_ - begin_); }
  size_t left() const { return size_t(end_ - p_); }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > left())
      fail(
          "'{}' is a corrupt GGUF file: {} at byte {} claims {} bytes, but only {} are left "
          "(truncated download?)",
          path_, what, pos() - 8, n, left());
    std::string s(reinterpret_cast<const char*>(p_), size_t(n));
    p_ += n;
    return s;
  }
  // A count of items of at least `min_bytes` each: more than the bytes left could hold is
  // corrupt, so nothing is ever sized by an unpaid count.
  uint64_t read_count(const char* what, size_t min_bytes) {
    const uint64_t n = read<uint64_t>(what);
    if (n > left() / min_bytes)
      fail(
          "'{}' is a corrupt GGUF file: {} {} at byte {} cannot fit in the {} bytes left "
          "(truncated download, or not a GGUF file)",
          path_, what, n, pos() - 8, left());
    return n;
  }

 private:
  void need(size_t n, const char* what) const {
    if (n > left())
      fail("'{}' is a corrupt GGUF file: it ends at byte {} inside {} (truncated download?)", path_, pos() + left(),
           what);
  }
  const uint8_t* begin_;
  const uint8_t* p_;
  const uint8_t* end_;
  const std::string& path_;
};

void read_scalar(Cursor& c, GgufType t, GgufValue& v, const char* what) {
  switch (t) {
    case GgufType::U8:
      v.u = c.read<uint8_t>(what);
      v.i = int64_t(v.u);
      break;
    case GgufType::I8:
      v.i = c.read<int8_t>(what);
      break;
    case GgufType::U16:
      v.u = c.read<uint16_t>(what);
      v.i = int64_t(v.u);
      break;
    case GgufType::I16:
      v.i = c.read<int16_t>(what);
      break;
    case GgufType::U32:
      v.u = c.read<uint32_t>(what);
      v.i = int64_t(v.u);
      break;
    case GgufType::I32:
      v.i = c.read<int32_t>(what);
      break;
    case GgufType::U64:
      v.u = c.read<uint64_t>(what);
      v.i = int64_t(v.u);
      break;
    case GgufType::I64:
      v.i = c.read<int64_t>(what);
      break;
    case GgufType::Bool:
      v.i = c.read<uint8_t>(what);
      break;
    case GgufType::F32:
      v.f = c.read<float>(what);
      break;
    case GgufType::F64:
      v.f = c.read<double>(what);
      break;
    case GgufType::String:
      v.s = c.read_string(what);
      break;
    case GgufType::Array:
      SWIFTLET_CHECK(false, "arrays are read by read_value");
  }
}

GgufValue read_value(Cursor& c, const std::string& path, const std::string& key) {
  GgufValue v;
  const uint32_t t = c.read<uint32_t>("a metadata value's type");
  if (scalar_bytes(t) < 0)
    fail(
        "'{}' is a corrupt GGUF file: metadata key '{}' has value type {}, which GGUF does not "
        "define",
        path, key, t);
  v.type = GgufType(t);
  if (v.type != GgufType::Array) {
    read_scalar(c, v.type, v, "a metadata value");
    return v;
  }
  const uint32_t et = c.read<uint32_t>("an array's element type");
  const int eb = scalar_bytes(et);
  if (eb < 0)
    fail(
        "'{}' is a corrupt GGUF file: metadata array '{}' has element type {}, which GGUF does "
        "not define",
        path, key, et);
  if (GgufType(et) == GgufType::Array)
    fail(
        "'{}': metadata key '{}' is an array of arrays, which swiftlet does not read (llama.cpp "
        "writes none); convert from the safetensors checkpoint instead",
        path, key);
  v.elem = GgufType(et);
  // A string element takes at least its 8-byte length.
  const uint64_t n = c.read_count("array length", eb == 0 ? 8 : size_t(eb));
  if (n > kMaxArray)
    fail(
        "'{}': metadata array '{}' has {} elements; swiftlet reads at most {} (a vocabulary "
        "holds a few hundred thousand)",
        path, key, n, kMaxArray);
  GgufValue e;
  if (v.elem == GgufType::String) {
    v.strings.reserve(n);
    for (uint64_t k = 0; k < n; ++k) v.strings.push_back(c.read_string("an array's string"));
  } else if (v.elem == GgufType::F32 || v.elem == GgufType::F64) {
    v.floats.reserve(n);
    for (uint64_t k = 0; k < n; ++k) {
      read_scalar(c, v.elem, e, "an array element");
      v.floats.push_back(e.f);
    }
  } else {
    v.ints.reserve(n);
    for (uint64_t k = 0; k < n; ++k) {
      read_scalar(c, v.elem, e, "an array element");
      v.ints.push_back(e.i);
    }
  }
  return v;
}

}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t t) {
  for (const auto& [type, info] : kTypes)
    if (uint32_t(type) == t) return info;
  return std::nullopt;
}

std::string ggml_type_name(uint32_t t) {
  if (auto info = ggml_type_info(t)) return std::string(info->name);
  return fmt::format("type {}", t);
}

std::string_view gguf_type_name(GgufType t) {
  static constexpr std::string_view names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                               "bool", "string", "array", "u64", "i64", "f64"};
  return uint32_t(t) < std::size(names) ? names[uint32_t(t)] : "unknown";
}

bool GgufValue::is_integer() const {
  return type != GgufType::F32 && type != GgufType::F64 && type != GgufType::String && type != GgufType::Array;
}

size_t GgufValue::array_size() const { return ints.size() + floats.size() + strings.size(); }

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::vector<int64_t> GgufTensor::shape() const { return {ne.rbegin(), ne.rend()}; }

std::string GgufTensor::shape_str() const { return fmt::format("[{}]", fmt::join(shape(), ", ")); }

GgufFile::GgufFile(const std::string& path, Residency mode) : file_(path, mode) {
  const std::string& p = file_.path();
  Cursor c(file_.data(), file_.size(), p);
  if (file_.size() < 4 || std::memcmp(file_.data(), "GGUF", 4) != 0)
    fail("'{}' is not a GGUF file: it does not start with the bytes 'GGUF'", p);
  c.read<uint32_t>("the magic");
  version_ = c.read<uint32_t>("the version");
  if (version_ == 1)
    fail(
        "'{}' is a GGUF version 1 file, which swiftlet does not read; convert it to the current "
        "version with llama.cpp (or download a newer file)",
        p);
  if (version_ != 2 && version_ != 3)
    fail(
        "'{}' has GGUF version {} (0x{:08x}); swiftlet reads versions 2 and 3 (a big-endian "
        "file shows a byte-swapped version: swiftlet reads little-endian files only)",
        p, version_, version_);
  // Each tensor info takes at least 8 (name) + 4 (dims) + 4 (type) + 8 (offset) bytes; each
  // key-value pair at least 8 (key) + 4 (type) + 1 (value) bytes.
  const uint64_t n_tensors = c.read<uint64_t>("the tensor count");
  const uint64_t n_kv = c.read_count("metadata key count", 13);

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string("a metadata key");
    GgufValue v = read_value(c, p, key);
    if (kv_.count(key)) fail("'{}' is a corrupt GGUF file: metadata key '{}' appears twice", p, key);
    kv_.emplace(std::move(key), std::move(v));
  }
  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufType::U32)
      fail("'{}' is a corrupt GGUF file: general.alignment must be a u32, not {}", p, gguf_type_name(a->type));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      fail("'{}' is a corrupt GGUF file: general.alignment {} is not a power of two", p, a->u);
    alignment_ = a->u;
  }

  if (n_tensors > c.left() / 24)
    fail(
        "'{}' is a corrupt GGUF file: tensor count {} cannot fit in the {} bytes after the "
        "metadata",
        p, n_tensors, c.left());
  tensors_.reserve(n_tensors);
  std::vector<uint64_t> rel(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    t.name = c.read_string("a tensor name");
    auto bad = [&](const std::string& why) { fail("'{}' is a corrupt GGUF file: tensor '{}': {}", p, t.name, why); };
    const uint32_t nd = c.read<uint32_t>("a tensor's dimension count");
    if (nd == 0 || nd > kMaxDims) bad(fmt::format("{} dimensions (ggml allows 1 to {})", nd, kMaxDims));
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const int64_t n = c.read<int64_t>("a tensor's dimensions");
      if (n < 0) bad(fmt::format("dimension {} is negative ({})", d, n));
      if (n != 0 && numel > uint64_t(std::numeric_limits<int64_t>::max()) / uint64_t(n))
        bad("its element count overflows");
      numel *= uint64_t(n);
      t.ne.push_back(n);
    }
    t.type = c.read<uint32_t>("a tensor's type");
    const auto info = ggml_type_info(t.type);
    if (!info) bad(fmt::format("type number {} is not a ggml tensor type swiftlet knows", t.type));
    if (t.ne[0] % info->block != 0)
      bad(fmt::format("its rows of {} elements are not whole {} blocks of {}", t.ne[0], info->name, info->block));
    const uint64_t blocks = numel / uint64_t(info->block);
    if (blocks > std::numeric_limits<uint64_t>::max() / info->block_bytes) bad("its size overflows");
    t.nbytes = size_t(blocks * info->block_bytes);
    rel[k] = c.read<uint64_t>("a tensor's offset");
    if (rel[k] % alignment_ != 0)
      bad(fmt::format("its data offset {} is not a multiple of the file's alignment {}", rel[k], alignment_));
    if (by_name_.count(t.name)) bad("the name appears twice");
    by_name_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data starts at the next multiple of the alignment after the tensor table.
  const uint64_t end_of_table = c.pos();
  data_offset_ = (end_of_table + alignment_ - 1) / alignment_ * alignment_;
  if (data_offset_ < end_of_table) fail("'{}' is a corrupt GGUF file: its alignment overflows", p);
  const uint64_t size = file_.size();
  for (size_t k = 0; k < tensors_.size(); ++k) {
    GgufTensor& t = tensors_[k];
    if (data_offset_ > size || rel[k] > size - data_offset_ || t.nbytes > size - data_offset_ - rel[k])
      fail(
          "'{}' is truncated or corrupt: tensor '{}' ({} {}, {} bytes at data offset {}) ends "
          "past the file's {} bytes (download it again)",
          p, t.name, t.type_name(), t.shape_str(), t.nbytes, rel[k], size);
    t.offset = data_offset_ + rel[k];
    t.data = file_.data() + t.offset;
    t.file = &file_.path();
  }
  std::vector<const GgufTensor*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < order.size(); ++k)
    if (order[k - 1]->offset + order[k - 1]->nbytes > order[k]->offset)
      fail("'{}' is a corrupt GGUF file: tensors '{}' and '{}' overlap", p, order[k - 1]->name, order[k]->name);
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufValue& GgufFile::get(const std::string& key, const char* want) const {
  const GgufValue* v = find(key);
  if (!v) fail("'{}' lacks the metadata key '{}' ({}); it is not a complete llama.cpp model file", path(), key, want);
  return *v;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = get(key, "an integer");
  if (!v.is_integer()) fail("'{}': metadata key '{}' is a {}, not an integer", path(), key, gguf_type_name(v.type));
  if (v.type == GgufType::U64 && v.u > uint64_t(std::numeric_limits<int64_t>::max()))
    fail("'{}': metadata key '{}' = {} is out of range", path(), key, v.u);
  return v.i;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = get(key, "a number");
  if (v.is_float()) return v.f;
  if (v.is_integer()) return double(v.i);
  fail("'{}': metadata key '{}' is a {}, not a number", path(), key, gguf_type_name(v.type));
}

const std::string& GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = get(key, "a string");
  if (v.type != GgufType::String)
    fail("'{}': metadata key '{}' is a {}, not a string", path(), key, gguf_type_name(v.type));
  return v.s;
}

const std::vector<std::string>& GgufFile::get_strings(const std::string& key) const {
  const GgufValue& v = get(key, "an array of strings");
  if (v.type != GgufType::Array || v.elem != GgufType::String)
    fail("'{}': metadata key '{}' is not an array of strings", path(), key);
  return v.strings;
}

const std::vector<int64_t>& GgufFile::get_ints(const std::string& key) const {
  const GgufValue& v = get(key, "an array of integers");
  if (v.type != GgufType::Array || v.elem == GgufType::String || v.elem == GgufType::F32 || v.elem == GgufType::F64)
    fail("'{}': metadata key '{}' is not an array of integers", path(), key);
  return v.ints;
}

namespace {

// "NAME-00002-of-00005.gguf" -> ("NAME", 2, 5); k = 0 when the name is not a split part.
struct SplitName {
  std::string stem;
  int k = 0, n = 0;
};
SplitName split_name(const std::string& path) {
  static const std::regex re(R"((.*)-([0-9]{5})-of-([0-9]{5})\.gguf)");
  std::smatch m;
  if (!std::regex_match(path, m, re)) return {};
  return {m[1].str(), std::stoi(m[2].str()), std::stoi(m[3].str())};
}

std::string part_path(const SplitName& s, int k) { return fmt::format("{}-{:05d}-of-{:05d}.gguf", s.stem, k, s.n); }

}  // namespace

GgufModel GgufModel::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::string file = path;
  if (fs::is_directory(path)) {
    std::vector<std::string> models;  // single files and first parts
    for (const auto& e : fs::directory_iterator(path)) {
      const std::string name = e.path().filename().string();
      if (e.path().extension() != ".gguf" || name.starts_with("mmproj")) continue;
      const SplitName s = split_name(e.path().string());
      if (s.k == 0 || s.k == 1)
        models.push_back(e.path().string());
      else if (!fs::exists(part_path(s, 1)))
        models.push_back(part_path(s, 1));
    }
    std::sort(models.begin(), models.end());
    models.erase(std::unique(models.begin(), models.end()), models.end());
    if (models.empty()) fail("'{}' holds no .gguf file", path);
    if (models.size() > 1)
      fail("'{}' holds more than one GGUF model ({}); name the file to convert", path, fmt::join(models, ", "));
    file = models.front();
  } else if (!fs::exists(path)) {
    fail("'{}' does not exist", path);
  }
  GgufModel m;
  m.source_ = path;
  const SplitName s = split_name(file);
  if (s.k == 0) {
    m.files_.push_back(std::make_unique<GgufFile>(file));
  } else {
    if (s.n < 1 || s.k > s.n) fail("'{}': part {} of {} is not a valid split file name", file, s.k, s.n);
    for (int k = 1; k <= s.n; ++k) {
      const std::string p = part_path(s, k);
      if (!fs::exists(p))
        fail("part {} of {} of the split GGUF model is missing: '{}' (download every part)", k, s.n, p);
      m.files_.push_back(std::make_unique<GgufFile>(p));
    }
    if (const GgufValue* c = m.meta().find("split.count"); c && c->is_integer() && c->i != s.n)
      fail("'{}' says the model has {} parts (split.count) but its name says {}", part_path(s, 1), c->i, s.n);
  }
  for (const auto& f : m.files_)
    for (const GgufTensor& t : f->tensors()) {
      auto [it, inserted] = m.by_name_.emplace(t.name, &t);
      if (!inserted) fail("tensor '{}' appears in both '{}' and '{}'", t.name, *it->second->file, f->path());
    }
  return m;
}

const GgufTensor* GgufModel::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const GgufTensor& GgufModel::get(const std::string& name) const {
  const GgufTensor* t = find(name);
  if (!t)
    fail(
        "the GGUF model '{}' has no tensor '{}'; is it a complete llama.cpp file of a supported "
        "architecture?",
        source_, name);
  return *t;
}

}  // namespace swiftlet
