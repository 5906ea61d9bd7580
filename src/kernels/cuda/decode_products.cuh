// The decode products' shared code (matvec.cu: fused_matvec; moe_experts*.cu: the routed experts):
// launch shapes, the streamed products' ring of bulk copies, and the tensor-core warp. Three
// generations of each product live side by side, chosen per call by device and shape: the FP32
// register kernels (any sm_80+), the streamed FP32 kernels (sm_90, bulk copies into shared
// memory) and the tensor-core kernels (sm_90, groups of 64, rows of at most 4096 columns). Not part
// of the API.
#pragma once

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/product_device.cuh"

#include <mutex>
#include <vector>

namespace swiftlet::cuda {

using namespace detail;  // cuda_common.cuh's helpers and product_device.cuh's product loop

namespace detail {
void prepare_expert_kernels();  // moe_experts.cu: what prepare_fused_kernels asks for its kernels
}  // namespace detail

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxParts = 17;                 // routed experts (top-k <= 16) + the shared expert
constexpr int kActMaxE = 512;                 // experts expert_act_routed takes (16 logits per lane of a warp)
constexpr size_t kMaxSmem = 48 * 1024;        // dynamic shared memory without an opt-in

// Chunks per lane for rows_dot_fixed (0: the general loop).
template <int BITS>
int fixed_chunks(int64_t cols, int R) {
  const int64_t n = cols / per_chunk<BITS>();
  if (n == 64 && R <= 4) return 2;
  if (n == 128 && R <= 2) return 4;
  return 0;
}

int blocks_per_sm(int R) {
  if (tuning().blocks_per_sm > 0) return tuning().blocks_per_sm;
  return R >= 4 ? 2 : R == 2 ? 3 : 4;
}

constexpr int kMaxTopk = 16;  // the routed experts a token takes

// The rows forms (fused_matvec_rows, expert_act_rows, expert_down_add_rows) launch the one-token
// kernels with gridDim.y = tokens: blockIdx.y is the block's token, whose arrays sit `stride`
// elements a token apart; gridDim.x blocks share out that token's tiles as the one-token launch's
// blocks do. One token: blockIdx.y = 0, the one-token kernel as it is.
__device__ __forceinline__ int64_t token_offset(int64_t stride) { return int64_t(blockIdx.y) * stride; }

// Blocks a token of a rows launch of `tokens` tokens, where one token's launch takes `blocks`:
// about that many in all (the tensor-core kernels keep one block an SM).
unsigned token_blocks(int64_t blocks, int tokens) {
  return unsigned(std::max<int64_t>(1, tokens > 1 ? blocks / tokens : blocks));
}

// Tiles of a grid-strided loop over `total` this block takes (b, b + grid, ...).
__device__ __forceinline__ int block_tiles(int total) {
  return int(blockIdx.x) < total ? (total - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
}

bool affine_fusable(const GpuMatrix& m) {
  if (m.format != WeightFormat::Affine || (m.bits != 4 && m.bits != 8) || m.group_size <= 0) return false;
  const int per = 128 / m.bits;
  auto a16 = [](const void* p) { return reinterpret_cast<size_t>(p) % 16 == 0; };
  return m.group_size % per == 0 && m.cols % m.group_size == 0 && a16(m.data) && m.cols <= (1 << 30) &&
         m.rows < (int64_t(1) << 30);
}

bool same_shape_kind(const GpuMatrix& a, const GpuMatrix& b) {
  return a.bits == b.bits && a.group_size == b.group_size && a.scale_dtype == b.scale_dtype && a.cols == b.cols;
}

// Blocks for `groups` row groups: every warp busy, at most what stays resident.
unsigned grid_for(int64_t groups, int R) {
  const int64_t want = (groups + kWarps - 1) / kWarps, cap = int64_t(blocks_per_sm(R)) * sm_count();
  return unsigned(want < cap ? want : cap);
}

// ---------------------------------------------------------------------------------------------
// Streamed products (sm_90). The FP32 register kernels are latency-bound (ncu: 3.5 resident
// warps per scheduler, each with one row group's loads in flight, ~10% of the DRAM peak). Here a
// block's weights come into shared memory as tiles of whole rows, by bulk copies (cp.async.bulk, the
// TMA's 1D form) that complete on one mbarrier per stage. Thread 0 keeps up to S tiles in flight
// (~90 KB a block), whatever the warps are doing, and issues the first ones before the PDL wait:
// the weights do not depend on the predecessor, so they load during its tail. The warps read the
// rows from shared memory with the same arithmetic as the register kernels (rows_dot<SMEM>). One
// block per SM and at most kStreamSmem of shared memory: with 8 warps a block of the successor
// fits beside it, but the default 16 warps measured faster (more latency hidden) without that.

constexpr int kMaxStages = 16;
constexpr size_t kStreamSmem = 100 * 1024;

// ---------------------------------------------------------------------------------------------
// Tensor-core streamed products (product_device.cuh's tc_* functions): the same tiles and ring,
// a tile's rows of a matrix one bulk copy (issued by warp 0), contiguous in the stage as in memory.
// Warp w takes column part w % iters of 16-row block w / iters of every tile, so its B fragments
// stay in registers for the whole kernel; a tile's rows are summed over the parts in shared memory
// (`part`, double-buffered by tile) by the threads of warps 1.. after the tile's barrier.

// Warps a block of the tensor-core kernels (the kernels take NW; 8 warps, two blocks an SM at 100 KB
// each so that a successor's block starts during its predecessor's tail, measured 197 against 244
// tok/s), and the shared memory a block may take.
constexpr int kTcWarps = 16;
constexpr size_t kTcSmem = 200 * 1024;

// The lane's scale-and-bias map of its group G on its two rows (row k of scales sc[k] / biases
// bi[k], st type, `groups` a row), summed over the warp's 4 groups: lane 4n holds rows n and n + 8.
__device__ __forceinline__ void tc_fold(const TcFrags& fr, const float (&dot)[2], const void* const (&sc)[2],
                                        const void* const (&bi)[2], const int (&row)[2], int groups, int G, int st,
                                        float (&v)[2]) {
  v[0] = v[1] = 0.0f;
  if (fr.valid) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int64_t i = int64_t(row[k]) * groups + G;
      v[k] = fmaf(smem_scale(sc[k], i, st), dot[k], smem_scale(bi[k], i, st) * fr.xsum);
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    v[k] += __shfl_xor_sync(0xffffffffu, v[k], 1);
    v[k] += __shfl_xor_sync(0xffffffffu, v[k], 2);
  }
}

// A warp's share of every tile of a tensor-core kernel (TcPlace): column part `it` of 16-row block
// `rbk` (busy: the tiles have that block), the lane's group G and row n; TcWarp adds its B
// fragments, loaded once a kernel from x staged in xt.
struct TcPlace {
  int it, rbk, G, n;
  bool busy;
  __device__ explicit TcPlace(const TcGeom& tg) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    it = warp % tg.iters;
    rbk = warp / tg.iters;
    G = it * 4 + (lane & 3);
    n = lane >> 2;
    busy = rbk < tg.rbt;
  }
  // The warp's 16 rows of the N stages st[j] (rows rb bytes apart) times its columns of the x staged
  // as fr, scaled (tc_fold: the lane's rows are row[k] of scales sc[j][k] / biases bi[j][k]), into
  // part[j][warp 16 + r]. With N > 1 the stages' loads and MMAs are one straight run: they overlap.
  template <int BITS, int N>
  __device__ __forceinline__ void rows(const TcFrags& fr, const unsigned char* const (&st)[N], uint32_t rb,
                                       const void* const (&sc)[N][2], const void* const (&bi)[N][2],
                                       const int (&row)[2], int groups, int st_type, float* const (&part)[N]) const {
    float dot[N][2], v[N][2];
#pragma unroll
    for (int j = 0; j < N; ++j) tc_rows<BITS>(st[j] + size_t(rbk) * 16 * rb, rb, fr, G, dot[j]);
#pragma unroll
    for (int j = 0; j < N; ++j) tc_fold(fr, dot[j], sc[j], bi[j], row, groups, G, st_type, v[j]);
    if ((threadIdx.x & 3) == 0) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        part[j][(threadIdx.x >> 5) * 16 + n] = v[j][0];
        part[j][(threadIdx.x >> 5) * 16 + n + 8] = v[j][1];
      }
    }
  }
};
struct TcWarp : TcPlace {
  TcFrags fr;
  __device__ TcWarp(const unsigned char* xt, const TcGeom& tg) : TcPlace(tg) {
    tc_load(xt, tg.groups, G, G < tg.groups, fr);
  }
  // TcPlace::rows for this warp's own x.
  template <int BITS, int N>
  __device__ __forceinline__ void rows(const unsigned char* const (&st)[N], uint32_t rb, const void* const (&sc)[N][2],
                                       const void* const (&bi)[N][2], const int (&row)[2], int groups, int st_type,
                                       float* const (&part)[N]) const {
    TcPlace::rows<BITS, N>(fr, st, rb, sc, bi, row, groups, st_type, part);
  }
};

