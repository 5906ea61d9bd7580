#include "format/qpack.h"

#include "core/error.h"
#include "format/miss_copy.h"
#include "io/mapped_file.h"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

namespace swiftlet {

namespace fs = std::filesystem;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

#if defined(__x86_64__)
uint64_t xxh3_64_avx2(const void* data, size_t n);  // xxh3_avx2.cpp (x86-64 only)
#endif

uint64_t xxh3_64(const void* data, size_t n) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return xxh3_64_avx2(data, n);
#endif
  return XXH3_64bits(data, n);  // aarch64: libxxhash's own NEON code
}

std::string hash_hex(uint64_t h) { return fmt::format("{:016x}", h); }

json read_json_file(const std::string& path) {
  json j = json::parse(read_text_file(path), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail("'{}' is not valid JSON (corrupt or truncated?)", path);
  return j;
}

std::pair<int64_t, int64_t> expert_projection_shape(int p, const ModelConfig& c) {
  return p == 2 ? std::pair{c.hidden_size, c.moe_intermediate_size}
                : std::pair{c.moe_intermediate_size, c.hidden_size};
}

std::string ProjectionFormat::describe() const {
  if (!affine()) return std::string(dtype_name(dtype));
  return fmt::format("{}-bit g{} ({} scales)", bits, group_size, dtype_name(dtype));
}

std::string qpack_layer_file(int layer) { return fmt::format("packed_experts/layer_{:02d}.bin", layer); }

namespace {

uint64_t numel(const std::vector<int64_t>& s) {
  uint64_t n = 1;
  for (int64_t d : s) n *= uint64_t(d);
  return n;
}

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

const json& field(const json& j, const char* key, const std::string& source) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null())
    fail("{}: missing field '{}'", source, key);
  return j[key];
}

int64_t int_field(const json& j, const char* key, const std::string& source) {
  const json& v = field(j, key, source);
  if (!v.is_number_integer()) fail("{}: field '{}' must be an integer, got {}", source, key, v.dump());
  return v.get<int64_t>();
}

std::string string_field(const json& j, const char* key, const std::string& source) {
  const json& v = field(j, key, source);
  if (!v.is_string()) fail("{}: field '{}' must be a string, got {}", source, key, v.dump());
  return v.get<std::string>();
}

uint64_t parse_hash(const json& v, const std::string& source, const std::string& what) {
  if (!v.is_string() || v.get<std::string>().size() != 16)
    fail("{}: checksum of {} must be 16 hex digits, got {}", source, what, v.dump());
  const std::string s = v.get<std::string>();
  uint64_t h = 0;
  for (char ch : s) {
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (d < 0) fail("{}: checksum of {} is not hex: '{}'", source, what, s);
    h = h << 4 | uint64_t(d);
  }
  return h;
}


uint64_t file_size_or_fail(const std::string& path, const std::string& what) {
  std::error_code ec;
  const uint64_t n = fs::file_size(path, ec);
  if (ec) fail("{} '{}' is missing or unreadable: {}", what, path, ec.message());
  return n;
}

}  // namespace

// ------------------------------------------------------------------------------------ layout

QpackLayout QpackLayout::plan(const ModelConfig& c, const ProjectionFormat formats[3]) {
  QpackLayout l;
  l.expert_count = c.num_experts;
  l.layer_count = c.num_layers;
  l.linear_layers = c.linear_layers;
  uint64_t off = 0;
  auto add = [&](std::string name, DType dt, std::vector<int64_t> shape) {
    const uint64_t size = numel(shape) * dtype_size(dt);
    l.sections.push_back({std::move(name), dt, std::move(shape), off, size});
    off += size;
  };
  for (int p = 0; p < 3; ++p) {
    const auto [rows, cols] = expert_projection_shape(p, c);
    const ProjectionFormat& f = formats[p];
    const std::string proj = kExpertProjections[p];
    if (!f.affine()) {
      add(proj + ".weight", f.dtype, {rows, cols});
      continue;
    }
    SWIFTLET_CHECK(cols % f.group_size == 0 && (cols * f.bits) % 32 == 0, "bad expert quantisation");
    add(proj + ".weight", DType::U32, {rows, cols * f.bits / 32});
    add(proj + ".scales", f.dtype, {rows, cols / f.group_size});
    add(proj + ".biases", f.dtype, {rows, cols / f.group_size});
  }
  l.expert_stride = qpack_stride(off);
  return l;
}

