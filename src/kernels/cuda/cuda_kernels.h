// The CUDA kernels (issue 8), callable from plain C++: every pointer named d_* or described as
// "device" lives in GPU memory; host code needs no CUDA headers. Each op mirrors a scalar
// reference (kernels/cpu/ops_ref.h, or the loops of model/qwen3_hybrid.cpp) and is tested
// against it in cuda_kernels_test.cpp. Activations are fp32, accumulation fp32.
//
// Errors: a failed CUDA call is a broken invariant here (the caller checked cuda_available()
// first), so it prints the CUDA error with file and line and aborts.
#pragma once

#include "kernels/cpu/qmatrix.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

struct CUstream_st;  // = cudaStream_t's pointee, so a cudaStream_t converts to GpuStream

namespace swiftlet::cuda {

using GpuStream = CUstream_st*;  // nullptr: the default stream

// True when a CUDA driver and a device of compute capability >= 8.0 are usable. Otherwise
// false, with *reason (if given) saying why, e.g. "CUDA driver: no CUDA-capable device is
// detected", for the "falling back to the CPU" message.
bool cuda_available(std::string* reason = nullptr);
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"; empty when none.
std::string device_description();

// --- memory -----------------------------------------------------------------------------------
void* gpu_alloc(size_t bytes);  // cudaMalloc; aborts when out of memory
void gpu_free(void* d);
void* gpu_alloc_pinned(size_t bytes);  // page-locked host memory (for fast uploads)
void gpu_free_pinned(void* h);
void gpu_upload(void* d_dst, const void* h_src, size_t bytes, GpuStream s = nullptr);  // async on s
void gpu_download(void* h_dst, const void* d_src, size_t bytes, GpuStream s = nullptr);  // synchronous
void gpu_copy(void* d_dst, const void* d_src, size_t bytes, GpuStream s = nullptr);
void gpu_memset(void* d, int value, size_t bytes, GpuStream s = nullptr);
void gpu_sync(GpuStream s = nullptr);
// Milliseconds per call of fn() (which enqueues work on s), timed with CUDA events over
// `iters` calls after one warm-up call.
double gpu_time_ms(const std::function<void()>& fn, int iters, GpuStream s = nullptr);

// A weight matrix in GPU memory: the same layout as QMatrix (kernels/cpu/qmatrix.h), its
// pointers on the device. Affine needs bits 4 or 8, group_size a multiple of 128 / bits
// (64 for the MLX checkpoints) and cols a multiple of group_size.
struct GpuMatrix {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;
  int bits = 0, group_size = 0;
  DType scale_dtype = DType::BF16;  // BF16, F16 or F32
  const void* scales = nullptr;
  const void* biases = nullptr;
};
// Bytes of each part of a QMatrix (data, scales, biases) as laid out in memory.
size_t matrix_data_bytes(const QMatrix& w);
size_t matrix_scale_bytes(const QMatrix& w);  // of scales, and again of biases; 0 if dense
// Copies a host matrix into one device allocation (returned in *d_owner, free with gpu_free)
// and returns the view of it.
GpuMatrix upload_matrix(const QMatrix& w, void** d_owner, GpuStream s = nullptr);
// Device bytes upload_matrix_to needs: the three parts, each padded to 256 bytes.
size_t matrix_device_bytes(const QMatrix& w);
// The same into memory the caller provides (matrix_device_bytes(w), 256-byte aligned), e.g. a
// slot of a VRAM expert cache.
GpuMatrix upload_matrix_to(const QMatrix& w, void* d_dst, GpuStream s = nullptr);

// --- products ---------------------------------------------------------------------------------
// Y[t, rows] = W X[t, cols] for t < n (row-major, device). A warp per row streams the row once
// for up to 8 tokens (decode and small batches); larger n runs in blocks of 8 tokens.
void matmul(const GpuMatrix& w, const float* d_x, int64_t n, float* d_y, GpuStream s = nullptr);

// --- element-wise and norms -------------------------------------------------------------------
// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for each of `rows` rows of n (ref::rms_norm);
// x and y may alias. w is one n-vector shared by all rows (q_norm/k_norm over heads too).
void rms_norm(const float* d_x, const float* d_w, int64_t rows, int64_t n, float eps, float* d_y,
              GpuStream s = nullptr);
// x[r] <- x[r] / sqrt(sum(x[r]^2) + eps) * scale for each row (ref::l2_norm_scaled).
void l2_norm_rows(float* d_x, int64_t rows, int64_t n, float eps, float scale, GpuStream s = nullptr);
// y[i] = SiLU(g[i]) * u[i]; y may alias g or u.
void silu_mul(const float* d_g, const float* d_u, int64_t n, float* d_y, GpuStream s = nullptr);
// y[i] += a * x[i]; with d_a non-null, a = *d_a (device scalar, e.g. a router weight).
void axpy(float* d_y, const float* d_x, int64_t n, float a, const float* d_a = nullptr, GpuStream s = nullptr);
// y[i] += sigmoid(*d_gate) * x[i]   (the shared expert's scalar gate, model-spec.md 3.10 step 5-6)
void add_sigmoid_scaled(float* d_y, const float* d_x, const float* d_gate, int64_t n, GpuStream s = nullptr);

// --- router -----------------------------------------------------------------------------------
// For each of n_tok rows of E logits: softmax over all E, the top k (k <= 16, ties to the lower
// index), weights renormalised over the k when `renormalise` (model-spec.md 3.10).
// Writes d_ids[t][k] (descending probability) and d_weights[t][k]. E <= 4096.
void router_topk(const float* d_logits, int64_t n_tok, int E, int k, bool renormalise, int32_t* d_ids,
                 float* d_weights, GpuStream s = nullptr);

// --- attention --------------------------------------------------------------------------------
// NeoX rotate-half RoPE on dims [0, rot_dim) of n_heads heads (head i at x + i * head_stride),
// position pos, frequencies theta^(-2i/rot_dim) computed as the CPU does (model-spec.md 3.2).
void rope_neox(float* d_x, int n_heads, int64_t head_stride, int rot_dim, int64_t pos, float theta,
               GpuStream s = nullptr);
// One query token against a KV cache of n_pos positions (rows of n_kv_heads * head_dim, as
// LayerState::k/v). q: [n_heads][head_dim]; query head j reads kv head j / (n_heads / n_kv_heads);
// softmax(q.k * scale) v; with d_gate non-null out *= sigmoid(gate) (gated attention, 3.2 step 6).
// head_dim a multiple of 32, at most 256.
void attention_decode(const float* d_q, const float* d_k_cache, const float* d_v_cache, int64_t n_pos,
                      int n_heads, int n_kv_heads, int head_dim, float scale, const float* d_gate,
                      float* d_out, GpuStream s = nullptr);

// --- Gated DeltaNet, one token (model-spec.md 3.5 - 3.9) --------------------------------------
// Causal depthwise conv + SiLU for one token: u[c] = SiLU(w[c][K-1] x[c] + sum_j w[c][j] state[j][c]);
// then the state (rows oldest first, [K-1][C]) shifts and takes x. conv_w: [C][K].
void conv1d_silu_step(const float* d_x, const float* d_conv_w, float* d_state, int64_t C, int K, float* d_u,
                      GpuStream s = nullptr);
// The gated delta rule for one token over all value heads (3.6 - 3.7), state S: [hv][dk][dv]:
// beta = sigmoid(b[h]), alpha = exp(-exp(A_log[h]) softplus(a[h] + dt_bias[h]));
// S <- alpha S; delta = beta (v - S^T k); S += k delta^T; o = S^T q, with key head h / (hv / hk).
// q, k: [hk][dk] already L2-normalised (q scaled); v, o: [hv][dv]. dk <= 256.
void delta_rule_step(const float* d_q, const float* d_k, const float* d_v, const float* d_b, const float* d_a,
                     const float* d_A_log, const float* d_dt_bias, float* d_S, int hk, int hv, int dk, int dv,
                     float* d_o, GpuStream s = nullptr);
// o[h] <- w * rmsnorm(o[h]) * SiLU(z[h]) per head of dv (3.9; plain weight w [dv]).
void gated_rms_norm(float* d_o, const float* d_z, const float* d_w, int64_t heads, int64_t dv, float eps,
                    GpuStream s = nullptr);

}  // namespace swiftlet::cuda
