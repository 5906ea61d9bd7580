// The CUDA kernels (issue 8), callable from plain C++: every pointer named d_* or described as
// "device" lives in GPU memory; host code needs no CUDA headers. Each op mirrors a scalar
// reference (kernels/cpu/ops_ref.h, or the loops of model/qwen3_hybrid.cpp) and is tested
// against it in cuda_kernels_test.cpp. Activations are fp32, accumulation fp32.
//
// The sources by operation (src/kernels/cuda/README.md): runtime.cu (memory, streams, graphs),
// matmul.cu (products over T tokens, the prompt's experts, embedding rows), matvec.cu (the decode's
// fused products), moe_experts.cu (the decode's routed experts), router.cu, attention.cu,
// deltanet.cu, norms.cu (norms and element-wise ops), dispatch.cpp (the decode's variant choice).
//
// Errors: a failed CUDA call is a broken invariant here (the caller checked cuda_available()
// first), so it prints the CUDA error with file and line and aborts.
#pragma once

#include "core/qmatrix.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

struct CUstream_st;  // = cudaStream_t's pointee, so a cudaStream_t converts to GpuStream
struct CUevent_st;   // = cudaEvent_t's pointee
struct CUgraphExec_st;  // = cudaGraphExec_t's pointee

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
void* gpu_try_alloc(size_t bytes);  // the same, but null when the device memory is short
void gpu_free(void* d);
void* gpu_alloc_pinned(size_t bytes);  // page-locked host memory (for fast uploads)
void gpu_free_pinned(void* h);
void gpu_upload(void* d_dst, const void* h_src, size_t bytes, GpuStream s = nullptr);  // async on s
void gpu_download(void* h_dst, const void* d_src, size_t bytes, GpuStream s = nullptr);  // synchronous
// Async on s: h_dst must be pinned (gpu_alloc_pinned) to truly overlap; wait with an event.
void gpu_download_async(void* h_dst, const void* d_src, size_t bytes, GpuStream s = nullptr);
void gpu_copy(void* d_dst, const void* d_src, size_t bytes, GpuStream s = nullptr);
void gpu_memset(void* d, int value, size_t bytes, GpuStream s = nullptr);
void gpu_sync(GpuStream s = nullptr);
// Streams and events, for overlapping expert uploads with compute (model/gpu_forward.cpp).
using GpuEvent = ::CUevent_st*;
GpuStream stream_create();  // non-blocking with respect to the default stream
void stream_destroy(GpuStream s);
GpuEvent event_create();  // timing disabled
void event_destroy(GpuEvent e);
void event_record(GpuEvent e, GpuStream s);
void stream_wait(GpuStream s, GpuEvent e);  // later work on s waits for e
void event_sync(GpuEvent e);
GpuEvent event_create_timed();  // timing enabled (profiling)
float event_elapsed_ms(GpuEvent start, GpuEvent end);  // both recorded and complete
// Free and total device memory in bytes (cudaMemGetInfo).
void device_memory(size_t* free_bytes, size_t* total_bytes);

// Milliseconds per call of fn() (which enqueues work on s), timed with CUDA events over
// `iters` calls after one warm-up call.
double gpu_time_ms(const std::function<void()>& fn, int iters, GpuStream s = nullptr);

// A weight matrix in GPU memory: the same layout as QMatrix (core/qmatrix.h), its
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
// Where upload_matrix_to(w, d_base) puts w's parts: data at d_base, then scales and biases,
// each 256-byte aligned. Pure arithmetic (no CUDA call), so a base of 0 gives offsets.
GpuMatrix matrix_layout(const QMatrix& w, const void* d_base);

// out[c] = W[row][c] as fp32 (the embedding lookup; affine: scale * q + bias).
void dequant_row(const GpuMatrix& w, int64_t row, float* d_out, GpuStream s = nullptr);
// *d_i32 = a; *d_i64 = b, in stream order (a decode step's token and position, for graph replay).
void set_step(int32_t* d_i32, int32_t a, int64_t* d_i64, int64_t b, GpuStream s = nullptr);

// CUDA graphs: capture the work enqueued on s between begin and end, replay it with one launch.
using GpuGraph = ::CUgraphExec_st*;
void graph_capture_begin(GpuStream s);
GpuGraph graph_capture_end(GpuStream s);
void graph_launch(GpuGraph g, GpuStream s);
void graph_destroy(GpuGraph g);

