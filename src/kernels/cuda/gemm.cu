// Products over a prompt's tokens on the tensor cores: affine 4/8-bit weights (MLX layout) times
// many activation rows, for the dense projections and, gathered through pair indices, for the
// routed experts grouped per expert.
//
// The weights stay as they are stored. An integer MMA (m16n8k32: A the weights' codes as unsigned
// bytes, B signed bytes, C int32) takes 16 rows x 32 codes x 8 tokens at once; the affine map of a
// group is applied when the group's sums are complete:
//   y[r][t] = sum_G ( scale[r][G] sum_{k in G} q[r][k] x[t][k] + bias[r][G] sum_{k in G} x[t][k] ).
// The activations go in as integers: quantize_rows scales each group of a row by a power of two
// (its largest value to [2^21, 2^22)), rounds it and splits it into three signed base-256 digits,
// x 2^e ~ d0 + 256 d1 + 65536 d2 (as the decode products do, product_device.cuh). Each digit's sum
// over a group is exact in int32, so x's rounding (below 2^-22 of its group's largest value) is
// the only error beyond fp32's. (Two digits, 2^-14, moved the fixtures' prompt logits by up to
// 1e-2 through a few layers; the third costs half as many MMAs again.)
//
// A block of 8 warps owns 128 weight rows (16 a warp) and a tile of 32 token rows (four 8-column
// MMA tiles); k advances 128 a stage, the stage's weight rows and digit rows brought into shared
// memory by cp.async three stages ahead. Rows are padded in shared memory so that the lanes'
// fragment reads hit distinct banks.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace swiftlet::cuda {

using namespace detail;  // cuda_common.cuh's helpers

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBM = 16 * kWarps;  // weight rows a block
constexpr int kTilesN = 4;        // 8-token MMA tiles a warp
constexpr int kBN = 8 * kTilesN;  // token rows a block tile
constexpr int kBK = 128;          // k a stage
constexpr int kStages = 3;
constexpr int64_t kFp32MaxRows = 256;  // matmul_rows keeps matrices of at most this many rows in fp32
constexpr int kDigits = 3;

constexpr int kMaxStageGroups = kBK / 32;  // groups a stage at the smallest group size

// Shared-memory row strides (bytes), padded so that the fragment reads of a warp hit distinct
// banks: weight rows of a stage (4-bit: 4-byte reads, rows 80 bytes apart; 8-bit: 8-byte reads,
// 160 apart), digit rows of a stage (8-byte reads, 160 apart).
template <int BITS>
__host__ __device__ constexpr int w_stride() { return BITS == 4 ? kBK / 2 + 16 : kBK + 32; }
__host__ __device__ constexpr int x_stride() { return kBK + 32; }
// A stage: weight rows, digit rows, then (2^-e, sum x) of each token row's groups in the stage.
template <int BITS>
__host__ __device__ constexpr int stage_bytes() {
  return kBM * w_stride<BITS>() + kDigits * kBN * x_stride() + kBN * kMaxStageGroups * 8;
}
template <int BITS>
constexpr int smem_bytes() { return kStages * stage_bytes<BITS>(); }

// Bytes of one quantised row: the d0 digits, the d1 digits, the d2 digits, then (2^-e, sum x) per group.
// The row's size is a multiple of 16 bytes (cols a multiple of 128 where the products take it).
__host__ __device__ inline int64_t q_row_bytes(int64_t cols, int gs) {
  return kDigits * cols + (cols / gs * 8 + 15) / 16 * 16;
}