// p[0] + p[16] + ... + p[16 (n - 1)] in that order, n <= 16 (a value a warp of a block), the
// loads issued together.
__device__ __forceinline__ float sum_by16(const float* p, int n) {
  float v[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) v[k] = k < n ? p[k * 16] : 0.0f;
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < 16; ++k)
    if (k < n) sum += v[k];
  return sum;
}

// Tile row tr's product once every warp's rows are in `part` (TcWarp::rows): the sum of its 16-row
// block's column parts (iters <= 16: a part a warp), in order.
__device__ __forceinline__ float tc_row_sum(const float* part, int tr, int iters) {
  return sum_by16(part + (tr >> 4) * iters * 16 + (tr & 15), iters);
}

// Shared memory a streamed kernel may take (beyond the default 48 KB), granted once per kernel.
void stream_opt_in(const void* kernel, size_t bytes = kStreamSmem) {
  static std::mutex mu;
  static std::vector<const void*> done;
  std::lock_guard<std::mutex> lock(mu);
  for (const void* k : done)
    if (k == kernel) return;
  SWIFTLET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  done.push_back(kernel);
}

bool a16(const void* p) { return reinterpret_cast<size_t>(p) % 16 == 0; }
bool a16(size_t v) { return v % 16 == 0; }

// Fills the ring fields of a for x staged in xs_bytes and stages of stage_bytes: as many stages
// as fit in `budget` bytes (at most kMaxStages). False when fewer than 2 fit (the caller falls back).
template <typename Args>
bool plan_ring(Args& a, size_t xs_bytes, uint32_t stage_bytes, size_t budget = kStreamSmem) {
  const size_t off = (xs_bytes + 127) & ~size_t(127);
  if (off >= budget) return false;
  const size_t n = (budget - off) / stage_bytes;
  if (n < 2) return false;
  a.ring_off = int(off);
  a.stages = int(n < size_t(kMaxStages) ? n : size_t(kMaxStages));
  a.stage_bytes = int(stage_bytes);
  return true;
}
template <typename Args>
size_t ring_smem(const Args& a) {
  return size_t(a.ring_off) + size_t(a.stages) * size_t(a.stage_bytes);
}