uint64_t QpackLayout::payload() const {
  uint64_t end = 0;
  for (const auto& s : sections) end = std::max(end, s.offset + s.size);
  return end;
}

const QpackSection* QpackLayout::find(std::string_view name) const {
  for (const auto& s : sections)
    if (s.name == name) return &s;
  return nullptr;
}

ProjectionFormat QpackLayout::projection_format(int p, const ModelConfig& c) const {
  const auto [rows, cols] = expert_projection_shape(p, c);
  const std::string proj = kExpertProjections[p];
  const QpackSection* w = find(proj + ".weight");
  SWIFTLET_CHECK(w != nullptr, "layout not validated");
  ProjectionFormat f;
  if (is_float(w->dtype)) {
    f.bits = 16;
    f.dtype = w->dtype;
    return f;
  }
  const QpackSection* s = find(proj + ".scales");
  SWIFTLET_CHECK(s != nullptr && w->shape.size() == 2 && s->shape.size() == 2, "layout not validated");
  f.bits = int(w->shape[1] * 32 / cols);
  f.group_size = int(cols / s->shape[1]);
  f.dtype = s->dtype;
  return f;
}

QpackLayout::ProjectionView QpackLayout::projection_view(int p, const ModelConfig& c) const {
  const auto [rows, cols] = expert_projection_shape(p, c);
  const ProjectionFormat f = projection_format(p, c);
  const std::string proj = kExpertProjections[p];
  ProjectionView v;
  v.m.rows = rows;
  v.m.cols = cols;
  v.data = find(proj + ".weight")->offset;
  if (!f.affine()) {
    v.m.format = f.dtype == DType::F32    ? WeightFormat::F32
                 : f.dtype == DType::BF16 ? WeightFormat::BF16
                                          : WeightFormat::F16;
    return v;
  }
  v.m.format = WeightFormat::Affine;
  v.m.bits = f.bits;
  v.m.group_size = f.group_size;
  v.m.scale_dtype = f.dtype;
  v.scales = find(proj + ".scales")->offset;
  v.biases = find(proj + ".biases")->offset;
  return v;
}

QMatrix QpackLayout::ProjectionView::at(const uint8_t* blob) const {
  QMatrix q = m;
  q.data = blob + data;
  if (q.format == WeightFormat::Affine) {
    q.scales = blob + scales;
    q.biases = blob + biases;
  }
  return q;
}

ojson QpackLayout::to_json() const {
  ojson secs = ojson::array();
  for (const auto& s : sections)
    secs.push_back(ojson{{"name", s.name},
                        {"dtype", std::string(dtype_name(s.dtype))},
                        {"shape", s.shape},
                        {"offset", s.offset},
                        {"size", s.size}});
  ojson lin = ojson::array();
  for (bool b : linear_layers) lin.push_back(b);
  return ojson{{"expertCount", expert_count}, {"layerCount", layer_count},
              {"expertStride", expert_stride}, {"sections", secs}, {"linearLayers", lin}};
}