// One warp per (row, group): the group's largest |x| sets e, the digits and (2^-e, sum x) are
// written in the row's quantised form.
__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(const float* __restrict__ x, int64_t rows,
                                                                 int64_t cols, int gs, unsigned char* __restrict__ q) {
  const int lane = threadIdx.x & 31;
  const int64_t groups = cols / gs;
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= rows * groups) return;
  const int64_t r = item / groups, G = item % groups;
  const float* xr = x + r * cols + G * gs;
  float m = 0.0f, s = 0.0f;
  for (int c = lane; c < gs; c += 32) {
    const float v = xr[c];
    m = fmaxf(m, fabsf(v));
    s += v;
  }
  m = detail::warp_max(m);
  s = detail::warp_sum(s);
  int E = 0;
  frexpf(m, &E);  // m = f 2^E, f in [0.5, 1): m 2^(22 - E) in [2^21, 2^22)
  const int e = m > 0.0f ? max(-126, min(126, 22 - E)) : 0;
  const float up = __uint_as_float(uint32_t(127 + e) << 23);
  unsigned char* row = q + r * q_row_bytes(cols, gs);
  for (int c = lane; c < gs; c += 32) {
    const int xi = __float2int_rn(xr[c] * up);  // |xi| <= 2^22
    const int d0 = int(int8_t(xi & 0xff)), r1 = (xi - d0) >> 8;
    const int d1 = int(int8_t(r1 & 0xff)), d2 = (r1 - d1) >> 8;  // |d2| <= 64
    // Within each 8 values, the even ones first, then the odd ones (the MMAs' k order).
    const int64_t at = G * gs + (c & ~7) + ((c & 1) ? 4 + ((c & 7) >> 1) : ((c & 7) >> 1));
    row[at] = static_cast<unsigned char>(d0);
    row[cols + at] = static_cast<unsigned char>(d1);
    row[2 * cols + at] = static_cast<unsigned char>(d2);
  }
  if (lane == 0)
    reinterpret_cast<float2*>(row + kDigits * cols)[G] = make_float2(__uint_as_float(uint32_t(127 - e) << 23), s);
}

// Where the token rows of a tile live: quantised input row and fp32 output row of tile row i.
// Contiguous rows (a dense projection): rows t0 + i.
struct DenseTile {
  int64_t t0, n;
  __device__ int in_row(int i) const { return t0 + i < n ? int(t0 + i) : -1; }
  __device__ int64_t out_row(int i) const { return t0 + i; }
};
// Pairs of a group (a prompt's routed experts): pair p = pairs[i] reads input row p / x_div and
// writes output row p.
struct PairTile {
  const int32_t* pairs;
  int n, x_div;
  __device__ int in_row(int i) const { return i < n ? pairs[i] / x_div : -1; }
  __device__ int64_t out_row(int i) const { return pairs[i]; }
};

// An int32 |c| < 2^22 as float with two full-rate instructions (I2F runs at an eighth of the FMA
// rate, and the flush below converts every digit sum): 1.5 2^23 + c has c in its mantissa.
__device__ __forceinline__ float small_int_to_float(int c) { return __int_as_float(0x4B400000 + c) - 12582912.0f; }

// A scale or bias as stored (its bits), and as float: loaded a group ahead, converted when used.
__device__ __forceinline__ uint32_t scale_bits(const void* p, int64_t i, int st) {
  if (st == detail::kScaleF32) return __float_as_uint(__ldg(static_cast<const float*>(p) + i));
  return __ldg(static_cast<const unsigned short*>(p) + i);
}
__device__ __forceinline__ float bits_scale(uint32_t b, int st) {
  if (st == detail::kScaleBF16) return __uint_as_float(b << 16);
  if (st == detail::kScaleF32) return __uint_as_float(b);
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}