// --- products over T tokens (matmul.cu) -------------------------------------------------------
// Y[t, rows] = W X[t, cols] for t < n (row-major, device). A warp per row streams the row once
// for up to 8 tokens; larger n runs as tiles of 8 tokens in the same launch.
void matmul(const GpuMatrix& w, const float* d_x, int64_t n, float* d_y, GpuStream s = nullptr);

// y += W x for one token (the residual add of an output projection).
void matmul_add(const GpuMatrix& w, const float* d_x, float* d_y, GpuStream s = nullptr);
// Y[t] += W X[t] for t < n (a prompt's output projections added into its residual rows).
void matmul_add_rows(const GpuMatrix& w, const float* d_x, int64_t n, float* d_y, GpuStream s = nullptr);

// --- products over T tokens on the tensor cores (gemm.cu) -------------------------------------
// Activation rows go in quantised: each group of `group_size` values of a row scaled by a power
// of two (the largest to [2^21, 2^22)), rounded and split into three signed bytes, with the group's
// power and fp32 sum; the products are integer MMAs of the weights' codes, exact per group, so x's
// rounding (below 2^-22 of its group's largest value) is the only error beyond fp32's.
// Device bytes of `rows` quantised rows of `cols` values (cols a multiple of group_size).
size_t quantized_rows_bytes(int64_t rows, int64_t cols, int group_size);
// d_q = the quantised form of x[rows][cols] (group_size a multiple of 32).
void quantize_rows(const float* d_x, int64_t rows, int64_t cols, int group_size, void* d_q, GpuStream s = nullptr);
// Whether the tensor-core products take w for rows quantised with group_size: affine 4/8-bit with
// that group size (32, 64 or 128), cols a multiple of 128, a GPU of sm_80 or later,
// and not turned off (set_tensor_core_gemm).
bool gemm_takes(const GpuMatrix& w, int group_size);
// For benchmarks and tests: the tensor-core products off (the fp32 kernels of matmul.cu instead).
void set_tensor_core_gemm(bool on);
bool tensor_core_gemm();  // on, and the device can

// Activation rows of a product over tokens: fp32 rows (the matrix's cols wide) and, when q is
// set, the same rows quantised for group size q_group.
struct RowsIn {
  const float* x = nullptr;
  const void* q = nullptr;
  int q_group = 0;
};
// in.q = quantize_rows(x) when the tensor-core products are on and cols fits group_size (the rows
// at d_q, which holds quantized_rows_bytes); otherwise the fp32 rows alone.
RowsIn prepare_rows(const float* d_x, int64_t rows, int64_t cols, int group_size, void* d_q, GpuStream s = nullptr);
// Y[t] (+)= W X[t] for t < n: on the tensor cores where gemm_takes(w, in.q_group) and w has more
// than 256 rows (fewer leave the GPU mostly idle there), else matmul.
void matmul_rows(const GpuMatrix& w, const RowsIn& in, int64_t n, float* d_y, bool add, GpuStream s = nullptr);

// --- decode products (matvec.cu; the routed experts: moe_experts.cu) --------------------------
// One launch for several matrices that read the same input: q/k/v, qkv/z/b/a, router + the
// shared expert's gate logit, an output projection added into the residual stream. Segment i
// computes y_i = W_i x, or y_i += W_i x with `add`. With d_norm_w non-null, x is RMSNorm'd first
// (x / sqrt(mean(x^2) + eps) * norm_w, ref::rms_norm): every block computes it afresh, and block 0
// writes the normed x to d_x_out (required then) for later kernels. Affine 4/8-bit matrices of one
// kind (bits, group size, scale type, cols) run as one launch; anything else runs through
// rms_norm + matmul, segment by segment. Segments with 0 rows are skipped.
constexpr int kMaxSegments = 4;
struct MatvecSegment {
  GpuMatrix w;
  float* d_y = nullptr;
  bool add = false;
  int64_t y_stride = 0;  // fused_matvec_rows: token t's y at d_y + t y_stride
};
void fused_matvec(const MatvecSegment* segs, int n, const float* d_x, const float* d_norm_w, float eps,
                  float* d_x_out, GpuStream s = nullptr);
// fused_matvec for each of `tokens` inputs (token t's x and normed x at t x_stride, its y_i at
// t y_stride_i), equal to that many fused_matvec calls bit for bit, in one launch (a decode
// batch's dense products): on the tensor cores (16-bit scales) up to 8 tokens a block, each weight
// tile read once and multiplied once for them all (the tokens in the MMAs' columns); else the
// one-token kernel with a grid row a token, its blocks shared out among the tokens.
// 1 <= tokens <= 65535.
void fused_matvec_rows(const MatvecSegment* segs, int n, int tokens, const float* d_x, int64_t x_stride,
                       const float* d_norm_w, float eps, float* d_x_out, GpuStream s = nullptr);