QpackLayout QpackLayout::parse(const json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: not a JSON object", source);
  QpackLayout l;
  l.expert_count = int(int_field(j, "expertCount", source));
  l.layer_count = int(int_field(j, "layerCount", source));
  const int64_t stride = int_field(j, "expertStride", source);
  if (stride <= 0) fail("{}: expertStride must be positive, got {}", source, stride);
  l.expert_stride = uint64_t(stride);
  const json& secs = field(j, "sections", source);
  if (!secs.is_array()) fail("{}: 'sections' must be a list", source);
  for (const auto& s : secs) {
    QpackSection q;
    q.name = string_field(s, "name", source);
    const std::string where = source + " section '" + q.name + "'";
    q.dtype = parse_dtype(string_field(s, "dtype", where));
    const json& shape = field(s, "shape", where);
    if (!shape.is_array()) fail("{}: 'shape' must be a list", where);
    for (const auto& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail("{}: bad shape {}", where, shape.dump());
      q.shape.push_back(d.get<int64_t>());
    }
    const int64_t off = int_field(s, "offset", where), size = int_field(s, "size", where);
    if (off < 0 || size < 0) fail("{}: negative offset or size", where);
    q.offset = uint64_t(off);
    q.size = uint64_t(size);
    l.sections.push_back(std::move(q));
  }
  const json& lin = field(j, "linearLayers", source);
  if (!lin.is_array()) fail("{}: 'linearLayers' must be a list of booleans", source);
  for (const auto& b : lin) {
    if (!b.is_boolean()) fail("{}: 'linearLayers' must be a list of booleans", source);
    l.linear_layers.push_back(b.get<bool>());
  }
  return l;
}

void QpackLayout::validate(const ModelConfig& c, const std::string& source) const {
  const std::string hint = "(a layout for another model, or a config.json edited after repacking?)";
  if (expert_count != c.num_experts)
    fail("{}: expertCount {} disagrees with num_experts {} in config.json {}", source, expert_count,
         c.num_experts, hint);
  if (layer_count != c.num_layers)
    fail("{}: layerCount {} disagrees with num_hidden_layers {} in config.json {}", source,
         layer_count, c.num_layers, hint);
  if (linear_layers != c.linear_layers) {
    if (linear_layers.size() != c.linear_layers.size())
      fail("{}: linearLayers has {} entries for {} layers", source, linear_layers.size(), c.num_layers);
    for (size_t i = 0; i < linear_layers.size(); ++i)
      if (linear_layers[i] != c.linear_layers[i])
        fail("{}: linearLayers says layer {} is {} but config.json says {} {}", source, i,
             linear_layers[i] ? "linear attention" : "full attention",
             c.linear_layers[i] ? "linear attention" : "full attention", hint);
  }
  // Expected section sequence, derived from each projection's weight section.
  std::vector<std::string> want;
  for (int p = 0; p < 3; ++p) {
    const auto [rows, cols] = expert_projection_shape(p, c);
    const std::string proj = kExpertProjections[p];
    const QpackSection* w = find(proj + ".weight");
    if (!w) fail("{}: no section '{}.weight'", source, proj);
    want.push_back(w->name);
    auto expect = [&](const QpackSection& s, std::vector<int64_t> shape) {
      if (s.shape != shape)
        fail("{}: section '{}' has shape {} but config.json implies {} {}", source, s.name,
             shape_str(s.shape), shape_str(shape), hint);
    };
    if (is_float(w->dtype)) {
      expect(*w, {rows, cols});
      continue;
    }
    if (w->dtype != DType::U32)
      fail("{}: section '{}' has dtype {}; expected U32 (quantised) or a float type", source,
           w->name, dtype_name(w->dtype));
    const QpackSection* s = find(proj + ".scales");
    const QpackSection* b = find(proj + ".biases");
    if (!s || !b) fail("{}: quantised '{}' needs '{}.scales' and '{}.biases' sections", source, w->name, proj, proj);
    want.push_back(s->name);
    want.push_back(b->name);
    if (w->shape.size() != 2 || s->shape.size() != 2 || s->shape[1] <= 0 || cols % s->shape[1] != 0 ||
        (w->shape[1] * 32) % cols != 0)
      fail("{}: sections of '{}' have shapes {} / {} that fit no quantisation of a [{}, {}] matrix",
           source, proj, shape_str(w->shape), shape_str(s->shape), rows, cols);
    const int bits = int(w->shape[1] * 32 / cols);
    const int64_t group = cols / s->shape[1];
    if (bits != 4 && bits != 8) fail("{}: '{}' is quantised at {} bits; only 4 and 8 are supported", source, proj, bits);
    if (group % (32 / bits) != 0) fail("{}: '{}' group size {} does not fit {}-bit words", source, proj, group, bits);
    expect(*w, {rows, cols * bits / 32});
    expect(*s, {rows, cols / group});
    expect(*b, {rows, cols / group});
    if (!is_float(s->dtype) || s->dtype != b->dtype)
      fail("{}: scales ({}) and biases ({}) of '{}' must share one float dtype", source,
           dtype_name(s->dtype), dtype_name(b->dtype), proj);
  }
  std::vector<std::string> have;
  for (const auto& s : sections) have.push_back(s.name);
  if (have != want)
    fail("{}: sections are [{}]; expected [{}] (per projection weight, scales, biases; "
         "projections gate, up, down)", source, fmt::join(have, ", "), fmt::join(want, ", "));
  uint64_t end = 0;
  for (const auto& s : sections) {
    if (s.size != numel(s.shape) * dtype_size(s.dtype))
      fail("{}: section '{}' is {} bytes but {} x {} needs {}", source, s.name, s.size,
           shape_str(s.shape), dtype_name(s.dtype), numel(s.shape) * dtype_size(s.dtype));
    if (s.offset < end)
      fail("{}: section '{}' at offset {} overlaps the section before it (ends at {})", source,
           s.name, s.offset, end);
    if (s.offset % dtype_size(s.dtype) != 0)
      fail("{}: section '{}' starts at byte {}, not a multiple of its {}-byte {} elements (a corrupt "
           "or hand-edited layout.json; repack the container)", source, s.name, s.offset,
           dtype_size(s.dtype), dtype_name(s.dtype));
    end = s.offset + s.size;
  }
  if (end > expert_stride)
    fail("{}: the sections end at byte {} but expertStride is only {}", source, end, expert_stride);
  if (expert_stride % kQpackStrideAlign != 0)
    fail("{}: expertStride {} is not a multiple of {} bytes", source, expert_stride, kQpackStrideAlign);
}