// The block's 128 rows from r0 of W (rows of rb bytes at w) times the tile's token rows.
template <int BITS, typename Tile>
__device__ __forceinline__ void gemm_tile(const unsigned char* __restrict__ w, const void* __restrict__ scales,
                                          const void* __restrict__ biases, int st, int64_t rows, int64_t cols, int gs,
                                          const unsigned char* __restrict__ q, const Tile& tile, float* __restrict__ y,
                                          bool add, int64_t r0) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int in_row[kBN];
  constexpr int WS = w_stride<BITS>(), XS = x_stride();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n8 = lane >> 2, t4 = lane & 3;
  const int64_t rb = cols * BITS / 8, qb = q_row_bytes(cols, gs), groups = cols / gs;
  // gs is 32, 64 or 128 (gemm_takes; at most 128 keeps a digit's sum over a group below 2^22,
  // 255 x 128 x 128, for small_int_to_float): group arithmetic in shifts, not 64-bit divisions
  // (dozens of instructions each, and the group test runs every step).
  const int log_gsteps = gs == 32 ? 0 : gs == 64 ? 1 : 2;  // log2 of the 32-k steps a group
  const int log_sg = 2 - log_gsteps;                      // log2 of the groups a stage
  const int stage_groups = 1 << log_sg;
  __syncthreads();  // the previous tile's readers of in_row and the stages are done
  if (threadIdx.x < kBN) in_row[threadIdx.x] = tile.in_row(int(threadIdx.x));
  __syncthreads();

  // A stage: the weight rows' codes, the token rows' three digit planes, and the token rows'
  // (2^-e, sum x) of the stage's groups.
  auto load_stage = [&](int stage, int64_t k0) {
    unsigned char* sw = smem + stage * stage_bytes<BITS>();
    unsigned char* sx = sw + kBM * WS;
    float2* si = reinterpret_cast<float2*>(sx + kDigits * kBN * XS);
    constexpr int kWChunks = kBK * BITS / 8 / 16;  // 16-byte chunks of a weight row a stage
    for (int c = threadIdx.x; c < kBM * kWChunks; c += kThreads) {
      const int r = c / kWChunks, part = c % kWChunks;
      const bool ok = r0 + r < rows;
      cp_async16(sw + r * WS + part * 16, w + (ok ? r0 + r : 0) * rb + k0 * BITS / 8 + part * 16, ok ? 16 : 0);
    }
    constexpr int kXChunks = kBK / 16;
    for (int c = threadIdx.x; c < kDigits * kBN * kXChunks; c += kThreads) {
      const int d = c / (kBN * kXChunks), i = (c / kXChunks) % kBN, part = c % kXChunks;
      const int row = in_row[i];
      cp_async16(sx + (d * kBN + i) * XS + part * 16, q + (row >= 0 ? row : 0) * qb + d * cols + k0 + part * 16,
                 row >= 0 ? 16 : 0);
    }
    if (int(threadIdx.x) < (kBN << log_sg)) {
      const int i = int(threadIdx.x) >> log_sg, g = int(threadIdx.x) & (stage_groups - 1), row = in_row[i];
      const int64_t G = (k0 >> (5 + log_gsteps)) + g;
      const unsigned char* src = q + (row >= 0 ? row : 0) * qb + kDigits * cols + G * 8;
      cp_async8(si + i * kMaxStageGroups + g, src, row >= 0 ? 8 : 0);
    }
  };

  const int64_t ra = r0 + 16 * warp + n8, rc = ra + 8;  // the lane's weight rows
  const int64_t ga = (ra < rows ? ra : 0) * groups, gc = (rc < rows ? rc : 0) * groups;

  float acc[kTilesN][4];
  int cd[kDigits][kTilesN][4];  // the digits' sums over the group so far
#pragma unroll
  for (int j = 0; j < kTilesN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[j][e] = 0.0f;
#pragma unroll
      for (int d = 0; d < kDigits; ++d) cd[d][j][e] = 0;
    }
  // The lane's rows' scales and biases of the group in progress, loaded a group ahead.
  uint32_t sab[4] = {scale_bits(scales, ga, st), scale_bits(scales, gc, st), scale_bits(biases, ga, st),
                     scale_bits(biases, gc, st)};

  const int ktiles = int(cols / kBK);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(s, int64_t(s) * kBK);
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // the stage has landed for all; the stage about to be refilled is consumed
    if (kt + kStages - 1 < ktiles) load_stage((kt + kStages - 1) % kStages, int64_t(kt + kStages - 1) * kBK);
    cp_async_commit();
    const unsigned char* sw = smem + (kt % kStages) * stage_bytes<BITS>();
    const unsigned char* sx = sw + kBM * WS;
    const float2* si = reinterpret_cast<const float2*>(sx + kDigits * kBN * XS);
    const unsigned char* wa = sw + (16 * warp + n8) * WS;
    const unsigned char* wc = wa + 8 * WS;