// The routed experts of one token, all in one launch per stage. Each chosen expert i lives in a
// slot of device memory whose base is d_table[d_ids[i]] (the layer's row of an expert table); the
// matrices sit at fixed offsets inside every slot: ExpertLayout holds GpuMatrix views whose
// data/scales/biases pointers are byte OFFSETS from the slot base. Affine 4/8-bit only.
struct ExpertLayout {
  GpuMatrix gate, up, down;
};
// Uploads one expert into the slot at d_slot: gate, then up, then down, each as upload_matrix_to
// lays it out (the slot needs the three matrix_device_bytes). Returns their offsets in the slot.
ExpertLayout upload_expert_to(const QMatrix& gate, const QMatrix& up, const QMatrix& down, void* d_slot,
                              GpuStream s = nullptr);
// g[i] = gate_i x, u[i] = up_i x for i < n   (g, u: [n][moe_intermediate])
void expert_gate_up(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, int n, const float* d_x,
                    float* d_g, float* d_u, GpuStream s = nullptr);
// y[i] = down_i act[i]   (act: [n][moe_intermediate], y: [n][hidden])
void expert_down(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, int n, const float* d_act,
                 float* d_y, GpuStream s = nullptr);
// A prompt's routed experts as work for the products below: the T x k (token, choice) pairs,
// numbered p = t * k + j, grouped by the expert they chose. Group g is expert d_expert[g] with the
// pairs d_pairs[d_start[g] .. d_start[g + 1]) (device arrays; d_start has groups + 1 entries).
// Each expert's weights are streamed once per 8 of its pairs.
struct ExpertBatch {
  const int32_t* d_expert = nullptr;
  const int32_t* d_start = nullptr;
  const int32_t* d_pairs = nullptr;
  int groups = 0;
  int64_t pairs = 0;  // d_start[groups]
  int k = 0;          // choices per token: pair p reads input row p / k
};
// g[p] = gate_e x[p / k], u[p] = up_e x[p / k] for every pair p of every group (expert e's slot base
// is d_table[e]; offsets as ExpertLayout). x: [T][hidden]; g, u: [T k][moe_intermediate].
void expert_gate_up_pairs(const ExpertLayout& l, const void* const* d_table, const ExpertBatch& b, const float* d_x,
                          float* d_g, float* d_u, GpuStream s = nullptr);
// y[p] = down_e act[p] for every pair. act: [T k][moe_intermediate]; y: [T k][hidden].
void expert_down_pairs(const ExpertLayout& l, const void* const* d_table, const ExpertBatch& b, const float* d_act,
                       float* d_y, GpuStream s = nullptr);
// The same from prepared rows (RowsIn, gemm.cu): on the tensor cores where the expert matrices
// take them (gemm_takes), else as above. x: T rows; act: T k rows.
void expert_gate_up_pairs(const ExpertLayout& l, const void* const* d_table, const ExpertBatch& b, const RowsIn& x,
                          float* d_g, float* d_u, GpuStream s = nullptr);
void expert_down_pairs(const ExpertLayout& l, const void* const* d_table, const ExpertBatch& b, const RowsIn& act,
                       float* d_y, GpuStream s = nullptr);
// For each of T tokens: h[t] += sigmoid(gate[t]) shared[t] + sum_j w[t][j] y[t k + j] (a prompt's
// MoE output: the gated shared expert and the routed experts' weighted sum, summed in j order).
void moe_finish_rows(float* d_h, const float* d_shared, const float* d_gate, const float* d_y, const float* d_w,
                     int64_t T, int k, int64_t H, GpuStream s = nullptr);
// out[t] = W[rows[t]] as fp32 for t < n (a prompt's embedding lookup; rows on the device).
void dequant_rows(const GpuMatrix& w, const int32_t* d_rows, int64_t n, float* d_out, GpuStream s = nullptr);