// ---------------------------------------------------------------------------------- manifest

ojson QpackManifest::to_json() const {
  ojson f = ojson::object();
  for (const auto& [k, v] : files) f[k] = v;
  return ojson{{"magic", magic},           {"version", version},
              {"modelName", model_name},  {"sourceCheckpoint", source_checkpoint},
              {"quantBits", quant_bits},  {"quantGroupSize", quant_group_size},
              {"files", f}};
}

QpackManifest QpackManifest::parse(const json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: not a JSON object; not a .qpack manifest", source);
  QpackManifest m;
  if (!j.contains("magic") || !j["magic"].is_string())
    fail("{}: no 'magic' field; not a .qpack manifest", source);
  m.magic = j["magic"].get<std::string>();
  if (m.magic != kQpackMagic)
    fail("{}: magic is '{}', expected '{}'; not a .qpack container", source, m.magic, kQpackMagic);
  m.version = int(int_field(j, "version", source));
  if (m.version != kQpackVersion)
    fail("{}: container version {} is not supported; this swiftlet reads version {}{}", source,
         m.version, kQpackVersion,
         m.version > kQpackVersion ? " (update swiftlet)" : " (re-run swiftlet-repack)");
  // Optional fields: absent (or null) takes the default, present must have the right type.
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  m.model_name = present("modelName") ? string_field(j, "modelName", source) : "";
  m.source_checkpoint = present("sourceCheckpoint") ? string_field(j, "sourceCheckpoint", source) : "";
  m.quant_bits = present("quantBits") ? int(int_field(j, "quantBits", source)) : 0;
  m.quant_group_size = present("quantGroupSize") ? int(int_field(j, "quantGroupSize", source)) : 0;
  if (j.contains("files")) {
    if (!j["files"].is_object()) fail("{}: 'files' must map paths to byte sizes", source);
    for (auto& [k, v] : j["files"].items()) {
      if (k.empty() || k.front() == '/' || k.find("..") != std::string::npos)
        fail("{}: file name '{}' must be a relative path inside the container", source, k);
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        fail("{}: size of '{}' must be a non-negative integer", source, k);
      m.files[k] = v.get<uint64_t>();
    }
  }
  return m;
}

