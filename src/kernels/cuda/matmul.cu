// Matrix-vector / small matrix-matrix products on affine 4/8-bit (MLX, model-math.md 8) and
// dense F32/F16/BF16 weights, fp32 activations and accumulation.
//
// Decode is memory bound: one warp owns one weight row and streams it in 16-byte loads
// (coalesced: the warp reads 512 contiguous bytes per step), dequantises in registers and dots
// it with up to 8 activation rows at once (staged in shared memory for the quantised formats),
// so the weights are read once per 8 tokens. Larger
// batches run as tiles of 8 tokens in one launch, and a prompt's routed experts per expert over
// the tokens routed to it (pairs_affine_kernel): the fp32 forms of gemm.cu's tensor-core products,
// for the matrices those do not take.
// Also here: rows of a weight matrix as fp32 (dequant_row(s): the embedding lookup).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_fp16.h>

namespace swiftlet::cuda {

using namespace detail;  // cuda_common.cuh's helpers

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;
constexpr int kMaxTokens = 8;

// q as float without an int->float conversion: 2^23 + q has q in its mantissa (q < 2^23).
__device__ __forceinline__ float small_uint_to_float(uint32_t q) {
  return __uint_as_float(0x4B000000u | q) - 8388608.0f;
}

// Columns of X staged in shared memory per step: fewer tokens, wider tiles (<= 37 KB).
template <int NT>
__host__ __device__ constexpr int affine_tile() { return NT <= 4 ? 2048 : 1024; }
// Shared-memory layout of a staged X row: 4 floats of padding after every 32, so the lanes'
// 16-byte reads of their own 32 (4-bit) or 16 (8-bit) values hit distinct banks.
__device__ __forceinline__ int padded(int i) { return i + (i >> 5) * 4; }
template <int NT>
__host__ __device__ constexpr int affine_smem_bytes() { return NT * (affine_tile<NT>() / 32) * 36 * 4; }

// Where the token rows of one product live: x(t) is token t's input row, y(t) its output row.
// Contiguous rows (a dense projection over a tile of tokens):
struct DenseRows {
  const float* x;
  float* y;
  int64_t x_stride, y_stride;
  __device__ const float* xrow(int t) const { return x + t * x_stride; }
  __device__ float* yrow(int t) const { return y + t * y_stride; }
};
// Rows gathered through pair indices p (a prompt's routed experts: p = token * k + slot): input
// row p / x_div, output row p.
struct PairRows {
  const float* x;
  float* y;
  int64_t x_stride, y_stride;
  int x_div;
  const int32_t* pairs;
  __device__ const float* xrow(int t) const { return x + int64_t(pairs[t] / x_div) * x_stride; }
  __device__ float* yrow(int t) const { return y + int64_t(pairs[t]) * y_stride; }
};

// Y[t][r] = sum_c W[r][c] X[t][c] for t < nt <= NT. Each warp owns RW consecutive rows (a block
// 8 RW); the block first stages a tile of X's columns in shared memory (reading X straight from
// global memory with each lane at a 128-byte stride made L1 wavefronts, not HBM, the limit), and
// each staged x value read serves RW rows. Tokens past nt are staged as zeros and not written.
template <int NT>
__host__ __device__ constexpr int rows_per_warp() { return NT >= 4 ? 2 : 1; }  // batches: 2 rows a warp

template <int BITS, int NT, typename Rows>
__device__ __forceinline__ void affine_matvec_body(const uint32_t* __restrict__ w, const void* __restrict__ scales,
                                                   const void* __restrict__ biases, int st, int64_t rows,
                                                   int64_t cols, int gs, const Rows& io, int nt,
                                                   bool add = false) {
  constexpr int RW = rows_per_warp<NT>();
  constexpr int kPerWord = 32 / BITS;
  constexpr int kPerChunk = 4 * kPerWord;  // elements in one 16-byte load
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  constexpr int kTile = affine_tile<NT>();
  constexpr int kTokStride = (kTile / 32) * 36;
  extern __shared__ float4 xs_raw[];
  float* xs = reinterpret_cast<float*>(xs_raw);
  const int lane = threadIdx.x & 31;
  const int64_t r0 = (int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5)) * RW;
  const bool active = r0 < rows;  // no early return: every thread takes part in the staging