// Launch settings of the fused kernels, for benchmarks: Programmatic Dependent Launch (sm_90+ only;
// on by default there: a kernel starts during its predecessor's tail and prefetches its weights
// into the L2 before waiting for the predecessor's results), and blocks per SM of the products
// (0: by register use). Not thread-safe; set before launching.
void set_fused_launch(bool pdl, int blocks_per_sm);
#ifdef SWIFTLET_GPU_PROBE
// Phase timestamps of the decode kernels (matvec.cu; a development build, -DSWIFTLET_GPU_PROBE=ON):
// probe_begin() arms them, probe_end() synchronises, disarms and reports, per probed kernel and
// mark, when its blocks passed the mark.
void probe_begin();
std::string probe_end();
#endif
// The streamed products (sm_90+, on there; tests and benchmarks turn them off to compare):
// fused_matvec, expert_act(_routed) and expert_down_add bring each block's weight rows into shared
// memory by bulk copies (TMA) kept in flight ahead of the arithmetic, the first ones before the
// PDL wait. Shapes they cannot take (unaligned scales, rows too long for two stages) use the
// kernels above. Expert slot bases in the table must be 16-byte aligned. warps: per block of
// fused_matvec and expert_act, 16 (default) or 8. Not thread-safe.
void set_streamed_products(bool on, int warps = 16);
bool streamed_products();  // on, and the device can
// The streamed products' arithmetic on the tensor cores (on with them): integer MMAs of the
// weights' codes with x split into three 8-bit digits per group of 64 (exact sums; x rounded to
// 2^-22 of its group's largest value). fused_matvec, expert_act(_routed) and expert_down_add, for
// 4/8-bit weights in groups of 64 and rows of at most 4096 columns; other shapes keep the
// streamed kernels. Not thread-safe.
void set_tensor_core_products(bool on);
bool tensor_core_products();  // on, with the streamed products
// Asks the driver once for what the fused kernels' launches need (occupancy, device facts), so no
// query happens later inside a CUDA graph capture. Idempotent.
void prepare_fused_kernels();

// The shared expert as one more, always chosen expert of the fused expert kernels: its matrices at
// device addresses, its output weighed by sigmoid(*d_gate_logit) (3.10 steps 5-6).
struct SharedExpert {
  GpuMatrix gate, up, down;
  const float* d_gate_logit = nullptr;
};
// True when expert_act / expert_down_add take these matrices (affine 4/8-bit, gate and up of one
// kind, the shared expert of the routed experts' shapes and kinds, n + 1 <= 17, inputs that fit in
// shared memory).
bool experts_fusable(const ExpertLayout& l, int n, const SharedExpert* sh);
// act[i] = SiLU(gate_i x) * up_i x for the n chosen experts (slots through the table) and, with
// sh, act[n] for the shared expert; one launch. act: [n (+1)][moe_intermediate]
void expert_act(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, int n,
                const SharedExpert* sh, const float* d_x, float* d_act, GpuStream s = nullptr);
// expert_act with the routing folded in (decode with every expert resident): each block takes the
// top k of the router's E logits itself, in one warp while the others stage x (as router_topk:
// softmax, ties to the lower index, renormalised when asked; the weights may differ in the last
// bits, the softmax sum running in another order), and block 0 writes them to d_ids / d_w for
// expert_down_add, so the top-k needs no launch of its own. Needs expert_act_routes(E, k)
// (E <= 512, k <= 16).
bool expert_act_routes(int E, int k);
void expert_act_routed(const ExpertLayout& l, const void* const* d_table, const float* d_logits, int E, int k,
                       bool renormalise, const SharedExpert* sh, const float* d_x, int32_t* d_ids, float* d_w,
                       float* d_act, GpuStream s = nullptr);
// h[d] += sum_i w[i] (down_i act[i])[d] (+ sigmoid(*sh->d_gate_logit) (down_sh act[n])[d]), one launch:
// a warp owns output rows and sums over the experts itself (deterministic, no atomics). ids_early:
// the ids were complete one kernel before the previous one (router_topk, then expert_act), so the
// kernel prefetches its rows into the L2 before waiting for expert_act; false after
// expert_act_routed, which writes them.
void expert_down_add(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, const float* d_w,
                     int n, const SharedExpert* sh, const float* d_act, float* d_h, GpuStream s = nullptr,
                     bool ids_early = true);
// The two above for each of `tokens` tokens (a decode batch with every expert resident), equal to
// that many calls, in one launch each: the one-token kernels with a grid row a token (as
// fused_matvec_rows). Token t's arrays are rows of contiguous ones: logits [t][E], x [t][H], ids and
// w [t][k] (n for the down), act [t][k + 1][I] (k + 1 with sh, else k), h [t][H], and the shared
// expert's gate logit sh->d_gate_logit[t]. 1 <= tokens <= 65535.
void expert_act_routed_rows(const ExpertLayout& l, const void* const* d_table, const float* d_logits, int E, int k,
                            bool renormalise, const SharedExpert* sh, const float* d_x, int tokens, int32_t* d_ids,
                            float* d_w, float* d_act, GpuStream s = nullptr);