// --------------------------------------------------------------------------------- checksums

ojson QpackChecksums::to_json() const {
  ojson f = ojson::object();
  for (const auto& [k, v] : files) f[k] = hash_hex(v);
  ojson layers = ojson::array();
  for (const auto& l : experts) {
    ojson row = ojson::array();
    for (uint64_t h : l) row.push_back(hash_hex(h));
    layers.push_back(std::move(row));
  }
  return ojson{{"format", "swiftlet-qpack-checksums"}, {"version", 1}, {"algorithm", algorithm},
              {"expertsCover", "payload"}, {"files", f}, {"experts", layers}};
}

QpackChecksums QpackChecksums::parse(const json& j, const std::string& source) {
  QpackChecksums c;
  c.algorithm = string_field(j, "algorithm", source);
  if (c.algorithm != "xxh3-64") fail("{}: checksum algorithm '{}' is not supported (xxh3-64)", source, c.algorithm);
  if (j.contains("files")) {
    if (!j["files"].is_object()) fail("{}: 'files' must be an object", source);
    for (auto& [k, v] : j["files"].items()) c.files[k] = parse_hash(v, source, "'" + k + "'");
  }
  const json& layers = field(j, "experts", source);
  if (!layers.is_array()) fail("{}: 'experts' must be a list of lists", source);
  for (size_t l = 0; l < layers.size(); ++l) {
    if (!layers[l].is_array()) fail("{}: 'experts' must be a list of lists", source);
    std::vector<uint64_t> row;
    for (size_t e = 0; e < layers[l].size(); ++e)
      row.push_back(parse_hash(layers[l][e], source, fmt::format("layer {} expert {}", l, e)));
    c.experts.push_back(std::move(row));
  }
  return c;
}

void QpackChecksums::require_experts(int layers, int count, const std::string& source,
                                     const std::string& redo) const {
  if (int(experts.size()) != layers)
    fail("{}: {} layers of expert checksums for {} layers — {}", source, experts.size(), layers, redo);
  for (size_t l = 0; l < experts.size(); ++l)
    if (int(experts[l].size()) != count)
      fail("{}: layer {} has {} expert checksums for {} experts — {}", source, l, experts[l].size(), count, redo);
}

// -------------------------------------------------------------------------------- container

bool looks_like_qpack(const std::string& path) {
  const fs::path p(path);
  if (fs::is_directory(p) &&
      (fs::exists(p / "manifest.json") || fs::is_directory(p / "packed_experts")))
    return true;
  std::string name = p.filename().string();
  if (name.empty()) name = p.parent_path().filename().string();  // "x.qpack/"
  return name.size() > 6 && name.ends_with(".qpack");
}

std::string QpackContainer::path(const std::string& rel) const { return (fs::path(dir) / rel).string(); }