#pragma unroll
    for (int j = 0; j < kBK / 32; ++j) {
      // A: rows n8 (a0, a2) and n8 + 8 (a1, a3), the lane's k slots 8 t4 + 0, 2, 4, 6 (a0, a1) and
      // 8 t4 + 1, 3, 5, 7 (a2, a3) of the step; B: the same k of token 8 tn + n8 (quantize_rows
      // stores each 8 values' even ones first), one 8-byte read a digit.
      uint32_t a0, a1, a2, a3;
      if constexpr (BITS == 4) {  // a word's low nibbles are its even values
        const uint32_t u = *reinterpret_cast<const uint32_t*>(wa + 16 * j + 4 * t4);
        const uint32_t v = *reinterpret_cast<const uint32_t*>(wc + 16 * j + 4 * t4);
        a0 = u & 0x0F0F0F0Fu;
        a2 = (u >> 4) & 0x0F0F0F0Fu;
        a1 = v & 0x0F0F0F0Fu;
        a3 = (v >> 4) & 0x0F0F0F0Fu;
      } else {
        const uint2 u = *reinterpret_cast<const uint2*>(wa + 32 * j + 8 * t4);
        const uint2 v = *reinterpret_cast<const uint2*>(wc + 32 * j + 8 * t4);
        a0 = __byte_perm(u.x, u.y, 0x6420);
        a2 = __byte_perm(u.x, u.y, 0x7531);
        a1 = __byte_perm(v.x, v.y, 0x6420);
        a3 = __byte_perm(v.x, v.y, 0x7531);
      }
#pragma unroll
      for (int tn = 0; tn < kTilesN; ++tn) {
#pragma unroll
        for (int d = 0; d < kDigits; ++d) {
          const uint2 b = *reinterpret_cast<const uint2*>(sx + (d * kBN + 8 * tn + n8) * XS + 32 * j + 8 * t4);
          mma_u8s8(cd[d][tn], a0, a1, a2, a3, b.x, b.y);
        }
      }
      const int steps = kt * (kBK / 32) + j + 1;  // 32-k steps done
      if ((steps & ((1 << log_gsteps) - 1)) == 0) {  // a group is complete: apply its affine map
        const int64_t G = (steps >> log_gsteps) - 1;
        const float sa = bits_scale(sab[0], st), sc = bits_scale(sab[1], st);
        const float ba = bits_scale(sab[2], st), bc = bits_scale(sab[3], st);
        if (G + 1 < groups) {
          sab[0] = scale_bits(scales, ga + G + 1, st);
          sab[1] = scale_bits(scales, gc + G + 1, st);
          sab[2] = scale_bits(biases, ga + G + 1, st);
          sab[3] = scale_bits(biases, gc + G + 1, st);
        }
        const int gi = int(G) - (kt << log_sg);  // the group's place in the stage
#pragma unroll
        for (int tn = 0; tn < kTilesN; ++tn) {
          const float2 i0 = si[(8 * tn + 2 * t4) * kMaxStageGroups + gi];
          const float2 i1 = si[(8 * tn + 2 * t4 + 1) * kMaxStageGroups + gi];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 info = (e & 1) ? i1 : i0;
            const float sum = fmaf(65536.0f, small_int_to_float(cd[2][tn][e]),
                                   fmaf(256.0f, small_int_to_float(cd[1][tn][e]), small_int_to_float(cd[0][tn][e])));
            acc[tn][e] = fmaf((e < 2 ? sa : sc) * info.x, sum, fmaf(e < 2 ? ba : bc, info.y, acc[tn][e]));
#pragma unroll
            for (int d = 0; d < kDigits; ++d) cd[d][tn][e] = 0;
          }
        }
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int tn = 0; tn < kTilesN; ++tn)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 8 * tn + 2 * t4 + (e & 1);
      const int64_t r = e < 2 ? ra : rc;
      if (r >= rows || in_row[i] < 0) continue;
      float* yp = y + tile.out_row(i) * rows + r;
      *yp = add ? *yp + acc[tn][e] : acc[tn][e];
    }
}

// Dense rows: blockIdx.x the 128-row tile, blockIdx.y the 32-token tile.
template <int BITS>
__global__ void __launch_bounds__(kThreads, 2) gemm_dense_kernel(GpuMatrix w, int st, const unsigned char* __restrict__ q,
                                                              int64_t n, float* __restrict__ y, bool add) {
  const DenseTile tile{int64_t(blockIdx.y) * kBN, n};
  gemm_tile<BITS>(static_cast<const unsigned char*>(w.data), w.scales, w.biases, st, w.rows, w.cols, w.group_size, q,
                  tile, y, add, int64_t(blockIdx.x) * kBM);
}

