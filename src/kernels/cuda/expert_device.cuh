// The routed experts' kernel arguments and the device code moe_experts.cu (the FP32 register
// kernels, the launches) and moe_experts_sm90.cu (the streamed and tensor-core kernels) share:
// a token's arrays in a rows launch, the parts' slots, the top-k inside the act kernel. Not part
// of the API.
#pragma once

#include "kernels/cuda/decode_products.cuh"
#include "kernels/cuda/probe.cuh"

namespace swiftlet::cuda {

namespace detail {

struct Part {  // a matrix of an expert: byte offsets from the slot base, or addresses (base 0)
  size_t data, scales, biases;
};
struct ExpertArgs {
  Part gate, up, down;           // routed experts: offsets in the slot
  Part sh_gate, sh_up, sh_down;  // the shared expert: addresses
  const void* const* table;
  const int32_t* ids;
  int n;      // routed experts
  int parts;  // n, or n + 1 with the shared expert
  int I, H;   // intermediate and hidden sizes
  int gs_in, st_in, gs_out, st_out;
  const float* x;  // [H] for gate/up; act [parts][I] for down
  const float* w;  // [n] routing weights
  const float* sh_gate_logit;
  float* y;  // act [parts][I] for gate/up; h [H] for down
  // expert_act_routed: the router's logits [E]; every block takes the top n itself, block 0 writes
  // them to ids / w for expert_down_add. Null: the ids come from memory.
  const float* logits;
  int E;  // experts
  bool renormalise;
  int32_t* ids_out;
  float* w_out;
  // expert_down: the ids were written two kernels back (router_topk), so they can be read for the
  // L2 prefetch before the wait; not so after expert_act_routed.
  bool ids_early;
  int stages, stage_bytes, ring_off;  // streamed products only (below)
  // The rows forms (expert_act_rows, expert_down_add_rows): token t = blockIdx.y of `tokens` reads
  // and writes its arrays at these strides, in elements: x, y, logits, ids and w (in and out alike),
  // the shared expert's gate logit. One token: 0.
  int64_t x_stride, y_stride, logits_stride, ids_stride, sg_stride;
  int tokens;
};

// moe_experts_sm90.cu: the act and down products of sm_90 (decode_products.cuh's streamed and
// tensor-core generations); false where the device or the shape does not take them, and the
// caller launches the FP32 kernels.
bool stream_act(const ExpertArgs& a, int bits, cudaStream_t s);
bool tc_act(const ExpertArgs& a, int bits, cudaStream_t s);
bool tc_down(ExpertArgs a, int bits, cudaStream_t s);
void prepare_sm90_expert_kernels();  // prepare_expert_kernels' share for them

}  // namespace detail

namespace {

// This block's token's x, y, logits, ids, weights, ids / weights out and shared gate logit.
__device__ __forceinline__ const float* tok_x(const ExpertArgs& a) { return a.x + token_offset(a.x_stride); }
__device__ __forceinline__ float* tok_y(const ExpertArgs& a) { return a.y + token_offset(a.y_stride); }
__device__ __forceinline__ const float* tok_logits(const ExpertArgs& a) {
  return a.logits + token_offset(a.logits_stride);
}
__device__ __forceinline__ const int32_t* tok_ids(const ExpertArgs& a) { return a.ids + token_offset(a.ids_stride); }
__device__ __forceinline__ float tok_w(const ExpertArgs& a, int p) { return a.w[token_offset(a.ids_stride) + p]; }
__device__ __forceinline__ void tok_route_out(const ExpertArgs& a, int p, int32_t id, float w) {
  a.ids_out[token_offset(a.ids_stride) + p] = id;
  a.w_out[token_offset(a.ids_stride) + p] = w;
}
__device__ __forceinline__ float tok_shared_gate(const ExpertArgs& a) {
  return sigmoidf_(a.sh_gate_logit[token_offset(a.sg_stride)]);
}


// Part p's slot base as an integer (0 for the shared expert, whose offsets are addresses).
__device__ __forceinline__ size_t part_base(const ExpertArgs& a, int p) {
  return p < a.n ? reinterpret_cast<size_t>(a.table[tok_ids(a)[p]]) : size_t(0);
}
template <typename T>
__device__ __forceinline__ const T* at(size_t base, size_t off) {
  return reinterpret_cast<const T*>(base + off);
}

// ---------------------------------------------------------------------------------------------
// The top-k inside the act kernel.

// The same top k by one warp, with no block barrier (expert_act_routed runs it in warp 0 while the
// other warps stage x): lane l holds logits l, l + 32, ... (PER of them, E <= 32 PER). The same
// softmax and order (ties to the lower index) as block_topk; the softmax sum runs in another
// order, so the weights may differ from router_topk's in the last bits. Lane 0 writes ids, lanes
// < k the weights.
//
// A probability p >= 0 orders as its bits, so each is a key (bits + 1; 0: no expert, or taken) and
// a round of the selection is two warp reductions (__reduce_max_sync of the lanes' best keys, then
// __reduce_min_sync of the indices holding that key) and the winner lane's new best, by a tree
// over its PER keys that keeps the lower index on ties. (Ten rounds of shuffle argmax over all
// PER values took ~5 us of the act kernel's critical path.)
template <int PER>
__device__ __forceinline__ void warp_topk(const float* __restrict__ lr, int E, int k, bool renormalise, int32_t* ids,
                                          float* weights) {
  static_assert((PER & (PER - 1)) == 0, "PER: a power of two");
  const int lane = threadIdx.x & 31;
  float p[PER];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = lane + 32 * j;
    p[j] = i < E ? __ldcg(lr + i) : -INFINITY;
    m = fmaxf(m, p[j]);
  }
  m = detail::warp_max(m);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const float e = lane + 32 * j < E ? expf(p[j] - m) : 0.0f;
    p[j] = e;
    s += e;
  }
  const float inv = 1.0f / warp_sum(s);
  uint32_t key[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) key[j] = lane + 32 * j < E ? __float_as_uint(p[j] * inv) + 1u : 0u;
  // The lane's best key and its j (the lowest j among equal keys).
  auto best_of = [&](uint32_t& best, int& bj) {
    uint32_t kk[PER];
    int jj[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      kk[j] = key[j];
      jj[j] = j;
    }
#pragma unroll
    for (int w = 1; w < PER; w *= 2)
#pragma unroll
      for (int j = 0; j < PER; j += 2 * w)
        if (kk[j + w] > kk[j]) {  // ties keep the lower block
          kk[j] = kk[j + w];
          jj[j] = jj[j + w];
        }
    best = kk[0];
    bj = jj[0];
  };
  uint32_t best;
  int bj;
  best_of(best, bj);
  float sum = 0.0f;
  for (int r = 0; r < k; ++r) {
    const uint32_t top = __reduce_max_sync(0xffffffffu, best);
    const uint32_t win = __reduce_min_sync(0xffffffffu, best == top ? uint32_t(lane + 32 * bj) : 0xffffffffu);
    const float pv = __uint_as_float(top - 1u);
    sum += pv;
    if (lane == 0) {
      ids[r] = int32_t(win);
      weights[r] = pv;
    }
    if (lane == int(win & 31u)) {
#pragma unroll
      for (int j = 0; j < PER; ++j)
        if (j == bj) key[j] = 0u;  // taken
      best_of(best, bj);
    }
  }
  __syncwarp();
  if (renormalise && lane < k) weights[lane] /= sum;
}

}  // namespace
}  // namespace swiftlet::cuda