void expert_down_add_rows(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, const float* d_w,
                          int n, const SharedExpert* sh, const float* d_act, int tokens, float* d_h,
                          GpuStream s = nullptr, bool ids_early = true);
// h += add; y = rmsnorm(h) * w, one row of n (the residual add fused into the next block's norm).
void add_rms_norm(float* d_h, const float* d_add, const float* d_w, int64_t n, float eps, float* d_y,
                  GpuStream s = nullptr);
// The DeltaNet's q and k (2 hk rows of n, q first) L2-normalised, q also scaled (3.5), one launch.
void l2_norm_qk(float* d_x, int hk, int64_t n, float eps, float q_scale, GpuStream s = nullptr);
// out[d] += sum_i w[i] y[i][d] for i < n (the weighted sum of the routed experts, 3.10 step 4).
void moe_combine(float* d_out, const float* d_y, const float* d_w, int n, int64_t H, GpuStream s = nullptr);

// --- element-wise and norms (norms.cu) ---------------------------------------------------------
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
// y[i] += sigmoid(*d_gate) * x[i]   (the shared expert's scalar gate, model-math.md 6.3)
void add_sigmoid_scaled(float* d_y, const float* d_x, const float* d_gate, int64_t n, GpuStream s = nullptr);

// --- router (router.cu) --------------------------------------------------------------------------
// For each of n_tok rows of E logits: softmax over all E, the top k (k <= 16, ties to the lower
// index), weights renormalised over the k when `renormalise` (model-math.md 6). A bitonic sort
// in shared memory.
// Writes d_ids[t][k] (descending probability) and d_weights[t][k]. E <= 4096.
void router_topk(const float* d_logits, int64_t n_tok, int E, int k, bool renormalise, int32_t* d_ids,
                 float* d_weights, GpuStream s = nullptr);

