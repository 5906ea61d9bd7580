#include "model/weights.h"

#include "core/error.h"
#include "format/safetensors.h"

#include <fmt/ranges.h>

#include <cstring>

namespace swiftlet {

NameScheme NameScheme::hf(const ModelConfig& c) {
  if (c.family == Family::Qwen35Moe && c.model_type == "qwen3_5_moe")
    return {"model.language_model.layers.", "model.language_model.embed_tokens",
            "model.language_model.norm.weight", "lm_head"};
  return {"model.layers.", "model.embed_tokens", "model.norm.weight", "lm_head"};
}

NameScheme NameScheme::mlx(const ModelConfig& c) {
  if (c.family == Family::Qwen35Moe && c.model_type == "qwen3_5_moe")
    return {"language_model.model.layers.", "language_model.model.embed_tokens",
            "language_model.model.norm.weight", "language_model.lm_head"};
  return {"model.layers.", "model.embed_tokens", "model.norm.weight", "lm_head"};
}

NameScheme NameScheme::detect(const TensorSet& ts, const ModelConfig& c) {
  const NameScheme candidates[] = {
      {"model.language_model.layers.", "model.language_model.embed_tokens",
       "model.language_model.norm.weight", "lm_head"},
      {"language_model.model.layers.", "language_model.model.embed_tokens",
       "language_model.model.norm.weight", "language_model.lm_head"},
      {"model.layers.", "model.embed_tokens", "model.norm.weight", "lm_head"},
  };
  for (const auto& n : candidates)
    if (ts.contains(n.embed + ".weight")) return n;
  fail("'{}' has no token embedding (looked for model.embed_tokens.weight, "
       "model.language_model.embed_tokens.weight, language_model.model.embed_tokens.weight); "
       "is it a {} checkpoint?", ts.source(), c.family_name());
}

namespace {

std::string shape_str(std::initializer_list<int64_t> s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// The trailing 2 dims of `t` after an optional leading stack index.
void expect_shape(const TensorView& t, int64_t index, int64_t rows, int64_t cols) {
  const size_t want_rank = index >= 0 ? 3 : 2;
  bool ok = t.shape.size() == want_rank && t.shape[want_rank - 2] == rows && t.shape[want_rank - 1] == cols;
  if (ok && index >= 0) ok = index < t.shape[0];
  if (!ok)
    fail("tensor '{}' in '{}' has shape {} but the config implies {}{} (wrong config.json or a "
         "corrupted checkpoint?)", t.name, *t.file, t.shape_str(),
         index >= 0 ? "[N, " : "", index >= 0 ? fmt::format("{}, {}]", rows, cols) : shape_str({rows, cols}));
}

const uint8_t* stack_ptr(const TensorView& t, int64_t index) {
  if (index < 0) return t.data;
  return t.data + size_t(index) * (t.nbytes / size_t(t.shape[0]));
}

}  // namespace

QMatrix view_linear(const TensorSet& ts, const std::string& path, int64_t rows, int64_t cols,
                    const QuantConfig& q, int64_t index, const std::string& weight_suffix) {
  const TensorView& w = ts.get(path + weight_suffix);
  QMatrix m;
  m.rows = rows;
  m.cols = cols;
  // As mlx-lm decides: a module is quantised exactly when its `.scales` exist, whatever its name
  // (an MLX checkpoint may keep its router in bf16, or quantise it at 8 bits).
  const TensorView* s = ts.find(path + ".scales");
  if (!s) {
    if (!is_float(w.dtype))
      fail("tensor '{}' in '{}' has dtype {} but there is no '{}.scales': a float weight or an MLX "
           "quantised one (U32 with .scales and .biases) was expected (a corrupted checkpoint?)",
           w.name, *w.file, dtype_name(w.dtype), path);
    expect_shape(w, index, rows, cols);
    m.format = w.dtype == DType::F32 ? WeightFormat::F32
               : w.dtype == DType::BF16 ? WeightFormat::BF16 : WeightFormat::F16;
    m.data = stack_ptr(w, index);
    return m;
  }
  if (w.dtype != DType::U32)
    fail("tensor '{}' in '{}' has dtype {} but '{}.scales' exists; MLX quantised weights are U32",
         w.name, *w.file, dtype_name(w.dtype), path);
  const TensorView& b = ts.get(path + ".biases");
  // The shapes say the bits and group size: [.., cols * bits / 32] codes, [.., cols / group]
  // scales. The config's per-module entry, where it names this module, must agree.
  const int64_t groups = s->shape.empty() ? 0 : s->shape.back();
  const int64_t packed = w.shape.empty() ? 0 : w.shape.back();
  if (groups <= 0 || cols % groups != 0 || (packed * 32) % cols != 0)
    fail("tensor '{}' in '{}' is quantised but its shapes {} / {} fit no bit width and group size "
         "for {} columns", w.name, *w.file, w.shape_str(), s->shape_str(), cols);
  QuantSpec spec{int(packed * 32 / cols), int(cols / groups)};
  if (auto it = q.overrides.find(path); it != q.overrides.end() && it->second.bits != 0 &&
                                        (it->second.bits != spec.bits || it->second.group_size != spec.group_size))
    fail("'{}' is stored with {} bits in groups of {} but config.json declares {} bits in groups of {} "
         "for it (a corrupted checkpoint or a config.json from another one?)", path, spec.bits,
         spec.group_size, it->second.bits, it->second.group_size);
  if (spec.bits != 4 && spec.bits != 8)
    fail("'{}' is quantised at {} bits; only 4 and 8 are supported", path, spec.bits);
  if (cols % spec.group_size != 0 || spec.group_size % (32 / spec.bits) != 0)
    fail("'{}': group size {} does not fit {} columns at {} bits", path, spec.group_size, cols, spec.bits);
  expect_shape(w, index, rows, cols * spec.bits / 32);
  expect_shape(*s, index, rows, cols / spec.group_size);
  expect_shape(b, index, rows, cols / spec.group_size);
  if (!is_float(s->dtype) || s->dtype != b.dtype)
    fail("'{}': scales ({}) and biases ({}) must share one float dtype", path, dtype_name(s->dtype),
         dtype_name(b.dtype));
  m.format = WeightFormat::Affine;
  m.bits = spec.bits;
  m.group_size = spec.group_size;
  m.scale_dtype = s->dtype;
  m.data = stack_ptr(w, index);
  m.scales = stack_ptr(*s, index);
  m.biases = stack_ptr(b, index);
  return m;
}

bool norms_hold_one_plus_w(const TensorSet& ts, const ModelConfig& c, const NameScheme& n) {
  for (int i = 0; i < c.num_layers; ++i) {
    if (!c.is_linear_layer(i)) continue;
    const TensorView& conv = ts.get(n.layer(i) + "linear_attn.conv1d.weight");
    // HF: [C, 1, K]; MLX (sanitised, norms shifted): [C, K, 1].
    return conv.shape.size() == 3 && conv.shape[2] == 1 && conv.shape[1] != 1;
  }
  return false;  // no DeltaNet layer to tell by: assume Hugging Face layout
}

namespace {

std::vector<float> read_vector(const TensorView& t, int64_t n) {
  if (!is_float(t.dtype))
    fail("tensor '{}' in '{}' has dtype {}; expected F32/F16/BF16", t.name, *t.file, dtype_name(t.dtype));
  if (t.numel() != n)
    fail("tensor '{}' in '{}' has shape {} ({} values) but the config implies {} values", t.name,
         *t.file, t.shape_str(), t.numel(), n);
  std::vector<float> v(static_cast<size_t>(n));
  to_f32(t.dtype, t.data, v.data(), size_t(n));
  return v;
}

// A copy of m with row i taken from row order[i] (quantised rows move whole, with their scales
// and biases), its bytes kept alive by `owned`.
QMatrix gather_rows(const QMatrix& m, const std::vector<int64_t>& order,
                    std::vector<std::shared_ptr<const std::vector<uint8_t>>>& owned) {
  const size_t rb = m.row_bytes(), sb = m.scale_row_bytes(), n = order.size();
  auto buf = std::make_shared<std::vector<uint8_t>>(n * (rb + 2 * sb));
  auto gather = [&](const void* src, size_t row, uint8_t* dst) {
    for (size_t i = 0; i < n; ++i)
      std::memcpy(dst + i * row, static_cast<const uint8_t*>(src) + size_t(order[i]) * row, row);
  };
  QMatrix out = m;
  out.rows = int64_t(n);
  gather(m.data, rb, buf->data());
  out.data = buf->data();
  if (m.format == WeightFormat::Affine) {
    gather(m.scales, sb, buf->data() + n * rb);
    gather(m.biases, sb, buf->data() + n * (rb + sb));
    out.scales = buf->data() + n * rb;
    out.biases = buf->data() + n * (rb + sb);
  }
  owned.push_back(std::move(buf));
  return out;
}

}  // namespace

std::vector<int64_t> split_row_order(const ModelConfig& c, FusedInput which) {
  const int64_t hk = c.linear_num_key_heads, r = c.linear_num_value_heads / hk;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  std::vector<int64_t> order;
  if (which == FusedInput::Qkvz) {
    const int64_t group = 2 * dk + 2 * r * dv;  // one key head's rows: q_g, k_g, v, z
    for (int64_t part = 0; part < 2; ++part)     // q, then k
      for (int64_t g = 0; g < hk; ++g)
        for (int64_t i = 0; i < dk; ++i) order.push_back(g * group + part * dk + i);
    for (int64_t part = 0; part < 2; ++part)  // v, then z
      for (int64_t g = 0; g < hk; ++g)
        for (int64_t i = 0; i < r * dv; ++i) order.push_back(g * group + 2 * dk + part * r * dv + i);
  } else if (which == FusedInput::Ba) {
    for (int64_t part = 0; part < 2; ++part)  // b, then a
      for (int64_t g = 0; g < hk; ++g)
        for (int64_t j = 0; j < r; ++j) order.push_back(g * 2 * r + part * r + j);
  }
  return order;
}

DeltaNetLayout stored_deltanet_layout(const TensorSet& ts, const ModelConfig& c, const NameScheme& n) {
  if (c.family != Family::Qwen3Next) return DeltaNetLayout::Split;
  for (int i = 0; i < c.num_layers; ++i)
    if (c.is_linear_layer(i)) {
      const std::string fused = n.layer(i) + "linear_attn.in_proj_qkvz";
      return ts.find(fused + ".weight") ? DeltaNetLayout::Grouped : DeltaNetLayout::Split;
    }
  return DeltaNetLayout::Split;
}

ModelWeights load_dense_weights(const TensorSet& ts, const ModelConfig& c, const NameScheme& n) {
  const bool shifted = norms_hold_one_plus_w(ts, c, n);
  const DeltaNetLayout stored = stored_deltanet_layout(ts, c, n);
  ModelWeights w;
  for_each_dense_tensor(c, n, w, [&](const DenseTensorSpec& spec, QMatrix* m, std::vector<float>* v) {
    switch (spec.kind) {
      case TensorKind::Linear:
        *m = view_linear(ts, spec.name, spec.rows, spec.cols, c.quant);
        if (spec.fused != FusedInput::None) *m = gather_rows(*m, split_row_order(c, spec.fused), w.owned);
        return;
      case TensorKind::Vector:
        *v = read_vector(ts.get(spec.name), spec.rows);
        return;
      case TensorKind::ZeroCentredNorm:
        *v = read_vector(ts.get(spec.name), spec.rows);
        if (!shifted)
          for (float& x : *v) x += 1.0f;
        return;
      case TensorKind::Conv: {
        const TensorView& t = ts.get(spec.name);
        const bool hf = t.shape == std::vector<int64_t>{spec.rows, 1, spec.cols};
        const bool mlx = t.shape == std::vector<int64_t>{spec.rows, spec.cols, 1};
        if (!hf && !mlx)
          fail("tensor '{}' in '{}' has shape {}; expected [{}, 1, {}] or [{}, {}, 1]", t.name,
               *t.file, t.shape_str(), spec.rows, spec.cols, spec.rows, spec.cols);
        *v = read_vector(t, spec.rows * spec.cols);  // both layouts are [C][K] in memory
        return;
      }
    }
  }, stored);
  const int64_t C = c.conv_dim(), vd = c.linear_value_dim(), hv = c.linear_num_value_heads;
  for (LayerWeights& l : w.layers) {
    DeltaNetWeights& g = l.gdn;
    if (!g.in_proj_qkvz.empty()) {  // Grouped inputs, reordered by now: the four are row ranges
      g.in_proj_qkv = g.in_proj_qkvz.row_slice(0, C);
      g.in_proj_z = g.in_proj_qkvz.row_slice(C, vd);
      g.in_proj_b = g.in_proj_ba.row_slice(0, hv);
      g.in_proj_a = g.in_proj_ba.row_slice(hv, hv);
    }
  }
  return w;
}

}  // namespace swiftlet