  const uint4* row[RW];
  bool valid[RW];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    valid[i] = r0 + i < rows;
    row[i] = reinterpret_cast<const uint4*>(w + (valid[i] ? r0 + i : 0) * (cols / kPerWord));
  }
  const int64_t groups = cols / gs;
  float acc[RW][NT];
#pragma unroll
  for (int i = 0; i < RW; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[i][t] = 0.0f;

  for (int64_t base = 0; base < cols; base += kTile) {
    const int tile = int(cols - base < kTile ? cols - base : kTile);
    __syncthreads();  // the previous tile is consumed
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float* xt = t < nt ? io.xrow(t) + base : nullptr;
      for (int i = threadIdx.x; i < tile; i += kThreads) xs[t * kTokStride + padded(i)] = xt ? __ldg(xt + i) : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    const int chunks = tile / kPerChunk;
#pragma unroll 2
    for (int ch = lane; ch < chunks; ch += 32) {
      const int e0 = ch * kPerChunk;  // column within the tile
      float wv[RW][kPerChunk];
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        const uint4 pk = valid[i] ? __ldg(row[i] + base / kPerChunk + ch) : make_uint4(0, 0, 0, 0);
        const int64_t gi = (valid[i] ? r0 + i : 0) * groups + (base + e0) / gs;  // a chunk never straddles groups
        const float sc = load_scale(scales, gi, st);
        const float bi = load_scale(biases, gi, st);
        const uint32_t words[4] = {pk.x, pk.y, pk.z, pk.w};
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
          for (int e = 0; e < kPerWord; ++e)
            wv[i][k * kPerWord + e] = fmaf(sc, small_uint_to_float((words[k] >> (BITS * e)) & kMask), bi);
      }
      const int sp = padded(e0);  // the chunk's values are contiguous there (kPerChunk <= 32)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* xv = reinterpret_cast<const float4*>(xs + t * kTokStride + sp);
        float a[RW];
#pragma unroll
        for (int i = 0; i < RW; ++i) a[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < kPerChunk / 4; ++j) {
          const float4 v = xv[j];
#pragma unroll
          for (int i = 0; i < RW; ++i) {
            a[i] = fmaf(wv[i][4 * j], v.x, a[i]);
            a[i] = fmaf(wv[i][4 * j + 1], v.y, a[i]);
            a[i] = fmaf(wv[i][4 * j + 2], v.z, a[i]);
            a[i] = fmaf(wv[i][4 * j + 3], v.w, a[i]);
          }
        }
#pragma unroll
        for (int i = 0; i < RW; ++i) acc[i][t] += a[i];
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int i = 0; i < RW; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float v = warp_sum(acc[i][t]);
      if (lane == 0 && t < nt && valid[i]) {
        float* yp = io.yrow(t) + r0 + i;
        *yp = add ? *yp + v : v;
      }
    }
}

// One launch for a whole batch: blockIdx.y picks the tile of NT tokens (the last may be short).
template <int BITS, int NT>
__global__ void __launch_bounds__(kThreads) affine_matvec_kernel(const uint32_t* __restrict__ w,
                                                                 const void* __restrict__ scales,
                                                                 const void* __restrict__ biases, int st,
                                                                 int64_t rows, int64_t cols, int gs,
                                                                 const float* __restrict__ x,
                                                                 float* __restrict__ y, int64_t n, bool add) {
  const int64_t t0 = int64_t(blockIdx.y) * NT;
  const int nt = int(n - t0 < NT ? n - t0 : NT);
  const DenseRows io{x + t0 * cols, y + t0 * rows, cols, rows};
  affine_matvec_body<BITS, NT>(w, scales, biases, st, rows, cols, gs, io, nt, add);
}

