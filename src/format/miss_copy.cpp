#include "format/miss_copy.h"

#include "core/dtype.h"
#include "core/error.h"
#include "format/quantize.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace swiftlet {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

const QpackSection& section(const std::vector<QpackSection>& secs, const std::string& name) {
  for (const auto& s : secs)
    if (s.name == name) return s;
  fail("miss copy: no section '{}'", name);
}

// Bit-stream access, lowest bit first (the packing of MLX's 2-, 4- and 8-bit words on a
// little-endian machine).
uint32_t get_code(const uint8_t* p, size_t i, int bits) {
  const size_t bit = i * size_t(bits);
  uint32_t v = p[bit / 8];
  if (bit % 8 + size_t(bits) > 8) v |= uint32_t(p[bit / 8 + 1]) << 8;
  return (v >> (bit % 8)) & ((1u << bits) - 1);
}
void put_code(uint8_t* p, size_t i, int bits, uint32_t q) {
  const size_t bit = i * size_t(bits);
  p[bit / 8] = uint8_t(p[bit / 8] | (q << (bit % 8)));
  if (bit % 8 + size_t(bits) > 8) p[bit / 8 + 1] = uint8_t(p[bit / 8 + 1] | (q >> (8 - bit % 8)));
}

// The code of x at scale s (inverse inv) and bias b: round((x - b) / s) clamped to [0, m]. Plain
// float arithmetic and a truncating conversion (no rounding call: baseline x86-64 has no round
// instruction).
inline int code_of(float x, float inv, float b, int m) {
  const float v = std::clamp((x - b) * inv, 0.0f, float(m));
  return int(v + 0.5f);
}

// Squared error of x fitted with codes in [0, m] at scale s, bias b.
float fit_error(const float* x, int n, int m, float s, float b) {
  const float inv = 1.0f / s;
  float e = 0;
  for (int i = 0; i < n; ++i) {
    const float d = s * float(code_of(x[i], inv, b, m)) + b - x[i];
    e += d * d;
  }
  return e;
}

// The scale and bias of least squared error for x with codes in [0, m]: from three starting
// ranges (the group's [min, max], and 10% and 20% narrower), codes by rounding and the scale and
// bias solved for those codes, twice; the best of the four fits.
void fit_group(const float* x, int n, int m, float* scale, float* bias) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  if (!(hi > lo)) {
    *scale = 0;
    *bias = lo;
    return;
  }
  float best_s = (hi - lo) / float(m), best_b = lo;
  float best = fit_error(x, n, m, best_s, best_b);
  float sx = 0;
  for (int i = 0; i < n; ++i) sx += x[i];
  for (float shrink : {0.0f, 0.1f, 0.2f}) {
    float s = (hi - lo) * (1 - shrink) / float(m), b = lo + (hi - lo) * shrink / 2;
    bool solved = false;
    for (int iter = 0; iter < 2; ++iter) {
      const float inv = 1.0f / s;
      float sq = 0, sqq = 0, sqx = 0;
      for (int i = 0; i < n; ++i) {
        const float q = float(code_of(x[i], inv, b, m));
        sq += q, sqq += q * q, sqx += q * x[i];
      }
      const float det = float(n) * sqq - sq * sq;
      if (!(det > 0)) break;
      const float s2 = (float(n) * sqx - sq * sx) / det;
      if (!(s2 > 0)) break;
      s = s2;
      b = (sx - s2 * sq) / float(n);
      solved = true;
    }
    if (!solved) continue;
    const float e = fit_error(x, n, m, s, b);
    if (e < best) best = e, best_s = s, best_b = b;
  }
  *scale = best_s;
  *bias = best_b;
}

}  // namespace

std::string miss_copy_layer_file(int layer) { return fmt::format("{}/layer_{:02d}.bin", kMissCopyDir, layer); }

