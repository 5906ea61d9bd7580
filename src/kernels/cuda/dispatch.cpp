// The decode operations whose kernel depends on the device and the shapes: one place that
// chooses, so the forward pass (model/gpu_decode.cpp) states only the model's math. Host code over
// the kernels' API.
#include "kernels/cuda/cuda_kernels.h"

namespace swiftlet::cuda {

void deltanet_decode(const DeltaNetSpec& d, const DeltaNetIn& in, const StepRows& rows, const DeltaNetScratch& scratch,
                     float* d_o, GpuStream s) {
  if (deltanet_step_rows(d, in, rows, d_o, s)) return;
  const int64_t kd = d.key_dim(), C = d.conv_dim(), vd = d.value_dim();
  float* u = scratch.u;
  for (int64_t i = 0; i < rows.n; ++i) {  // row by row on the stream: one u serves them all
    float* conv_state = rows.h_states[2 * i];
    float* S = rows.h_states[2 * i + 1];
    conv1d_silu_step(in.x + i * C, d.d_conv_w, conv_state, C, d.K, u, s);
    l2_norm_qk(u, d.hk, d.dk, d.l2_eps, d.q_scale, s);  // q then k: contiguous in u
    delta_rule_norm_step(u, u + kd, u + 2 * kd, in.b + i * d.hv, in.a + i * d.hv, d.d_A_log, d.d_dt_bias, S,
                         in.z + i * vd, d.d_norm_w, d.eps, d.hk, d.hv, d.dk, d.dv, d_o + i * vd, s);
  }
}

void experts_act(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, int n,
                 const SharedExpert* sh, const float* d_x, const ExpertScratch& scratch, GpuStream s) {
  if (sh || experts_fusable(l, n, nullptr)) {  // expert_act checks that it takes sh
    expert_act(l, d_table, d_ids, n, sh, d_x, scratch.act, s);
    return;
  }
  expert_gate_up(l, d_table, d_ids, n, d_x, scratch.act, scratch.up, s);
  silu_mul(scratch.act, scratch.up, int64_t(n) * l.gate.rows, scratch.act, s);
}

void experts_down_add(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, const float* d_w,
                      int n, const SharedExpert* sh, const ExpertScratch& scratch, float* d_h, GpuStream s,
                      bool ids_early) {
  if (sh || experts_fusable(l, n, nullptr)) {
    expert_down_add(l, d_table, d_ids, d_w, n, sh, scratch.act, d_h, s, ids_early);
    return;
  }
  expert_down(l, d_table, d_ids, n, scratch.act, scratch.y, s);
  moe_combine(d_h, scratch.y, d_w, n, l.down.rows, s);
}

namespace {

// Token t's shared expert (its gate logit sh->d_gate_logit[t]) and scratch (its act row).
struct TokenParts {
  SharedExpert sh;
  ExpertScratch scratch;
};
TokenParts token_parts(const RoutedExperts& ex, const SharedExpert* sh, const ExpertScratch& scratch, int64_t t) {
  TokenParts p;
  if (sh) {
    p.sh = *sh;
    p.sh.d_gate_logit = sh->d_gate_logit + t;
  }
  const int64_t act = int64_t(ex.k + (sh ? 1 : 0)) * ex.layout.gate.rows;
  p.scratch = {scratch.act + t * act, scratch.up, scratch.y};
  return p;
}

}  // namespace

bool routes_in_act(const RoutedExperts& ex, const SharedExpert* sh) {
  return sh && experts_fusable(ex.layout, ex.k, sh) && expert_act_routes(ex.E, ex.k);
}

void route_experts_act(const RoutedExperts& ex, const float* d_logits, const SharedExpert* sh, const float* d_x,
                       int tokens, int32_t* d_ids, float* d_w, const ExpertScratch& scratch, GpuStream s) {
  const ExpertLayout& l = ex.layout;
  if (routes_in_act(ex, sh)) {
    expert_act_routed_rows(l, ex.d_table, d_logits, ex.E, ex.k, ex.renormalise, sh, d_x, tokens, d_ids, d_w,
                           scratch.act, s);
    return;
  }
  for (int64_t t = 0; t < tokens; ++t) {
    const TokenParts p = token_parts(ex, sh, scratch, t);
    int32_t* ids = d_ids + t * ex.k;
    float* w = d_w + t * ex.k;
    router_topk(d_logits + t * ex.E, 1, ex.E, ex.k, ex.renormalise, ids, w, s);
    experts_act(l, ex.d_table, ids, ex.k, sh ? &p.sh : nullptr, d_x + t * l.gate.cols, p.scratch, s);
  }
}

void routed_experts_down_add(const RoutedExperts& ex, const int32_t* d_ids, const float* d_w, const SharedExpert* sh,
                             const ExpertScratch& scratch, int tokens, float* d_h, GpuStream s) {
  const ExpertLayout& l = ex.layout;
  if (routes_in_act(ex, sh)) {  // the ids written by the kernel just before: no early prefetch
    expert_down_add_rows(l, ex.d_table, d_ids, d_w, ex.k, sh, scratch.act, tokens, d_h, s, /*ids_early=*/false);
    return;
  }
  for (int64_t t = 0; t < tokens; ++t) {
    const TokenParts p = token_parts(ex, sh, scratch, t);
    experts_down_add(l, ex.d_table, d_ids + t * ex.k, d_w + t * ex.k, ex.k, sh ? &p.sh : nullptr, p.scratch,
                     d_h + t * l.gate.cols, s);
  }
}

}  // namespace swiftlet::cuda