// The routed experts of one token in one launch: blockIdx.y picks the i-th chosen expert, whose
// slot base comes from the layer's table (table[ids[i]]); blockIdx.z picks matrix a or b (gate
// and up share the input, so both run in one launch). x advances by x_stride per expert (0: one
// input for all), y by rows per expert.
template <int BITS>
__global__ void __launch_bounds__(kThreads) grouped_affine_kernel(const void* const* __restrict__ table,
                                                                  const int32_t* __restrict__ ids, AffineOffsets a,
                                                                  AffineOffsets b, int st, int64_t rows,
                                                                  int64_t cols, int gs, const float* __restrict__ x,
                                                                  int64_t x_stride, float* __restrict__ ya,
                                                                  float* __restrict__ yb) {
  const int i = blockIdx.y;
  const SlotMatrix m = slot_matrix(table[ids[i]], a, b, ya, yb);
  const DenseRows io{x + int64_t(i) * x_stride, m.y + int64_t(i) * rows, 0, 0};
  affine_matvec_body<BITS, 1>(reinterpret_cast<const uint32_t*>(m.data), m.scales, m.biases, st, rows, cols, gs, io, 1);
}

// A prompt's routed experts in one launch: blockIdx.y picks a group (one expert and the pairs
// routed to it, ExpertBatch), blockIdx.z matrix a or b; the block streams its rows once per tile
// of NT pairs. Input row of pair p: x + (p / x_div) x_stride; output row: y + p rows.
template <int BITS, int NT>
__global__ void __launch_bounds__(kThreads) pairs_affine_kernel(const void* const* __restrict__ table,
                                                                const int32_t* __restrict__ group_expert,
                                                                const int32_t* __restrict__ group_start,
                                                                const int32_t* __restrict__ pairs, AffineOffsets a,
                                                                AffineOffsets b, int st, int64_t rows, int64_t cols,
                                                                int gs, const float* __restrict__ x, int64_t x_stride,
                                                                int x_div, float* __restrict__ ya,
                                                                float* __restrict__ yb) {
  const int g = blockIdx.y;
  const SlotMatrix m = slot_matrix(table[group_expert[g]], a, b, ya, yb);
  const int end = group_start[g + 1];
  for (int p0 = group_start[g]; p0 < end; p0 += NT) {  // block-uniform
    const PairRows io{x, m.y, x_stride, rows, x_div, pairs + p0};
    affine_matvec_body<BITS, NT>(reinterpret_cast<const uint32_t*>(m.data), m.scales, m.biases, st, rows, cols, gs, io,
                                 end - p0 < NT ? end - p0 : NT);
  }
}

template <typename T>
__device__ __forceinline__ float elem_to_float(T v);
template <>
__device__ __forceinline__ float elem_to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float elem_to_float<uint16_t>(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }
template <>
__device__ __forceinline__ float elem_to_float<__half>(__half v) { return __half2float(v); }

// Dense rows (F32, BF16 as uint16_t bits, F16). VEC: 16-byte loads (needs cols * sizeof(T) % 16
// == 0 so every row starts aligned); otherwise one element per lane per step.
template <typename T, bool VEC, int NT>
__global__ void __launch_bounds__(kThreads) dense_matvec_kernel(const T* __restrict__ w, int64_t rows, int64_t cols,
                                                                const float* __restrict__ x,
                                                                float* __restrict__ y, int64_t n, bool add) {
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int64_t t0 = int64_t(blockIdx.y) * NT;  // this block's tile of NT tokens (the last may be short)
  const int nt = int(n - t0 < NT ? n - t0 : NT);
  x += t0 * cols;
  y += t0 * rows;
  const T* row = w + r * cols;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  if constexpr (VEC) {
    constexpr int kPer = 16 / sizeof(T);
    const int64_t chunks = cols / kPer;
#pragma unroll 2
    for (int64_t ch = lane; ch < chunks; ch += 32) {
      union {
        uint4 u;
        T e[kPer];
      } pk;
      pk.u = __ldg(reinterpret_cast<const uint4*>(row) + ch);
      float wv[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) wv[j] = elem_to_float<T>(pk.e[j]);
      const int64_t c0 = ch * kPer;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float* xt = x + (t < nt ? t : 0) * cols + c0;  // past nt: token 0 again, not written
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < kPer; ++j) a = fmaf(wv[j], __ldg(xt + j), a);
        acc[t] += a;
      }
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      const float wv = elem_to_float<T>(row[c]);
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[t] = fmaf(wv, __ldg(x + (t < nt ? t : 0) * cols + c), acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0 && t < nt) y[t * rows + r] = add ? y[t * rows + r] + v : v;
  }
}