// The routed experts: blockIdx.y a group (an expert and its pairs), blockIdx.z matrix a or b (gate
// and up share the input); the block takes the group's pairs 32 at a time. Matrix offsets are
// from the expert's slot base (ExpertLayout).
template <int BITS>
__global__ void __launch_bounds__(kThreads, 2) gemm_pairs_kernel(const void* const* __restrict__ table,
                                                              const int32_t* __restrict__ group_expert,
                                                              const int32_t* __restrict__ group_start,
                                                              const int32_t* __restrict__ pairs, AffineOffsets a, AffineOffsets b,
                                                              int st, int64_t rows, int64_t cols, int gs,
                                                              const unsigned char* __restrict__ q, int x_div,
                                                              float* __restrict__ ya, float* __restrict__ yb) {
  const int g = blockIdx.y;
  const SlotMatrix m = slot_matrix(table[group_expert[g]], a, b, ya, yb);
  const int end = group_start[g + 1];
  for (int p0 = group_start[g]; p0 < end; p0 += kBN) {  // block-uniform
    const PairTile tile{pairs + p0, end - p0, x_div};
    gemm_tile<BITS>(reinterpret_cast<const unsigned char*>(m.data), m.scales, m.biases, st, rows, cols, gs, q, tile,
                    m.y, false, int64_t(blockIdx.x) * kBM);
  }
}

template <typename Kernel>
void allow_smem(Kernel k, int bytes) {
  SWIFTLET_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

bool device_capable() {
  static const bool capable = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 8;
  }();
  return capable;
}

bool g_gemm_on = true;

// Group sizes the products take: 32, 64 or 128 (all MLX offers; powers of two keep the group
// arithmetic in shifts, and at most 128 keeps a digit's sum below 2^22).
bool group_takes(int gs) { return gs == 32 || gs == 64 || gs == 128; }

template <int BITS>
void launch_dense(const GpuMatrix& w, const unsigned char* q, int64_t n, float* d_y, bool add, cudaStream_t s) {
  static const bool init = (allow_smem(gemm_dense_kernel<BITS>, smem_bytes<BITS>()), true);
  (void)init;
  const dim3 grid(blocks_for(w.rows, kBM), blocks_for(n, kBN));
  gemm_dense_kernel<BITS><<<grid, kThreads, smem_bytes<BITS>(), s>>>(w, scale_type(w.scale_dtype), q, n, d_y, add);
  SWIFTLET_CUDA_LAUNCHED();
}

template <int BITS>
void launch_pairs(const GpuMatrix& m, AffineOffsets a, AffineOffsets b, bool two, const void* const* d_table,
                  const ExpertBatch& eb, const void* d_q, int x_div, float* d_ya, float* d_yb, cudaStream_t s) {
  static const bool init = (allow_smem(gemm_pairs_kernel<BITS>, smem_bytes<BITS>()), true);
  (void)init;
  const dim3 grid(blocks_for(m.rows, kBM), unsigned(eb.groups), two ? 2 : 1);
  gemm_pairs_kernel<BITS><<<grid, kThreads, smem_bytes<BITS>(), s>>>(
      d_table, eb.d_expert, eb.d_start, eb.d_pairs, a, b, scale_type(m.scale_dtype), m.rows, m.cols, m.group_size,
      static_cast<const unsigned char*>(d_q), x_div, d_ya, d_yb);
  SWIFTLET_CUDA_LAUNCHED();
}

void run_pairs(const GpuMatrix& m, AffineOffsets a, AffineOffsets b, bool two, const void* const* d_table, const ExpertBatch& eb,
               const void* d_q, int x_div, float* d_ya, float* d_yb, cudaStream_t s) {
  SWIFTLET_CUDA_REQUIRE(eb.groups <= 65535);
  if (eb.groups == 0) return;
  if (m.bits == 4)
    launch_pairs<4>(m, a, b, two, d_table, eb, d_q, x_div, d_ya, d_yb, s);
  else
    launch_pairs<8>(m, a, b, two, d_table, eb, d_q, x_div, d_ya, d_yb, s);
}

}  // namespace

