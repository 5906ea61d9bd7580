// The checkpoint-directory source of swiftlet-repack: a Hugging Face checkpoint (bf16, any of the
// three expert layouts, single file or sharded) is quantised to MLX affine; an MLX-quantised one
// is copied byte for byte, every tensor as stored (quantised or float, at whatever bits and group
// size each module has). Tensors are renamed to MLX names and conventions (docs/qpack.md 4), and
// Qwen3-Next's fused DeltaNet inputs get their rows in the split order (docs/qpack.md 2).
#include "convert/repack.h"

#include "core/error.h"
#include "experts/tensor_experts.h"
#include "format/quantize.h"
#include "format/safetensors.h"
#include "io/mapped_file.h"
#include "kernels/cpu/ops_ref.h"
#include "model/weights.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>

namespace swiftlet {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

void drop_matrix_pages(const QMatrix& m) {
  release_source_pages(m.data, size_t(m.rows) * m.row_bytes());
  if (m.format == WeightFormat::Affine) {
    release_source_pages(m.scales, size_t(m.rows) * m.scale_row_bytes());
    release_source_pages(m.biases, size_t(m.rows) * m.scale_row_bytes());
  }
}

bool is_eight_bit_module(const std::string& path) {
  // mlx-lm's quant_predicate for qwen3_next / qwen3_5, used when quantising a float checkpoint:
  // the router and the shared expert gate get 8 bits.
  return path.ends_with("mlp.gate") || path.ends_with("shared_expert_gate");
}

DType float_dtype(WeightFormat f) {
  return f == WeightFormat::F32 ? DType::F32 : f == WeightFormat::F16 ? DType::F16 : DType::BF16;
}

ProjectionFormat format_of(const QMatrix& m) {
  ProjectionFormat f;
  if (m.format == WeightFormat::Affine) {
    f.bits = m.bits;
    f.group_size = m.group_size;
    f.dtype = m.scale_dtype;
  } else {
    f.bits = 16;
    f.dtype = float_dtype(m.format);
  }
  return f;
}

const QMatrix& projection(const ExpertWeights& w, int p) { return p == 0 ? w.gate : p == 1 ? w.up : w.down; }

// Quantises a float matrix (any stored float format) into MLX affine tensors.
std::vector<TensorBytes> quantize_matrix(const QMatrix& m, int bits, int group) {
  std::vector<TensorBytes> out(3);
  out[0].owned.resize(affine_packed_bytes(m.rows, m.cols, bits));
  out[1].owned.resize(affine_scale_bytes(m.rows, m.cols, group));
  out[2].owned.resize(out[1].owned.size());
  const int64_t chunk = std::max<int64_t>(1, (1 << 20) / m.cols);
  std::vector<float> tmp(size_t(std::min(chunk, m.rows) * m.cols));
  for (int64_t r0 = 0; r0 < m.rows; r0 += chunk) {
    const int64_t n = std::min(chunk, m.rows - r0);
    for (int64_t r = 0; r < n; ++r) ref::dequant_row(m, r0 + r, tmp.data() + r * m.cols);
    affine_quantize(tmp.data(), n, m.cols, bits, group,
                    reinterpret_cast<uint32_t*>(out[0].owned.data()) + r0 * m.cols * bits / 32,
                    reinterpret_cast<uint16_t*>(out[1].owned.data()) + r0 * (m.cols / group),
                    reinterpret_cast<uint16_t*>(out[2].owned.data()) + r0 * (m.cols / group));
  }
  return out;
}

TensorBytes view_bytes(const void* p, size_t n) {
  TensorBytes b;
  b.ptr = static_cast<const uint8_t*>(p);
  b.size = n;
  return b;
}

// Makes `it` write only the rows `rows` of what it produced, in that order: a part of Qwen3-Next's
// fused DeltaNet inputs in the split order (DeltaNetLayout), from a source of `src_rows` rows.
// Every tensor of a Linear (weight, scales, biases) has one row per output, and quantisation works
// within a row, so quantised rows move whole and the result equals quantising the selected rows.
void select_rows(ResidentItem& it, std::vector<int64_t> rows, int64_t src_rows) {
  it.produce = [inner = std::move(it.produce), rows = std::move(rows), src_rows] {
    std::vector<TensorBytes> out = inner();
    for (TensorBytes& t : out) {
      const size_t row = t.nbytes() / size_t(src_rows);
      SWIFTLET_CHECK(row * size_t(src_rows) == t.nbytes(), "a fused input's rows do not divide its bytes");
      TensorBytes p;
      p.owned.resize(rows.size() * row);
      for (size_t i = 0; i < rows.size(); ++i)
        std::memcpy(p.owned.data() + i * row, t.data() + size_t(rows[i]) * row, row);
      t = std::move(p);
    }
    return out;
  };
}

const char* kCopiedFiles[] = {"tokenizer.json",         "tokenizer.json.zst",    "tokenizer_config.json", "chat_template.jinja",
                              "chat_template.json",     "generation_config.json", "special_tokens_map.json",
                              "vocab.json",             "merges.txt",             "added_tokens.json"};

class CheckpointSource : public RepackSource {
 public:
  CheckpointSource(const std::string& dir, std::unique_ptr<TensorSet> ts, const RepackOptions& o)
      : dir_(fs::absolute(dir).lexically_normal().string()) {
    if (looks_like_qpack(dir))
      fail("'{}' is already a .qpack container (swiftlet runs it as is; `swiftlet verify` checks it)", dir);
    const std::string cfg_path = (fs::path(dir) / "config.json").string();
    if (!fs::exists(cfg_path)) fail("'{}' has no config.json; is it a model directory?", dir);
    raw_config_ = json::parse(read_text_file(cfg_path), nullptr, false);
    if (raw_config_.is_discarded()) fail("'{}' is not valid JSON", cfg_path);
    config_ = ModelConfig::load(cfg_path);
    ts_ = ts ? std::move(ts) : std::make_unique<TensorSet>(TensorSet::open_dir(dir));
    src_names_ = NameScheme::detect(*ts_, config_);
    dst_names_ = NameScheme::mlx(config_);
    shifted_ = norms_hold_one_plus_w(*ts_, config_, src_names_);
    experts_ = std::make_unique<TensorExperts>(*ts_, config_, src_names_);
    group_ = o.group_size;

    pass_through_ = config_.quant.quantized();
    if (pass_through_) {
      if (o.bits != 0 && o.bits != config_.quant.default_spec.bits)
        fail("'{}' is already MLX-quantised ({} bits); its tensors are copied untouched, so "
             "--bits {} cannot apply (omit --bits)", dir, config_.quant.default_spec.bits, o.bits);
      bits_ = config_.quant.default_spec.bits;
      group_ = config_.quant.default_spec.group_size;
    } else {
      bits_ = o.bits == 0 ? 4 : o.bits;
    }
    if (bits_ != 4 && bits_ != 8 && bits_ != 16) fail("--bits must be 4, 8 or 16, got {}", bits_);

    // One format for every expert of every layer (a layout describes one blob).
    const ExpertWeights& first = experts_->get(0, 0);
    for (int p = 0; p < 3; ++p) {
      const QMatrix& m = projection(first, p);
      ProjectionFormat f = format_of(m);
      if (!pass_through_ && !f.affine() && bits_ != 16 && m.cols % group_ == 0)
        f = ProjectionFormat{bits_, group_, DType::BF16};
      formats_[size_t(p)] = f;
      src_formats_[size_t(p)] = format_of(m);
    }
    for (int l = 0; l < config_.num_layers; ++l)
      for (int e = 0; e < config_.num_experts; ++e)
        for (int p = 0; p < 3; ++p)
          if (format_of(projection(experts_->get(l, e), p)) != src_formats_[size_t(p)])
            fail("'{}': layer {} expert {} {} is stored as {} but layer 0 expert 0 as {}; a .qpack "
                 "holds all experts in one format", dir, l, e, kExpertProjections[p],
                 format_of(projection(experts_->get(l, e), p)).describe(),
                 src_formats_[size_t(p)].describe());
  }