MissCopyLayout MissCopyLayout::plan(const QpackLayout& full, const ModelConfig& c, int bits) {
  if (bits != 2 && bits != 3) fail("low-bit copies are 2 or 3 bits, not {}", bits);
  MissCopyLayout l;
  l.bits = bits;
  uint64_t end = 0;
  for (const auto& s : full.sections) {
    if (s.offset < end) fail("low-bit copies need the experts' sections in blob order");
    end = s.offset + s.size;
  }
  uint64_t off = 0;
  for (int p = 0; p < 3; ++p) {
    const auto [rows, cols] = expert_projection_shape(p, c);
    const ProjectionFormat f = full.projection_format(p, c);
    const std::string proj = kExpertProjections[p];
    if (!f.affine())
      fail("{} of the experts is stored as {}: low-bit copies need quantised experts (repack with --bits 4 or 8)", proj,
           f.describe());
    if (f.bits <= bits)
      fail("{} of the experts is already {}: a {}-bit copy would save nothing", proj, f.describe(), bits);
    if (f.dtype != DType::BF16)
      fail("{} of the experts has {} scales: low-bit copies need BF16 scales", proj, dtype_name(f.dtype));
    if ((cols * bits) % 32 != 0) fail("{}: {} columns do not fill 32-bit words at {} bits", proj, cols, bits);
    for (const char* part : {".weight", ".scales", ".biases"}) {
      QpackSection s = section(full.sections, proj + part);
      if (s.name.ends_with(".weight")) {
        s.shape = {rows, cols * bits / 32};
        s.size = uint64_t(rows) * uint64_t(cols) * uint64_t(bits) / 8;
      }
      s.offset = off;
      off += s.size;
      l.sections.push_back(std::move(s));
    }
  }
  l.stride = qpack_stride(off);
  l.payload_offset = l.stride - off;
  for (auto& s : l.sections) s.offset += l.payload_offset;
  return l;
}

ojson MissCopyLayout::to_json() const {
  QpackLayout as_layout;  // the sections are written as the experts' layout writes its own
  as_layout.sections = sections;
  return ojson{{"format", "swiftlet-miss-copies"},
               {"version", 1},
               {"bits", bits},
               {"expertStride", stride},
               {"payloadOffset", payload_offset},
               {"sections", as_layout.to_json()["sections"]}};
}

MissCopyLayout MissCopyLayout::parse(const json& j, const std::string& source) {
  auto uint_field = [&](const char* key) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0)
      fail("{}: field '{}' missing or not a non-negative integer", source, key);
    return j[key].get<uint64_t>();
  };
  if (!j.is_object() || j.value("format", "") != "swiftlet-miss-copies")
    fail("{}: not a swiftlet-miss-copies layout", source);
  MissCopyLayout l;
  l.bits = int(uint_field("bits"));
  l.stride = uint_field("expertStride");
  l.payload_offset = uint_field("payloadOffset");
  if (!j.contains("sections") || !j["sections"].is_array()) fail("{}: 'sections' must be a list", source);
  // The sections' own checks are the full layout's: parse them as one.
  json as_layout = {{"expertCount", 0},
                    {"layerCount", 0},
                    {"expertStride", std::max<uint64_t>(1, l.stride)},
                    {"sections", j["sections"]},
                    {"linearLayers", json::array()}};
  l.sections = QpackLayout::parse(as_layout, source).sections;
  return l;
}

std::optional<MissCopies> MissCopies::open(const QpackContainer& qc) {
  if (!qc.manifest.files.contains(kMissCopyLayoutFile)) return std::nullopt;
  const std::string redo = "add them again with swiftlet-repack --add-miss-copy CONTAINER --miss-copy-bits B";
  const std::string lp = qc.path(kMissCopyLayoutFile);
  MissCopies mc;
  mc.layout = MissCopyLayout::parse(read_json_file(lp), lp);
  const MissCopyLayout want = MissCopyLayout::plan(qc.layout, qc.config, mc.layout.bits);
  if (!(mc.layout == want))
    fail("{}: the copies' layout does not follow the container's experts (written for another container?) — {}", lp,
         redo);
  const uint64_t size = uint64_t(qc.layout.expert_count) * mc.layout.stride;
  for (int l = 0; l < qc.layout.layer_count; ++l) {
    const std::string rel = miss_copy_layer_file(l);
    std::error_code ec;
    const uint64_t have = fs::file_size(qc.path(rel), ec);
    if (ec || have != size)
      fail("corrupt container '{}': low-bit copy file '{}' is {} ({} bytes expected) — {}", qc.dir, rel,
           ec ? "missing" : fmt::format("{} bytes", have), size, redo);
  }
  const std::string sp = qc.path(kMissCopyChecksums);
  if (fs::exists(sp)) {
    QpackChecksums cs = QpackChecksums::parse(read_json_file(sp), sp);
    cs.require_experts(qc.layout.layer_count, qc.layout.expert_count, sp, redo);
    mc.sums = std::move(cs.experts);
  }
  return mc;
}