// Launches cover n tokens in tiles of NT (grid.y); n <= 65535 NT.
template <typename T, int NT>
void launch_dense(const GpuMatrix& w, const float* x, float* y, int64_t n, bool add, cudaStream_t s) {
  const dim3 grid(detail::blocks_for(w.rows, kRowsPerBlock), detail::blocks_for(n, NT));
  const T* d = static_cast<const T*>(w.data);
  if ((w.cols * int64_t(sizeof(T))) % 16 == 0)
    dense_matvec_kernel<T, true, NT><<<grid, kThreads, 0, s>>>(d, w.rows, w.cols, x, y, n, add);
  else
    dense_matvec_kernel<T, false, NT><<<grid, kThreads, 0, s>>>(d, w.rows, w.cols, x, y, n, add);
}

template <int NT>
void launch_matvec(const GpuMatrix& w, const float* x, float* y, int64_t n, bool add, cudaStream_t s) {
  const dim3 grid(detail::blocks_for(w.rows, kRowsPerBlock * rows_per_warp<NT>()), detail::blocks_for(n, NT));
  switch (w.format) {
    case WeightFormat::F32: launch_dense<float, NT>(w, x, y, n, add, s); break;
    case WeightFormat::BF16: launch_dense<uint16_t, NT>(w, x, y, n, add, s); break;
    case WeightFormat::F16: launch_dense<__half, NT>(w, x, y, n, add, s); break;
    case WeightFormat::Affine: {
      const int st = scale_type(w.scale_dtype);
      const auto* d = static_cast<const uint32_t*>(w.data);
      if (w.bits == 4)
        affine_matvec_kernel<4, NT><<<grid, kThreads, affine_smem_bytes<NT>(), s>>>(
            d, w.scales, w.biases, st, w.rows, w.cols, w.group_size, x, y, n, add);
      else
        affine_matvec_kernel<8, NT><<<grid, kThreads, affine_smem_bytes<NT>(), s>>>(
            d, w.scales, w.biases, st, w.rows, w.cols, w.group_size, x, y, n, add);
      break;
    }
  }
  SWIFTLET_CUDA_LAUNCHED();
}

using LaunchFn = void (*)(const GpuMatrix&, const float*, float*, int64_t, bool, cudaStream_t);
constexpr LaunchFn kLaunch[kMaxTokens + 1] = {nullptr,          launch_matvec<1>, launch_matvec<2>,
                                              launch_matvec<3>, launch_matvec<4>, launch_matvec<5>,
                                              launch_matvec<6>, launch_matvec<7>, launch_matvec<8>};

void check_matrix(const GpuMatrix& w) {
  if (w.format != WeightFormat::Affine) return;
  SWIFTLET_CUDA_REQUIRE(w.bits == 4 || w.bits == 8);
  SWIFTLET_CUDA_REQUIRE(w.group_size > 0 && w.group_size % (128 / w.bits) == 0);
  SWIFTLET_CUDA_REQUIRE(w.cols % w.group_size == 0);
}

void run_matmul(const GpuMatrix& w, const float* x, int64_t n, float* y, bool add, cudaStream_t s) {
  check_matrix(w);
  if (w.rows == 0 || n == 0) return;
  constexpr int64_t kMaxPerLaunch = int64_t(65535) * kMaxTokens;
  for (int64_t t0 = 0; t0 < n; t0 += kMaxPerLaunch) {
    const int64_t m = n - t0 < kMaxPerLaunch ? n - t0 : kMaxPerLaunch;
    kLaunch[m < kMaxTokens ? m : kMaxTokens](w, x + t0 * w.cols, y + t0 * w.rows, m, add, s);
  }
}

}  // namespace

void matmul(const GpuMatrix& w, const float* d_x, int64_t n, float* d_y, GpuStream s) {
  run_matmul(w, d_x, n, d_y, false, s);
}

void matmul_add(const GpuMatrix& w, const float* d_x, float* d_y, GpuStream s) {
  run_matmul(w, d_x, 1, d_y, true, s);
}

void matmul_add_rows(const GpuMatrix& w, const float* d_x, int64_t n, float* d_y, GpuStream s) {
  run_matmul(w, d_x, n, d_y, true, s);
}