bool streaming() { return tuning().capable && tuning().stream; }

// The tensor-core products take 4/8-bit weights in groups of 64 whose rows have at most one part
// of 256 columns a warp (16 warps: 4096 columns); rbt: 16-row blocks a tile (tc_geom).
bool tc_on() { return streaming() && tuning().tc; }
bool tc_shape(int cols, int gs, int bits, int nw) {
  return (bits == 4 || bits == 8) && gs == kTcGs && cols % kTcGs == 0 && tc_geom(cols, nw).rbt > 0;
}
uint32_t scale_row_bytes(int cols, int gs, int st) { return uint32_t(cols / gs) * (st == kScaleF32 ? 4u : 2u); }

// Launches a streamed or tensor-core kernel: `warps` warps a block (its shared memory granted up to
// `opt_in` bytes), at most one block an SM for `blocks` of work; `tokens` of them (gridDim.y,
// token_blocks); in thread-block clusters of `cluster` blocks along x where cluster > 0 (the
// caller's blocks a multiple of it: cluster_blocks).
template <typename Args>
void launch_streamed(void (*kernel)(Args), int warps, size_t opt_in, int blocks, int tokens, size_t smem,
                     cudaStream_t s, const Args& a, unsigned cluster = 0) {
  stream_opt_in(reinterpret_cast<const void*>(kernel), opt_in);
  launch_cluster(kernel, dim3(token_blocks(std::min(blocks, sm_count()), tokens), unsigned(tokens)),
                 dim3(unsigned(warps) * 32), smem, s, false, cluster, a);
  SWIFTLET_CUDA_LAUNCHED();
}
// launch_streamed's blocks for clusters of `cluster` blocks: a multiple of `cluster` a grid row
// (of `tokens` rows) that the device holds at once, at most launch_streamed's own; 0 where fewer
// than two clusters a row would run.
template <typename Args>
int cluster_blocks(void (*kernel)(Args), int warps, size_t opt_in, int blocks, int tokens, size_t smem,
                   unsigned cluster) {
  stream_opt_in(reinterpret_cast<const void*>(kernel), opt_in);
  const int C = int(cluster), row = int(token_blocks(std::min(blocks, sm_count()), tokens));
  const int held = max_active_clusters(reinterpret_cast<const void*>(kernel), cluster, warps * 32, smem) / tokens;
  const int per_row = std::min(row / C, held) * C;
  return per_row >= 2 * C ? per_row * tokens : 0;
}
// A tensor-core kernel: kTcWarps warps a block, kTcSmem granted (launch_streamed).
template <typename Args>
void launch_tc(void (*kernel)(Args), int blocks, int tokens, size_t smem, cudaStream_t s, const Args& a,
               unsigned cluster = 0) {
  launch_streamed(kernel, kTcWarps, kTcSmem, blocks, tokens, smem, s, a, cluster);
}

}  // namespace
}  // namespace swiftlet::cuda
