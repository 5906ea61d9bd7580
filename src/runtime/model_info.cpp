#include "runtime/model_info.h"

#include "core/error.h"
#include "format/qpack.h"
#include "format/safetensors.h"
#include "model/qwen3_hybrid.h"
#include "model/weights.h"

#include <algorithm>
#include <filesystem>

namespace swiftlet {

namespace fs = std::filesystem;

namespace {

std::string default_quant(const QuantConfig& q) {
  if (!q.quantized()) return "none (float weights)";
  return fmt::format("{}-bit g{} affine (MLX)", q.default_spec.bits, q.default_spec.group_size);
}

int count_eight_bit(const QuantConfig& q) {
  int n = 0;
  for (const auto& [k, s] : q.overrides) n += s.bits == 8 && q.default_spec.bits != 8;
  return n;
}

// Bytes of every resident tensor named by the weights table; with `fused_only`, of Qwen3-Next's
// fused DeltaNet inputs alone (what the loader copies when it reorders Grouped rows).
uint64_t resident_bytes(const TensorSet& ts, const ModelConfig& c, bool fused_only = false) {
  const NameScheme n = NameScheme::detect(ts, c);
  const DeltaNetLayout layout = stored_deltanet_layout(ts, c, n);
  uint64_t total = 0;
  ModelWeights scratch;
  for_each_dense_tensor(c, n, scratch, [&](const DenseTensorSpec& s, auto&&, auto&&) {
    if (fused_only && s.fused == FusedInput::None) return;
    for (const char* sfx : {"", ".weight", ".scales", ".biases"}) {
      if (s.kind != TensorKind::Linear && *sfx) continue;
      if (s.kind == TensorKind::Linear && !*sfx) continue;
      if (const TensorView* t = ts.find(s.name + sfx)) total += t->nbytes;
    }
  }, layout);
  return total;
}

}  // namespace

ModelSummary summarize_qpack(const QpackContainer& qc) {
  ModelSummary s;
  s.path = qc.dir;
  s.qpack = true;
  s.source = qc.manifest.source_checkpoint;
  s.checksums = qc.checksums.has_value();
  s.config = qc.config;
  s.resident_bytes = fs::file_size(qc.path("model.safetensors"));
  // A Grouped container (Swiftlet's) costs its fused DeltaNet inputs twice: mapped and reordered.
  s.resident_bytes += resident_bytes(TensorSet::open_files({qc.path("model.safetensors")}), s.config, true);
  s.streamed_bytes = uint64_t(qc.layout.layer_count) * uint64_t(qc.layout.expert_count) * qc.layout.expert_stride;
  s.expert_bytes = qc.layout.payload();
  s.expert_stride = qc.layout.expert_stride;
  s.expert_format = qc.layout.projection_format(0, qc.config).describe();
  const ProjectionFormat down = qc.layout.projection_format(2, qc.config);
  if (!(down == qc.layout.projection_format(0, qc.config))) s.expert_format += ", down_proj " + down.describe();
  s.quantization = default_quant(s.config.quant);
  s.eight_bit_modules = count_eight_bit(s.config.quant);
  return s;
}

ModelSummary summarize_model(const std::string& path) {
  if (looks_like_qpack(path)) {
    ModelSummary s = summarize_qpack(QpackContainer::open(path));
    s.path = path;
    return s;
  }
  ModelSummary s;
  s.path = path;
  if (!fs::is_directory(path)) fail("'{}' is neither a .qpack container nor a checkpoint directory", path);
  s.config = ModelConfig::load((fs::path(path) / "config.json").string());
  const TensorSet ts = TensorSet::open_dir(path);
  s.resident_bytes = resident_bytes(ts, s.config) + resident_bytes(ts, s.config, true);  // fused inputs: copied
  for (const auto& name : ts.names()) {
    if (name.starts_with("mtp.")) continue;
    if (name.find(".mlp.experts.") != std::string::npos || name.find(".mlp.switch_mlp.") != std::string::npos)
      s.streamed_bytes += ts.get(name).nbytes;
  }
  const uint64_t n = uint64_t(s.config.num_layers) * uint64_t(s.config.num_experts);
  s.expert_bytes = n ? s.streamed_bytes / n : 0;
  s.expert_stride = s.expert_bytes;
  s.expert_format = s.config.quant.quantized() ? default_quant(s.config.quant) : "float (as stored)";
  s.quantization = default_quant(s.config.quant);
  s.eight_bit_modules = count_eight_bit(s.config.quant);
  return s;
}

RamEstimate estimate_peak_ram(const ModelSummary& s, int64_t cache_experts, int64_t context, int64_t prompt) {
  const ModelConfig& c = s.config;
  RamEstimate r;
  // Norms, conv weights, A_log, dt_bias are also kept as fp32 vectors (small).
  const uint64_t vectors = uint64_t(c.num_layers) * uint64_t(4 * c.hidden_size + c.conv_dim() * c.linear_conv_kernel_dim) * 4;
  r.resident = s.resident_bytes + vectors;
  r.expert_cache = uint64_t(std::max<int64_t>(0, cache_experts)) * s.expert_stride;
  r.kv_cache = uint64_t(c.kv_bytes_per_token()) * uint64_t(std::max<int64_t>(0, context));
  r.linear_state = uint64_t(c.linear_state_bytes());
  // Per prompt token of a forward call: residual, normed input and output, router logits, the
  // shared expert, the routed experts' outputs (top-k rows) and, at worst (one expert taking
  // every token), one expert's gathered input and activations (fp32); the token mixers' widest
  // projections, DeltaNet channels and attention rows only for kMixerChunk tokens at a time
  // (Forward::run); plus one row of logits.
  const int64_t widest = std::max(c.q_proj_rows(), 2 * c.linear_key_dim() + 2 * c.linear_value_dim());
  const int64_t per_token = 3 * c.hidden_size + c.num_experts + 4 * c.shared_expert_intermediate_size +
                            int64_t(c.num_experts_per_tok) * c.hidden_size + c.hidden_size +
                            2 * c.moe_intermediate_size;
  const int64_t per_mixer_token =
      widest + 2 * c.kv_dim() + c.conv_dim() + 3 * c.linear_value_dim() + 2 * c.attn_out_dim();
  const int64_t tokens = std::max<int64_t>(1, prompt);
  r.activations = uint64_t(tokens * per_token + std::min(tokens, kMixerChunk) * per_mixer_token) * 4 +
                  uint64_t(c.vocab_size) * 4;
  return r;
}

}  // namespace swiftlet