  std::string describe() const override { return dir_; }
  const ModelConfig& config() const override { return config_; }
  int quant_bits() const override { return bits_; }
  int quant_group_size() const override { return group_; }
  std::array<ProjectionFormat, 3> expert_formats() const override { return formats_; }

  std::string config_json() const override { return quantized_config_json(raw_config_, bits_, group_, overrides_); }

  std::vector<std::pair<std::string, std::string>> files() const override {
    std::vector<std::pair<std::string, std::string>> out;
    for (const char* f : kCopiedFiles) {
      const fs::path p = fs::path(dir_) / f;
      if (fs::is_regular_file(p)) out.emplace_back(f, p.string());
    }
    return out;
  }

  // The container's tensors in the checkpoint's order. Qwen3-Next's fused inputs (one source
  // tensor) become two container tensors each: in_proj_qkvz -> in_proj_qkv, in_proj_z and
  // in_proj_ba -> in_proj_b, in_proj_a, rows in the split order.
  std::vector<ResidentItem> resident() override {
    std::vector<DenseTensorSpec> src, dst;
    std::vector<ResidentItem> items;
    ModelWeights scratch;
    const DeltaNetLayout stored = stored_deltanet_layout(*ts_, config_, src_names_);
    auto add_src = [&](const DenseTensorSpec& s, auto&&, auto&&) { src.push_back(s); };
    auto add_dst = [&](const DenseTensorSpec& s, auto&&, auto&&) { dst.push_back(s); };
    for_each_dense_tensor(config_, src_names_, scratch, add_src, stored);
    for_each_dense_tensor(config_, dst_names_, scratch, add_dst, DeltaNetLayout::Split);
    overrides_.clear();
    size_t d = 0;
    for (const DenseTensorSpec& s : src) {
      if (s.fused == FusedInput::None) {
        SWIFTLET_CHECK(d < dst.size() && dst[d].rows == s.rows, "tensor tables differ");
        items.push_back(resident_item(s, dst[d++]));
        continue;
      }
      const std::vector<int64_t> order = split_row_order(config_, s.fused);
      size_t first = 0;
      for (int part = 0; part < 2; ++part, ++d) {  // qkv then z, or b then a
        SWIFTLET_CHECK(d < dst.size(), "tensor tables differ");
        const size_t n = size_t(dst[d].rows);
        SWIFTLET_CHECK(first + n <= order.size(), "a fused input's parts exceed its rows");
        items.push_back(resident_item(s, dst[d]));
        select_rows(items.back(), {order.begin() + ptrdiff_t(first), order.begin() + ptrdiff_t(first + n)}, s.rows);
        first += n;
      }
      SWIFTLET_CHECK(first == order.size(), "a fused input's parts do not cover its rows");
    }
    SWIFTLET_CHECK(d == dst.size(), "tensor tables differ");
    return items;
  }