// --- a token mixer's layer as the kernels take it ---------------------------------------------
// A gated-attention layer (model-math.md 3.2): the q/k RMSNorm weights [hd] on the device, nh query
// heads and nkv KV heads of hd, RoPE on the first rot_dim dims with base theta, the norms' eps and
// the scores' scale; gated: each head's rows of q_proj are [query | gate].
struct AttentionSpec {
  const float* d_q_norm = nullptr;
  const float* d_k_norm = nullptr;
  int nh = 0, nkv = 0, hd = 0, rot_dim = 0;
  bool gated = false;
  float theta = 0, eps = 0, scale = 0;
};
// A Gated DeltaNet layer (model-math.md 5): the conv's weights [conv_dim][K], A_log and dt_bias
// [hv] and the gated norm's weight [dv] on the device; hk key heads of dk, hv value heads of dv, K
// conv taps; the q/k L2 norms' l2_eps and q's scale, the gated RMSNorm's eps.
struct DeltaNetSpec {
  const float* d_conv_w = nullptr;
  const float* d_A_log = nullptr;
  const float* d_dt_bias = nullptr;
  const float* d_norm_w = nullptr;
  int hk = 0, hv = 0, dk = 0, dv = 0, K = 0;
  float l2_eps = 0, q_scale = 0, eps = 0;
  int64_t key_dim() const { return int64_t(hk) * dk; }
  int64_t value_dim() const { return int64_t(hv) * dv; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};
// Rows of an attention layer's projections: row t of q_proj's output P, of k_proj's Kp and of
// v_proj's Vp at t times each stride (floats; one row: the strides are not read).
struct QkvRows {
  const float* P = nullptr;
  int64_t p_stride = 0;
  const float* Kp = nullptr;
  int64_t k_stride = 0;
  const float* Vp = nullptr;
  int64_t v_stride = 0;
};
// A decode step of n rows, each one token of its own sequence: row i at position d_pos[i], its
// mixer's states at d_states[2 i] and d_states[2 i + 1] (the K and V caches, or the DeltaNet's conv
// state and S), device arrays read on the device; h_states: the same table on the host, for the
// forms that go row by row.
struct StepRows {
  int64_t n = 1;
  const int64_t* d_pos = nullptr;
  float* const* d_states = nullptr;
  float* const* h_states = nullptr;
};

// --- attention (attention.cu) ----------------------------------------------------------------
// NeoX rotate-half RoPE on dims [0, rot_dim) of n_heads heads (head i at x + i * head_stride),
// position pos, frequencies theta^(-2i/rot_dim) computed as the CPU does (model-math.md 4).
void rope_neox(float* d_x, int n_heads, int64_t head_stride, int rot_dim, int64_t pos, float theta,
               GpuStream s = nullptr);
// The per-token part of gated attention before the scores (3.2 steps 1-4), one kernel:
// P = q_proj x holds per head [query (hd) | gate (hd)] when gated, else [query]; query heads are
// RMSNorm'd with q_norm and roped into q [nh][hd], the gates copied to gate [nh][hd]; keys
// (Kp [nkv][hd]) RMSNorm'd with k_norm and roped, then written with the values (Vp) into row
// `pos` of the KV caches ([positions][nkv * hd]). With d_pos non-null, pos = *d_pos (read on the
// device: graph replay). hd <= 1024, even rot_dim <= hd.
void attn_prep(const float* d_P, const float* d_Kp, const float* d_Vp, const float* d_q_norm, const float* d_k_norm,
               int nh, int nkv, int hd, bool gated, int rot_dim, int64_t pos, const int64_t* d_pos, float theta,
               float eps, float* d_q, float* d_gate, float* d_k_cache, float* d_v_cache, GpuStream s = nullptr);
// attn_prep then attention_decode_at (n_pos = pos + 1, gate from P where gated) in one launch, a
// block per query head: out [nh * hd]; writes the caches' row pos as attn_prep. hd <= 256. *d_pos
// is read before the PDL wait: the previous launch on s must not write it.
void attention_step(const AttentionSpec& a, const QkvRows& in, int64_t pos, const int64_t* d_pos, float* d_k_cache,
                    float* d_v_cache, float* d_out, GpuStream s = nullptr);
// attention_step for the rows of a decode step in one launch: row i's inputs at i times in's
// strides, its output at d_out + i out_stride, its position and caches from `rows`.
void attention_step_rows(const AttentionSpec& a, const QkvRows& in, const StepRows& rows, float* d_out,
                         int64_t out_stride, GpuStream s = nullptr);
// One query token against a KV cache of n_pos positions (rows of n_kv_heads * head_dim, as
// LayerState::k/v). q: [n_heads][head_dim]; query head j reads kv head j / (n_heads / n_kv_heads);
// softmax(q.k * scale) v; with d_gate non-null out *= sigmoid(gate) (gated attention, 3.2 step 6).
// head_dim at most 256.
void attention_decode(const float* d_q, const float* d_k_cache, const float* d_v_cache, int64_t n_pos,
                      int n_heads, int n_kv_heads, int head_dim, float scale, const float* d_gate,
                      float* d_out, GpuStream s = nullptr);
// The same with n_pos = *d_pos + 1 read on the device when d_pos is non-null (graph replay).
void attention_decode_at(const float* d_q, const float* d_k_cache, const float* d_v_cache, int64_t n_pos,
                         const int64_t* d_pos, int n_heads, int n_kv_heads, int head_dim, float scale,
                         const float* d_gate, float* d_out, GpuStream s = nullptr);

// --- Gated DeltaNet, one token (deltanet.cu; model-math.md 5.2-5.6) --------------------------
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
// delta_rule_step then gated_rms_norm (norm weight w [dv]) in one launch, one block per value head
// (dv <= 128, dk <= 256; otherwise the two kernels run).
void delta_rule_norm_step(const float* d_q, const float* d_k, const float* d_v, const float* d_b, const float* d_a,
                          const float* d_A_log, const float* d_dt_bias, float* d_S, const float* d_z,
                          const float* d_norm_w, float eps, int hk, int hv, int dk, int dv, float* d_o,
                          GpuStream s = nullptr);
// A token's DeltaNet inputs for deltanet_step, its projections in the split layout (both
// families: model-math.md 5.1): x = [q | k | v] (conv_dim), z [value_dim], b and a [hv]; rows of
// them for deltanet_step_rows.
struct DeltaNetIn {
  const float* x;
  const float* z;
  const float* b;
  const float* a;
};
// The conv + SiLU, the q/k L2 norms (l2_eps, q scaled by q_scale; as conv1d_silu_step +
// l2_norm_qk), then delta_rule_norm_step (gated RMSNorm with eps) in one launch,
// without the u, z, b, a buffers: the hv / hk value heads of a key head run as one thread-block
// cluster. Needs sm_90, hv / hk <= 8, dk <= 256, dv <= 128; returns false (nothing launched)
// otherwise. state_early: the previous launch on s does not write d_S and waits for its own
// predecessor (a decode layer's projection qualifies; another step on the same state does not), so
// the state loads may start while it finishes.
bool deltanet_step(const DeltaNetSpec& d, const DeltaNetIn& in, float* d_conv_state, float* d_S, float* d_o,
                   GpuStream s = nullptr, bool state_early = false);
// deltanet_step for the rows of a decode step in one launch: row i's inputs at in.x + i conv_dim,
// in.z + i value_dim, in.b and in.a + i hv, its output at d_o + i value_dim, its conv state and S
// from rows.d_states (rows.d_pos is not read). The previous launch must not write the states (they
// are loaded before its end, as state_early). False (nothing launched) where deltanet_step does not
// apply.
bool deltanet_step_rows(const DeltaNetSpec& d, const DeltaNetIn& in, const StepRows& rows, float* d_o,
                        GpuStream s = nullptr);
// o[h] <- w * rmsnorm(o[h]) * SiLU(z[h]) per head of dv (3.9; plain weight w [dv]).
void gated_rms_norm(float* d_o, const float* d_z, const float* d_w, int64_t heads, int64_t dv, float eps,
                    GpuStream s = nullptr);

// --- a decode step, the kernels chosen by device and shape (dispatch.cpp) ----------------------
// What the DeltaNet decode needs where deltanet_step does not apply: u [conv_dim].
struct DeltaNetScratch {
  float* u = nullptr;
};
// A decode step's DeltaNet after its projections, arguments as deltanet_step_rows: that one launch
// where it applies, else row by row conv1d_silu_step + l2_norm_qk and delta_rule_norm_step through
// the scratch, on the states rows.h_states names.
void deltanet_decode(const DeltaNetSpec& d, const DeltaNetIn& in, const StepRows& rows, const DeltaNetScratch& scratch,
                     float* d_o, GpuStream s = nullptr);
// The routed experts' buffers: act [n + 1][I] (the activations, the shared expert's last), and
// where the fused kernels do not apply, up [n][I] and y [n][H].
struct ExpertScratch {
  float *act = nullptr, *up = nullptr, *y = nullptr;
};
// act = SiLU(gate x) * up x for the n chosen experts (and, with sh, the shared one): expert_act
// where experts_fusable, else expert_gate_up + silu_mul (sh must be null then).
void experts_act(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, int n,
                 const SharedExpert* sh, const float* d_x, const ExpertScratch& scratch, GpuStream s = nullptr);
// h += sum_i w[i] down_i act[i] (+ the gated shared expert with sh): expert_down_add, else
// expert_down + moe_combine. ids_early as expert_down_add.
void experts_down_add(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, const float* d_w,
                      int n, const SharedExpert* sh, const ExpertScratch& scratch, float* d_h, GpuStream s = nullptr,
                      bool ids_early = true);
// A layer's routed experts as a decode step takes them: the slots' layout, the layer's row of the
// expert table (device), E experts of which the router picks k, the weights renormalised over the
// k or not.
struct RoutedExperts {
  ExpertLayout layout;
  const void* const* d_table = nullptr;
  int E = 0, k = 0;
  bool renormalise = false;
};
// Decode with every expert resident, for each of `tokens` tokens: the top k of its E router logits
// (d_logits [t][E]) into d_ids / d_w [t][k] (router_topk), then experts_act on its x [t][H], act
// [t][k + 1][I] with sh (its gate logit sh->d_gate_logit[t]), else [t][k][I]. One launch where the
// top-k runs inside the act kernel (routes_in_act: the shared expert fused, expert_act_routes),
// else token by token with router_topk first.
bool routes_in_act(const RoutedExperts& ex, const SharedExpert* sh);
void route_experts_act(const RoutedExperts& ex, const float* d_logits, const SharedExpert* sh, const float* d_x,
                       int tokens, int32_t* d_ids, float* d_w, const ExpertScratch& scratch, GpuStream s = nullptr);
// The down half after route_experts_act (the same experts, sh and tokens): h [t][H] += the experts'
// weighted sum (and the gated shared expert).
void routed_experts_down_add(const RoutedExperts& ex, const int32_t* d_ids, const float* d_w, const SharedExpert* sh,
                             const ExpertScratch& scratch, int tokens, float* d_h, GpuStream s = nullptr);


// --- prompts: T tokens per launch (attention.cu, deltanet.cu, norms.cu) ------------------------
// A GPU prefill runs all T tokens of a prompt chunk through a layer at once. Each op below equals T
// calls of its one-token form in token order (state included), in one launch each (the conv:
// two). Buffers are row-major [T][...]; an input that is columns of a wider row takes that row's
// stride in floats
// (at least its own width). Ops with a block per token (gridDim.y = T) take T <= 65535.

// T tokens of conv1d_silu_step: x row t at d_x + t * x_stride, u row t at d_u + t * u_stride; the
// state [K-1][C] advances exactly as T calls would. The tokens run in parallel (each output reads
// its K-1 predecessors, from x or the state); a second launch moves the state on.
void conv1d_silu_scan(const float* d_x, int64_t x_stride, const float* d_conv_w, float* d_state, int64_t C, int K,
                      int64_t T, float* d_u, int64_t u_stride, GpuStream s = nullptr);
// l2_norm_qk on each of T rows: 2 hk heads of n at d_x + t * row_stride (q heads then k heads; q
// also scaled by q_scale), one launch.
void l2_norm_qk_rows(float* d_x, int64_t T, int64_t row_stride, int hk, int64_t n, float eps, float q_scale,
                     GpuStream s = nullptr);
// T tokens of delta_rule_step in order, one launch: q, k, v of token t at d_q / d_k / d_v +
// t * qkv_stride (e.g. the columns of u rows), b and a at d_b / d_a + t * ba_stride; o: [T][hv * dv].
// The state stays in registers across the tokens and is written back to S once. dk <= 256.
void delta_rule_scan(const float* d_q, const float* d_k, const float* d_v, int64_t qkv_stride, const float* d_b,
                     const float* d_a, int64_t ba_stride, const float* d_A_log, const float* d_dt_bias, float* d_S,
                     int hk, int hv, int dk, int dv, int64_t T, float* d_o, GpuStream s = nullptr);
// The same in chunks of 64 tokens (the WY / UT form, model-math.md 5.5): equal to the scan up to
// float rounding, the chunks' state-free work in one launch over all of them, then the state
// carried through them in a second. Needs delta_rule_chunked_takes (dk <= 128 and a multiple of
// 4, dv a multiple of 32) and a device work buffer of delta_rule_chunked_work_floats floats.
bool delta_rule_chunked_takes(int dk, int dv);
int64_t delta_rule_chunked_work_floats(int64_t T, int hv, int dk, int dv);
void delta_rule_chunked(const float* d_q, const float* d_k, const float* d_v, int64_t qkv_stride, const float* d_b,
                        const float* d_a, int64_t ba_stride, const float* d_A_log, const float* d_dt_bias, float* d_S,
                        int hk, int hv, int dk, int dv, int64_t T, float* d_work, float* d_o, GpuStream s = nullptr);
// The layer d's delta rule over T tokens: delta_rule_scan (or, from 16 tokens where it applies and
// d_work holds delta_rule_chunked_work_floats(T, ...) floats, delta_rule_chunked) then
// gated_rms_norm over the T hv heads. Row t of u is [q | k | v] (the conv's output, q and k
// L2-normed) at t u_stride, b and a at t ba_stride; z: [T][value_dim]; o: [T][value_dim].
void delta_rule_norm_scan(const DeltaNetSpec& d, const float* d_u, int64_t u_stride, const float* d_b, const float* d_a,
                          int64_t ba_stride, float* d_S, const float* d_z, int64_t T, float* d_o,
                          float* d_work = nullptr, GpuStream s = nullptr);
// attn_prep for T tokens at positions pos0 .. pos0 + T - 1, one launch (blocks: heads x tokens):
// in's rows at their strides; q and gate (gated: required) [T][nh * hd]; writes KV cache rows
// pos0 + t.
void attn_prep_rows(const AttentionSpec& a, const QkvRows& in, int64_t pos0, int64_t T, float* d_q, float* d_gate,
                    float* d_k_cache, float* d_v_cache, GpuStream s = nullptr);
// Causal attention for T query tokens at positions pos0 + t (q, gate (read where a.gated), out:
// [T][nh * hd]): query t as attention_decode against cache positions 0 .. pos0 + t, so the caches
// must hold those rows (attn_prep_rows first). One launch; from 16 tokens a block takes 64 queries
// of a head and streams the cache through shared memory in tiles (flash-attention style), below
// that a block per (head, token). hd <= 256.
void attention_prefill(const AttentionSpec& a, const float* d_q, const float* d_gate, const float* d_k_cache,
                       const float* d_v_cache, int64_t pos0, int64_t T, float* d_out, GpuStream s = nullptr);

}  // namespace swiftlet::cuda
