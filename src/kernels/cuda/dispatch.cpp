// The decode operations whose kernel depends on the device and the shapes: one place that
// chooses, so the forward pass (model/gpu_decode.cpp) states only the model's math. Host code over
// the kernels' API.
#include "kernels/cuda/cuda_kernels.h"

namespace swiftlet::cuda {

void deltanet_decode(const DeltaNetIn& in, const float* d_conv_w, float* d_conv_state, const float* d_A_log,
                     const float* d_dt_bias, float* d_S, const float* d_norm_w, float l2_eps, float q_scale, float eps,
                     int hk, int hv, int dk, int dv, int K, const DeltaNetScratch& scratch, float* d_o, GpuStream s,
                     bool state_early) {
  if (deltanet_step(in, d_conv_w, d_conv_state, d_A_log, d_dt_bias, d_S, d_norm_w, l2_eps, q_scale, eps, hk, hv, dk,
                    dv, K, d_o, s, state_early))
    return;
  const int64_t kd = int64_t(hk) * dk, C = 2 * kd + int64_t(hv) * dv;
  float* u = scratch.u;
  conv1d_silu_step(in.x, d_conv_w, d_conv_state, C, K, u, s);
  l2_norm_qk(u, hk, dk, l2_eps, q_scale, s);  // q then k: contiguous in u
  delta_rule_norm_step(u, u + kd, u + 2 * kd, in.b, in.a, d_A_log, d_dt_bias, d_S, in.z, d_norm_w, eps, hk, hv, dk,
                       dv, d_o, s);
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
// The rows forms token by token: f(t, token t's shared expert (its gate logit sh->d_gate_logit[t]),
// token t's scratch (its act row)).
template <typename F>
void token_by_token(const ExpertLayout& l, int k, const SharedExpert* sh, int tokens, const ExpertScratch& scratch,
                    F f) {
  const int64_t act = int64_t(k + (sh ? 1 : 0)) * l.gate.rows;
  for (int t = 0; t < tokens; ++t) {
    SharedExpert st;
    if (sh) {
      st = *sh;
      st.d_gate_logit = sh->d_gate_logit + t;
    }
    f(int64_t(t), sh ? &st : nullptr, ExpertScratch{scratch.act + t * act, scratch.up, scratch.y});
  }
}
}  // namespace

void route_experts_act_rows(const ExpertLayout& l, const void* const* d_table, const float* d_logits, int E, int k,
                            bool renormalise, const SharedExpert* sh, const float* d_x, int tokens, int32_t* d_ids,
                            float* d_w, const ExpertScratch& scratch, GpuStream s) {
  if (routes_in_act(l, E, k, sh)) {
    expert_act_routed_rows(l, d_table, d_logits, E, k, renormalise, sh, d_x, tokens, d_ids, d_w, scratch.act, s);
    return;
  }
  token_by_token(l, k, sh, tokens, scratch, [&](int64_t t, const SharedExpert* st, const ExpertScratch& sc) {
    route_experts_act(l, d_table, d_logits + t * E, E, k, renormalise, st, d_x + t * l.gate.cols, d_ids + t * k,
                      d_w + t * k, sc, s);
  });
}

void routed_experts_down_add_rows(const ExpertLayout& l, const void* const* d_table, int E, int k, const int32_t* d_ids,
                                  const float* d_w, const SharedExpert* sh, const ExpertScratch& scratch, int tokens,
                                  float* d_h, GpuStream s) {
  if (routes_in_act(l, E, k, sh)) {
    expert_down_add_rows(l, d_table, d_ids, d_w, k, sh, scratch.act, tokens, d_h, s, /*ids_early=*/false);
    return;
  }
  token_by_token(l, k, sh, tokens, scratch, [&](int64_t t, const SharedExpert* st, const ExpertScratch& sc) {
    routed_experts_down_add(l, d_table, E, k, d_ids + t * k, d_w + t * k, st, sc, d_h + t * l.gate.cols, s);
  });
}

bool routes_in_act(const ExpertLayout& l, int E, int k, const SharedExpert* sh) {
  return sh && experts_fusable(l, k, sh) && expert_act_routes(E, k);
}

void route_experts_act(const ExpertLayout& l, const void* const* d_table, const float* d_logits, int E, int k,
                       bool renormalise, const SharedExpert* sh, const float* d_x, int32_t* d_ids, float* d_w,
                       const ExpertScratch& scratch, GpuStream s) {
  if (routes_in_act(l, E, k, sh)) {
    expert_act_routed(l, d_table, d_logits, E, k, renormalise, sh, d_x, d_ids, d_w, scratch.act, s);
    return;
  }
  router_topk(d_logits, 1, E, k, renormalise, d_ids, d_w, s);
  experts_act(l, d_table, d_ids, k, sh, d_x, scratch, s);
}

void routed_experts_down_add(const ExpertLayout& l, const void* const* d_table, int E, int k, const int32_t* d_ids,
                             const float* d_w, const SharedExpert* sh, const ExpertScratch& scratch, float* d_h,
                             GpuStream s) {
  // After expert_act_routed the ids are written by the kernel just before: no early prefetch.
  experts_down_add(l, d_table, d_ids, d_w, k, sh, scratch, d_h, s, !routes_in_act(l, E, k, sh));
}

}  // namespace swiftlet::cuda