QpackContainer QpackContainer::open(const std::string& path) {
  const std::string redo = "re-run swiftlet-repack (or download the container again)";
  if (!fs::exists(path)) fail("'{}' does not exist", path);
  if (!fs::is_directory(path))
    fail("'{}' is not a directory; a .qpack container is a directory holding manifest.json, "
         "config.json, model.safetensors and packed_experts/", path);
  QpackContainer qc;
  qc.dir = path;
  const std::string manifest_path = qc.path("manifest.json");
  if (!fs::exists(manifest_path))
    fail("'{}' has no manifest.json: it is not a complete .qpack container (the manifest is "
         "written last, so an interrupted or failed repack leaves none) — {}", path, redo);
  qc.manifest = QpackManifest::parse(read_json_file(manifest_path), manifest_path);

  const std::string config_path = qc.path("config.json");
  if (!fs::exists(config_path)) fail("container '{}' has no config.json — {}", path, redo);
  qc.config = ModelConfig::load(config_path);

  const std::string layout_path = qc.path("packed_experts/layout.json");
  if (!fs::exists(layout_path)) fail("container '{}' has no packed_experts/layout.json — {}", path, redo);
  qc.layout = QpackLayout::parse(read_json_file(layout_path), layout_path);
  qc.layout.validate(qc.config, layout_path + " vs " + config_path);

  const uint64_t want = uint64_t(qc.layout.expert_count) * qc.layout.expert_stride;
  for (int l = 0; l < qc.layout.layer_count; ++l) {
    const std::string f = qc.layer_path(l);
    const uint64_t have = file_size_or_fail(f, fmt::format("layer {:02d} expert file", l));
    if (have != want)
      fail("corrupt container '{}': layer {:02d} file '{}' is {} bytes but {} experts x {} bytes "
           "= {} are expected ({}) — {}", path, l, f, have, qc.layout.expert_count,
           qc.layout.expert_stride, want, have < want ? "truncated" : "too long", redo);
  }
  for (const auto& [rel, size] : qc.manifest.files) {
    const uint64_t have = file_size_or_fail(qc.path(rel), "file listed in manifest.json,");
    if (have != size)
      fail("corrupt container '{}': '{}' is {} bytes but manifest.json says {} (truncated or "
           "modified) — {}", path, rel, have, size, redo);
  }
  if (!fs::exists(qc.path("model.safetensors")))
    fail("container '{}' has no model.safetensors — {}", path, redo);

  const std::string sums_path = qc.path(kQpackChecksumsFile);
  if (fs::exists(sums_path)) {
    QpackChecksums cs = QpackChecksums::parse(read_json_file(sums_path), sums_path);
    cs.require_experts(qc.layout.layer_count, qc.layout.expert_count, sums_path, redo);
    qc.checksums = std::move(cs);
  }
  return qc;
}

// ------------------------------------------------------------------------------------ verify

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly n bytes at offset (fewer only at end of file). Returns bytes read.
size_t read_at(int fd, uint8_t* dst, size_t n, uint64_t off, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, dst + done, n - done, off_t(off + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && (::fcntl(fd, F_GETFL) & O_DIRECT)) {  // O_DIRECT refused: go buffered
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT);
        continue;
      }
      fail("cannot read '{}': {}", path, std::strerror(errno));
    }
    if (r == 0) break;
    done += size_t(r);
  }
  return done;
}

}  // namespace