void make_miss_copy(const QpackLayout& full, const MissCopyLayout& copy, const ModelConfig& c, const uint8_t* full_blob,
                    uint8_t* copy_blob) {
  std::memset(copy_blob, 0, size_t(copy.stride));
  const int m = (1 << copy.bits) - 1;
  std::vector<float> row;
  for (int p = 0; p < 3; ++p) {
    const auto [rows, cols] = expert_projection_shape(p, c);
    const ProjectionFormat f = full.projection_format(p, c);
    const std::string proj = kExpertProjections[p];
    const QpackLayout::ProjectionView v = full.projection_view(p, c);
    const QMatrix src = v.at(full_blob);
    uint8_t* codes = copy_blob + section(copy.sections, proj + ".weight").offset;
    auto* scales = reinterpret_cast<uint16_t*>(copy_blob + section(copy.sections, proj + ".scales").offset);
    auto* biases = reinterpret_cast<uint16_t*>(copy_blob + section(copy.sections, proj + ".biases").offset);
    const int64_t groups = cols / f.group_size;
    const size_t row_bytes = size_t(cols) * size_t(copy.bits) / 8;
    row.resize(size_t(cols));
    for (int64_t r = 0; r < rows; ++r) {
      const QMatrix one = src.row_slice(r, 1);
      affine_dequantize(static_cast<const uint32_t*>(one.data), static_cast<const uint16_t*>(one.scales),
                        static_cast<const uint16_t*>(one.biases), 1, cols, f.bits, f.group_size, row.data());
      uint8_t* out = codes + size_t(r) * row_bytes;
      for (int64_t g = 0; g < groups; ++g) {
        const float* x = row.data() + g * f.group_size;
        float s = 0, b = 0;
        fit_group(x, f.group_size, m, &s, &b);
        const uint16_t s16 = f32_to_bf16(s), b16 = f32_to_bf16(b);
        scales[r * groups + g] = s16;
        biases[r * groups + g] = b16;
        const float sr = bf16_to_f32(s16), br = bf16_to_f32(b16);
        for (int i = 0; i < f.group_size; ++i) {
          const int q = sr > 0 ? code_of(x[i], 1.0f / sr, br, m) : 0;
          put_code(out, size_t(g * f.group_size + i), copy.bits, uint32_t(q));
        }
      }
    }
  }
}

void widen_codes_reference(const uint8_t* src, int from, uint8_t* dst, int to, size_t n) {
  std::memset(dst, 0, n * size_t(to) / 8);
  for (size_t i = 0; i < n; ++i) put_code(dst, i, to, get_code(src, i, from));
}

#if !defined(__x86_64__)
bool widen_codes_avx2(const uint8_t*, int, uint8_t*, int, size_t) { return false; }
#endif

void widen_codes(const uint8_t* src, int from, uint8_t* dst, int to, size_t n) {
  if (!widen_codes_avx2(src, from, dst, to, n)) widen_codes_reference(src, from, dst, to, n);
}

void expand_miss_copy(const QpackLayout& full, const MissCopyLayout& copy, const ModelConfig& c, uint8_t* blob) {
  const uint8_t* base = blob + (full.expert_stride - copy.stride);
  std::vector<uint8_t> row;
  // Sections in blob order: each one's output ends no later than its input does (the copy's
  // payload ends where the full stride does, and no section shrinks), so writing a row never
  // reaches input not yet read.
  for (int p = 0; p < 3; ++p) {
    const auto [rows, cols] = expert_projection_shape(p, c);
    const std::string proj = kExpertProjections[p];
    const int to = full.projection_format(p, c).bits;
    for (const char* part : {".weight", ".scales", ".biases"}) {
      const QpackSection& fs_ = section(full.sections, proj + part);
      const QpackSection& cs = section(copy.sections, proj + part);
      if (!fs_.name.ends_with(".weight")) {
        std::memmove(blob + fs_.offset, base + cs.offset, size_t(cs.size));
        continue;
      }
      const size_t in_row = size_t(cols) * size_t(copy.bits) / 8, out_row = size_t(cols) * size_t(to) / 8;
      row.resize(in_row);
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(row.data(), base + cs.offset + size_t(r) * in_row, in_row);
        widen_codes(row.data(), copy.bits, blob + fs_.offset + size_t(r) * out_row, to, size_t(cols));
      }
    }
  }
}

}  // namespace swiftlet