namespace {
void check_expert_matrix(const GpuMatrix& m) {
  SWIFTLET_CUDA_REQUIRE(m.format == WeightFormat::Affine);
  check_matrix(m);
}
// Gate and up run in one launch: both expert matrices, of one kind and shape.
void check_gate_up(const ExpertLayout& l) {
  check_expert_matrix(l.gate);
  check_expert_matrix(l.up);
  SWIFTLET_CUDA_REQUIRE(detail::same_kind(l.gate, l.up));
}
}  // namespace

void expert_gate_up(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, int n, const float* d_x,
                    float* d_g, float* d_u, GpuStream s) {
  check_gate_up(l);
  if (n == 0) return;
  const dim3 grid(detail::blocks_for(l.gate.rows, kRowsPerBlock), unsigned(n), 2);
  const int st = scale_type(l.gate.scale_dtype);
  if (l.gate.bits == 4)
    grouped_affine_kernel<4><<<grid, kThreads, affine_smem_bytes<1>(), s>>>(
        d_table, d_ids, offsets_of(l.gate), offsets_of(l.up), st, l.gate.rows, l.gate.cols, l.gate.group_size, d_x,
        0, d_g, d_u);
  else
    grouped_affine_kernel<8><<<grid, kThreads, affine_smem_bytes<1>(), s>>>(
        d_table, d_ids, offsets_of(l.gate), offsets_of(l.up), st, l.gate.rows, l.gate.cols, l.gate.group_size, d_x,
        0, d_g, d_u);
  SWIFTLET_CUDA_LAUNCHED();
}

void expert_down(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, int n, const float* d_act,
                 float* d_y, GpuStream s) {
  check_expert_matrix(l.down);
  if (n == 0) return;
  const dim3 grid(detail::blocks_for(l.down.rows, kRowsPerBlock), unsigned(n), 1);
  const int st = scale_type(l.down.scale_dtype);
  const AffineOffsets o = offsets_of(l.down);
  if (l.down.bits == 4)
    grouped_affine_kernel<4><<<grid, kThreads, affine_smem_bytes<1>(), s>>>(
        d_table, d_ids, o, o, st, l.down.rows, l.down.cols, l.down.group_size, d_act, l.down.cols, d_y, nullptr);
  else
    grouped_affine_kernel<8><<<grid, kThreads, affine_smem_bytes<1>(), s>>>(
        d_table, d_ids, o, o, st, l.down.rows, l.down.cols, l.down.group_size, d_act, l.down.cols, d_y, nullptr);
  SWIFTLET_CUDA_LAUNCHED();
}

namespace {
template <int NT>
void launch_pairs(const GpuMatrix& m, AffineOffsets a, AffineOffsets b, bool two, const void* const* d_table,
                  const ExpertBatch& eb, const float* d_x, int64_t x_stride, int x_div, float* d_ya, float* d_yb,
                  cudaStream_t s) {
  const dim3 grid(detail::blocks_for(m.rows, kRowsPerBlock * rows_per_warp<NT>()), unsigned(eb.groups), two ? 2 : 1);
  const int st = scale_type(m.scale_dtype);
  if (m.bits == 4)
    pairs_affine_kernel<4, NT><<<grid, kThreads, affine_smem_bytes<NT>(), s>>>(
        d_table, eb.d_expert, eb.d_start, eb.d_pairs, a, b, st, m.rows, m.cols, m.group_size, d_x, x_stride, x_div,
        d_ya, d_yb);
  else
    pairs_affine_kernel<8, NT><<<grid, kThreads, affine_smem_bytes<NT>(), s>>>(
        d_table, eb.d_expert, eb.d_start, eb.d_pairs, a, b, st, m.rows, m.cols, m.group_size, d_x, x_stride, x_div,
        d_ya, d_yb);
  SWIFTLET_CUDA_LAUNCHED();
}
// Tiles of 8 pairs where the groups are that large on average, else of 4 (less padding).
void run_pairs(const GpuMatrix& m, AffineOffsets a, AffineOffsets b, bool two, const void* const* d_table,
               const ExpertBatch& eb, const float* d_x, int64_t x_stride, int x_div, float* d_ya, float* d_yb,
               cudaStream_t s) {
  SWIFTLET_CUDA_REQUIRE(eb.groups <= 65535);
  if (eb.groups == 0) return;
  if (eb.pairs >= 8 * int64_t(eb.groups))
    launch_pairs<8>(m, a, b, two, d_table, eb, d_x, x_stride, x_div, d_ya, d_yb, s);
  else
    launch_pairs<4>(m, a, b, two, d_table, eb, d_x, x_stride, x_div, d_ya, d_yb, s);
}
}  // namespace