size_t quantized_rows_bytes(int64_t rows, int64_t cols, int group_size) {
  SWIFTLET_CUDA_REQUIRE(group_size > 0 && cols % group_size == 0);
  return size_t(rows * q_row_bytes(cols, group_size));
}

void quantize_rows(const float* d_x, int64_t rows, int64_t cols, int group_size, void* d_q, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(group_size % 32 == 0 && cols % group_size == 0);
  const int64_t items = rows * (cols / group_size);
  if (items == 0) return;
  quantize_rows_kernel<<<blocks_for(items, kWarps), kThreads, 0, s>>>(d_x, rows, cols, group_size,
                                                                      static_cast<unsigned char*>(d_q));
  SWIFTLET_CUDA_LAUNCHED();
}

bool gemm_takes(const GpuMatrix& w, int group_size) {
  return tensor_core_gemm() && group_takes(group_size) && w.format == WeightFormat::Affine &&
         (w.bits == 4 || w.bits == 8) && w.group_size == group_size && w.cols % kBK == 0 && w.cols % group_size == 0;
}

void set_tensor_core_gemm(bool on) { g_gemm_on = on; }
bool tensor_core_gemm() { return g_gemm_on && device_capable(); }

RowsIn prepare_rows(const float* d_x, int64_t rows, int64_t cols, int group_size, void* d_q, GpuStream s) {
  RowsIn in;
  in.x = d_x;
  if (!tensor_core_gemm() || !d_q || !group_takes(group_size) || cols % group_size != 0) return in;
  quantize_rows(d_x, rows, cols, group_size, d_q, s);
  in.q = d_q;
  in.q_group = group_size;
  return in;
}

void matmul_rows(const GpuMatrix& w, const RowsIn& in, int64_t n, float* d_y, bool add, GpuStream s) {
  // Matrices of few rows (the router, the DeltaNet's b and a, the shared expert's gate) stay on the
  // fp32 tiles: a 256-row router took 18.5 us/token on the tensor cores against 10.4 (two row blocks
  // a token tile leave most of the GPU idle through the whole k loop).
  if (!in.q || !gemm_takes(w, in.q_group) || w.rows <= kFp32MaxRows) {
    if (add)
      matmul_add_rows(w, in.x, n, d_y, s);
    else
      matmul(w, in.x, n, d_y, s);
    return;
  }
  if (w.rows == 0 || n == 0) return;
  SWIFTLET_CUDA_REQUIRE((n + kBN - 1) / kBN <= 65535);
  const auto* q = static_cast<const unsigned char*>(in.q);
  if (w.bits == 4)
    launch_dense<4>(w, q, n, d_y, add, s);
  else
    launch_dense<8>(w, q, n, d_y, add, s);
}

void expert_gate_up_pairs(const ExpertLayout& l, const void* const* d_table, const ExpertBatch& eb, const RowsIn& x,
                          float* d_g, float* d_u, GpuStream s) {
  if (!x.q || !gemm_takes(l.gate, x.q_group)) {
    expert_gate_up_pairs(l, d_table, eb, x.x, d_g, d_u, s);
    return;
  }
  SWIFTLET_CUDA_REQUIRE(detail::same_kind(l.gate, l.up) && eb.k > 0);
  run_pairs(l.gate, offsets_of(l.gate), offsets_of(l.up), true, d_table, eb, x.q, eb.k, d_g, d_u, s);
}

void expert_down_pairs(const ExpertLayout& l, const void* const* d_table, const ExpertBatch& eb, const RowsIn& act,
                       float* d_y, GpuStream s) {
  if (!act.q || !gemm_takes(l.down, act.q_group)) {
    expert_down_pairs(l, d_table, eb, act.x, d_y, s);
    return;
  }
  const AffineOffsets o = offsets_of(l.down);
  run_pairs(l.down, o, o, false, d_table, eb, act.q, 1, d_y, nullptr, s);
}

}  // namespace swiftlet::cuda