  void expert(int layer, int e, const QpackLayout& layout, uint8_t* blob) const override {
    const ExpertWeights& w = experts_->get(layer, e);
    for (int p = 0; p < 3; ++p) {
      const QMatrix& m = projection(w, p);
      const ProjectionFormat& f = formats_[size_t(p)];
      const std::string proj = kExpertProjections[p];
      uint8_t* wdst = blob + layout.find(proj + ".weight")->offset;
      if (f.affine() && m.format != WeightFormat::Affine) {
        std::vector<TensorBytes> q = quantize_matrix(m, f.bits, f.group_size);
        std::memcpy(wdst, q[0].data(), q[0].nbytes());
        std::memcpy(blob + layout.find(proj + ".scales")->offset, q[1].data(), q[1].nbytes());
        std::memcpy(blob + layout.find(proj + ".biases")->offset, q[2].data(), q[2].nbytes());
        continue;
      }
      // Same format on both sides: the bytes pass through untouched.
      std::memcpy(wdst, m.data, size_t(m.rows) * m.row_bytes());
      if (f.affine()) {
        std::memcpy(blob + layout.find(proj + ".scales")->offset, m.scales, size_t(m.rows) * m.scale_row_bytes());
        std::memcpy(blob + layout.find(proj + ".biases")->offset, m.biases, size_t(m.rows) * m.scale_row_bytes());
      }
    }
  }