void expert_gate_up_pairs(const ExpertLayout& l, const void* const* d_table, const ExpertBatch& eb, const float* d_x,
                          float* d_g, float* d_u, GpuStream s) {
  check_gate_up(l);
  SWIFTLET_CUDA_REQUIRE(eb.k > 0);
  run_pairs(l.gate, offsets_of(l.gate), offsets_of(l.up), true, d_table, eb, d_x, l.gate.cols, eb.k, d_g, d_u, s);
}

void expert_down_pairs(const ExpertLayout& l, const void* const* d_table, const ExpertBatch& eb, const float* d_act,
                       float* d_y, GpuStream s) {
  check_expert_matrix(l.down);
  const AffineOffsets o = offsets_of(l.down);
  run_pairs(l.down, o, o, false, d_table, eb, d_act, l.down.cols, 1, d_y, nullptr, s);
}

// ---------------------------------------------------------------------------------------------
// Rows of a weight matrix as fp32 (the embedding lookup).

namespace {
// One row of a weight matrix as fp32 (the embedding lookup), one thread per column.
__global__ void dequant_row_kernel(GpuMatrix w, int64_t row, const int32_t* __restrict__ d_row,
                                   float* __restrict__ out) {
  if (d_row) row = d_row[blockIdx.y];
  out += int64_t(blockIdx.y) * w.cols;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= w.cols) return;
  float v;
  switch (w.format) {
    case WeightFormat::F32:
      v = static_cast<const float*>(w.data)[row * w.cols + c];
      break;
    case WeightFormat::BF16:
      v = __uint_as_float(uint32_t(static_cast<const uint16_t*>(w.data)[row * w.cols + c]) << 16);
      break;
    case WeightFormat::F16:
      v = __half2float(static_cast<const __half*>(w.data)[row * w.cols + c]);
      break;
    default: {
      const int per_word = 32 / w.bits;
      const uint32_t word = static_cast<const uint32_t*>(w.data)[row * (w.cols / per_word) + c / per_word];
      const uint32_t q = (word >> (w.bits * int(c % per_word))) & ((1u << w.bits) - 1u);
      const int64_t g = row * (w.cols / w.group_size) + c / w.group_size;
      float sc, bi;
      if (w.scale_dtype == DType::F32) {
        sc = static_cast<const float*>(w.scales)[g];
        bi = static_cast<const float*>(w.biases)[g];
      } else if (w.scale_dtype == DType::BF16) {
        sc = __uint_as_float(uint32_t(static_cast<const uint16_t*>(w.scales)[g]) << 16);
        bi = __uint_as_float(uint32_t(static_cast<const uint16_t*>(w.biases)[g]) << 16);
      } else {
        sc = __half2float(static_cast<const __half*>(w.scales)[g]);
        bi = __half2float(static_cast<const __half*>(w.biases)[g]);
      }
      v = sc * float(q) + bi;
    }
  }
  out[c] = v;
}
}  // namespace

void dequant_row(const GpuMatrix& w, int64_t row, float* d_out, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(row >= 0 && row < w.rows);
  dequant_row_kernel<<<blocks_for(w.cols, 256), 256, 0, s>>>(w, row, nullptr, d_out);
  SWIFTLET_CUDA_LAUNCHED();
}

void dequant_rows(const GpuMatrix& w, const int32_t* d_rows, int64_t n, float* d_out, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(n <= 65535);
  if (n == 0) return;
  dequant_row_kernel<<<dim3(blocks_for(w.cols, 256), unsigned(n)), 256, 0, s>>>(w, 0, d_rows, d_out);
  SWIFTLET_CUDA_LAUNCHED();
}

}  // namespace swiftlet::cuda