QpackVerifyReport verify_qpack(const QpackContainer& qc,
                               const std::function<void(uint64_t, uint64_t)>& progress) {
  QpackVerifyReport rep;
  if (!qc.checksums) return rep;
  rep.has_checksums = true;
  const QpackChecksums& cs = *qc.checksums;
  uint64_t total = 0;
  for (const auto& [rel, h] : cs.files) {
    std::error_code ec;
    total += fs::file_size(qc.path(rel), ec);
  }
  total += uint64_t(qc.layout.layer_count) * qc.layout.expert_count * qc.layout.payload();

  const size_t chunk = 8u << 20;
  std::unique_ptr<uint8_t[]> buf(new uint8_t[chunk]);
  for (const auto& [rel, want] : cs.files) {
    const std::string p = qc.path(rel);
    Fd f{::open(p.c_str(), O_RDONLY | O_CLOEXEC)};
    if (f.fd < 0) {
      rep.problems.push_back(fmt::format("'{}': cannot open: {}", rel, std::strerror(errno)));
      continue;
    }
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    uint64_t off = 0;
    for (;;) {
      const size_t n = read_at(f.fd, buf.get(), chunk, off, p);
      if (n == 0) break;
      XXH3_64bits_update(st, buf.get(), n);
      off += n;
      rep.bytes_hashed += n;
      if (progress) progress(rep.bytes_hashed, total);
    }
    const uint64_t got = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    rep.files_checked++;
    if (got != want)
      rep.problems.push_back(fmt::format("'{}': checksum mismatch (stored {}, computed {})", rel,
                                         hash_hex(want), hash_hex(got)));
  }

  // Layer files: O_DIRECT reads (no page cache churn over tens of GB) of whole experts, the
  // next chunk read while the current one is hashed. The low-bit copies (miss_copy.h) the same
  // way, each hash over its payload at the end of its stride.
  std::optional<MissCopies> copies;
  try {
    copies = MissCopies::open(qc);
  } catch (const Error& e) {
    rep.problems.push_back(e.what());
  }
  if (copies && !copies->sums.empty())
    total += uint64_t(qc.layout.layer_count) * qc.layout.expert_count * copies->layout.payload();
  else if (copies)
    rep.problems.push_back(fmt::format("'{}' is missing: the low-bit copies cannot be checked", kMissCopyChecksums));
  struct Blobs {
    const char* what;  // "" or " low-bit copy"
    uint64_t stride, offset, payload;
    const std::vector<std::vector<uint64_t>>* sums;
    std::string (*file)(int);
  };
  std::vector<Blobs> kinds = {{"", qc.layout.expert_stride, 0, qc.layout.payload(), &cs.experts, qpack_layer_file}};
  if (copies && !copies->sums.empty())
    kinds.push_back({" low-bit copy", copies->layout.stride, copies->layout.payload_offset, copies->layout.payload(),
                     &copies->sums, miss_copy_layer_file});
  for (const Blobs& k : kinds) {
    const uint64_t stride = k.stride, payload = k.payload;
    const int per_read = int(std::max<uint64_t>(1, (16u << 20) / stride));
    const size_t chunk_bytes = size_t(stride) * size_t(per_read);
    struct Aligned {
      uint8_t* p;
      ~Aligned() { std::free(p); }
    } bufs[2] = {{static_cast<uint8_t*>(std::aligned_alloc(4096, chunk_bytes))},
                 {static_cast<uint8_t*>(std::aligned_alloc(4096, chunk_bytes))}};
    if (!bufs[0].p || !bufs[1].p) fail("cannot allocate {} bytes of read buffers", 2 * chunk_bytes);
    for (int l = 0; l < qc.layout.layer_count; ++l) {
      const std::string p = qc.path(k.file(l));
      Fd f{::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT)};
      if (f.fd < 0) f.fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      if (f.fd < 0) {
        rep.problems.push_back(fmt::format("layer {:02d}{}: cannot open '{}': {}", l, k.what, p, std::strerror(errno)));
        continue;
      }
      auto read_chunk = [&, fd = f.fd](int e0, uint8_t* dst) {
        const int n = std::min(per_read, qc.layout.expert_count - e0);
        return read_at(fd, dst, size_t(stride) * size_t(n), uint64_t(e0) * stride, p);
      };
      std::future<size_t> next = std::async(std::launch::async, read_chunk, 0, bufs[0].p);
      for (int e0 = 0, which = 0; e0 < qc.layout.expert_count; e0 += per_read, which ^= 1) {
        const size_t got = next.get();
        if (e0 + per_read < qc.layout.expert_count)
          next = std::async(std::launch::async, read_chunk, e0 + per_read, bufs[which ^ 1].p);
        const uint8_t* blob = bufs[which].p;
        const int n = std::min(per_read, qc.layout.expert_count - e0);
        for (int i = 0; i < n; ++i) {
          const int e = e0 + i;
          rep.experts_checked++;
          if (got < size_t(i) * stride + k.offset + payload) {
            rep.problems.push_back(fmt::format("layer {:02d} expert {}{}: short read (file truncated)", l, e, k.what));
            continue;
          }
          const uint64_t h = xxh3_64(blob + size_t(i) * stride + k.offset, payload);
          const uint64_t want = (*k.sums)[size_t(l)][size_t(e)];
          if (h != want)
            rep.problems.push_back(fmt::format("layer {:02d} expert {}{}: checksum mismatch (stored {}, computed {})",
                                               l, e, k.what, hash_hex(want), hash_hex(h)));
        }
        rep.bytes_hashed += uint64_t(n) * payload;
        if (progress) progress(rep.bytes_hashed, total);
      }
    }
  }
  return rep;
}

}  // namespace swiftlet