  std::vector<std::string> layer_inputs(int layer) const override {
    std::vector<std::string> out;
    for (const char* part : {"mlp.experts.", "mlp.switch_mlp."}) {
      const auto more = names_under(src_names_.layer(layer) + part);
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  }

  void layer_done(int layer) override {
    for (int e = 0; e < config_.num_experts; ++e) {
      const ExpertWeights& w = experts_->get(layer, e);
      drop_matrix_pages(w.gate);
      drop_matrix_pages(w.up);
      drop_matrix_pages(w.down);
    }
  }

 private:
  // The source tensors named `prefix`* (a module's weight, scales and biases; a layer's experts).
  std::vector<std::string> names_under(const std::string& prefix) const {
    std::vector<std::string> out;
    for (const std::string& n : ts_->names())
      if (n.starts_with(prefix)) out.push_back(n);
    return out;
  }

  ResidentItem resident_item(const DenseTensorSpec& s, const DenseTensorSpec& d) {
    ResidentItem it = resident_item_of(s, d);
    it.inputs = s.kind == TensorKind::Linear ? names_under(s.name + ".") : std::vector<std::string>{s.name};
    return it;
  }

  ResidentItem resident_item_of(const DenseTensorSpec& s, const DenseTensorSpec& d) {
    ResidentItem it;
    switch (s.kind) {
      case TensorKind::Linear: {
        const QMatrix m = view_linear(*ts_, s.name, s.rows, s.cols, config_.quant);
        const std::string w = d.name + ".weight";
        if (m.format == WeightFormat::Affine) {
          const int64_t g = s.cols / m.group_size;
          it.tensors = {{w, DType::U32, {d.rows, s.cols * m.bits / 32}, nullptr},
                        {d.name + ".scales", m.scale_dtype, {d.rows, g}, nullptr},
                        {d.name + ".biases", m.scale_dtype, {d.rows, g}, nullptr}};
          if (m.bits != bits_ || m.group_size != group_) overrides_[d.name] = QuantSpec{m.bits, m.group_size};
          it.produce = [m] {
            std::vector<TensorBytes> out;
            out.push_back(view_bytes(m.data, size_t(m.rows) * m.row_bytes()));
            out.push_back(view_bytes(m.scales, size_t(m.rows) * m.scale_row_bytes()));
            out.push_back(view_bytes(m.biases, size_t(m.rows) * m.scale_row_bytes()));
            return out;
          };
          return it;
        }
        // A float matrix of an MLX-quantised checkpoint (a bf16 router, say) stays as stored.
        const int bits = bits_ == 16 || pass_through_ ? 16 : is_eight_bit_module(s.name) ? 8 : bits_;
        if (bits == 16 || s.cols % group_ != 0) {
          const DType dt = float_dtype(m.format);
          it.tensors = {{w, dt, {d.rows, s.cols}, nullptr}};
          it.produce = [m] { return std::vector<TensorBytes>{view_bytes(m.data, size_t(m.rows) * m.row_bytes())}; };
          return it;
        }
        const int group = group_;
        it.tensors = {{w, DType::U32, {d.rows, s.cols * bits / 32}, nullptr},
                      {d.name + ".scales", DType::BF16, {d.rows, s.cols / group}, nullptr},
                      {d.name + ".biases", DType::BF16, {d.rows, s.cols / group}, nullptr}};
        if (bits != bits_) overrides_[d.name] = QuantSpec{bits, group};
        it.produce = [m, bits, group] { return quantize_matrix(m, bits, group); };
        return it;
      }
      case TensorKind::ZeroCentredNorm: {
        const TensorView& t = ts_->get(s.name);
        if (t.numel() != s.rows)
          fail("tensor '{}' in '{}' has shape {}; expected [{}]", t.name, *t.file, t.shape_str(), s.rows);
        if (shifted_) {
          it.tensors = {{d.name, t.dtype, t.shape, nullptr}};
          it.produce = [t] { return std::vector<TensorBytes>{view_bytes(t.data, t.nbytes)}; };
          return it;
        }
        // Bake 1 + w in fp32 (MLX convention: the stored weight is applied as is). fp32 keeps
        // it exact, so a --bits 16 container computes what the checkpoint does.
        it.tensors = {{d.name, DType::F32, {s.rows}, nullptr}};
        it.produce = [t] {
          TensorBytes b;
          b.owned.resize(size_t(t.numel()) * 4);
          float* f = reinterpret_cast<float*>(b.owned.data());
          to_f32(t.dtype, t.data, f, size_t(t.numel()));
          for (int64_t i = 0; i < t.numel(); ++i) f[i] += 1.0f;
          return std::vector<TensorBytes>{std::move(b)};
        };
        return it;
      }
      case TensorKind::Conv: {
        const TensorView& t = ts_->get(s.name);
        if (t.numel() != s.rows * s.cols)
          fail("tensor '{}' in '{}' has shape {}; expected [{}, 1, {}] or [{}, {}, 1]", t.name, *t.file,
               t.shape_str(), s.rows, s.cols, s.rows, s.cols);
        // HF [C, 1, K] and MLX [C, K, 1] have the same bytes; MLX layout also tells the
        // loader that norms already hold 1 + w.
        it.tensors = {{d.name, t.dtype, {s.rows, s.cols, 1}, nullptr}};
        it.produce = [t] { return std::vector<TensorBytes>{view_bytes(t.data, t.nbytes)}; };
        return it;
      }
      case TensorKind::Vector: {
        const TensorView& t = ts_->get(s.name);
        it.tensors = {{d.name, t.dtype, t.shape, nullptr}};
        it.produce = [t] { return std::vector<TensorBytes>{view_bytes(t.data, t.nbytes)}; };
        return it;
      }
    }
    return it;
  }

  std::string dir_;
  json raw_config_;
  ModelConfig config_;
  std::unique_ptr<TensorSet> ts_;
  NameScheme src_names_, dst_names_;
  bool shifted_ = false;
  bool pass_through_ = false;  // MLX-quantised source: every tensor is copied as stored
  std::unique_ptr<TensorExperts> experts_;
  int bits_ = 4, group_ = 64;
  std::array<ProjectionFormat, 3> formats_, src_formats_;
  std::map<std::string, QuantSpec> overrides_;
};

}  // namespace

std::unique_ptr<RepackSource> open_checkpoint_source(const std::string& dir, const RepackOptions& opts) {
  return std::make_unique<CheckpointSource>(dir, nullptr, opts);
}

std::unique_ptr<RepackSource> open_checkpoint_source(const std::string& dir, TensorSet tensors,
                                                     const RepackOptions& opts) {
  return std::make_unique<CheckpointSource>(dir, std::make_unique<TensorSet>(std::move(tensors)), opts);
}

}  // namespace swiftlet
