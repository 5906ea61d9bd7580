// What the int8-activation kernels for affine weights share (matmul_q8_avx2.cpp,
// matmul_q8_avx512.cpp and the NEON forms of matmul_q8_neon.h): the per-call context, a row's and
// a token tile's pointers, and the order in which rows and tokens are visited. Each kernel
// supplies row_tokens<Bits, T>(ctx, r, t), which computes Y[t .. t + T)[r]. Internal linkage, as
// avx2_util.h: every translation unit built for its own instruction set keeps its own copy.
#pragma once

#include "kernels/cpu/matmul_q8.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

// Loops over the T tokens of a tile must be unrolled so the accumulators live in registers.
#define SWIFTLET_UNROLL _Pragma("GCC unroll 16")

namespace swiftlet::q8 {
namespace {

constexpr int64_t kBlock = 64;  // activations are quantised per 64 values
// 4-bit decode (and every token tile, AVX2 and AVX-512) prefetches the weight stream this many
// bytes ahead: about DRAM latency x one core's bandwidth, with margin. Measured with
// bench/kernel_bench: on the Zen 4 dev machine it lifts 4-bit decode (small rows, scales in
// separate streams) but slows 8-bit and dense rows, which the hardware prefetcher already follows
// (bf16 ~100% -> ~70% of the bandwidth), so only 4-bit prefetches; on a Xeon (H200 host) it
// helped every format (2-6 KiB alike, 1 KiB less).
constexpr int64_t kPrefetch = 4096;

inline int64_t pad8(int64_t v) { return (v + 7) & ~int64_t(7); }

struct Ctx {
  const QMatrix& w;
  const PreparedQ8& p;
  float* y;
  int64_t nb;      // activation blocks per row (cols / 64)
  int64_t nbp;     // nb rounded up to 8: row stride of d, xsum, qsum
  int per;         // activation blocks per weight group (group_size / 64)
  size_t rb, srb;  // bytes of a row of codes, of a row of scales (or biases)
};

inline Ctx make_ctx(const QMatrix& w, const PreparedQ8& p, float* y) {
  const int64_t nb = w.cols / kBlock;
  return Ctx{w, p, y, nb, pad8(nb), w.group_size / int(kBlock), w.row_bytes(), w.scale_row_bytes()};
}

// Bytes of one block of 64 codes.
template <int Bits>
constexpr int64_t kBlockBytes = kBlock / 8 * Bits;

// Row r's codes, scales and biases.
struct Row {
  const uint8_t* codes;
  const uint8_t* scales;
  const uint8_t* biases;
};
inline Row row_of(const Ctx& c, int64_t r) {
  return Row{static_cast<const uint8_t*>(c.w.data) + size_t(r) * c.rb,
             static_cast<const uint8_t*>(c.w.scales) + size_t(r) * c.srb,
             static_cast<const uint8_t*>(c.w.biases) + size_t(r) * c.srb};
}

// Tokens [t, t + T): their int8 activations and per-block factors (PreparedQ8).
template <int T>
struct Tokens {
  const int8_t* xq[T];
  const float* d[T];
  const float* xsum[T];
  const float* qsum[T];
};
template <int T>
Tokens<T> tokens_of(const Ctx& c, int64_t t) {
  Tokens<T> k;
  SWIFTLET_UNROLL
  for (int j = 0; j < T; ++j) {
    k.xq[j] = c.p.xq.data() + size_t(t + j) * size_t(c.w.cols);
    k.d[j] = c.p.d.data() + size_t(t + j) * size_t(c.nbp);
    k.xsum[j] = c.p.xsum.data() + size_t(t + j) * size_t(c.nbp);
    k.qsum[j] = c.p.qsum.data() + size_t(t + j) * size_t(c.nbp);
  }
  return k;
}

// Quantises the n rows of x (w.cols values each) into p, 64 values at a time with the kernel's
// own quantize(x, nibble_order, out, d, xsum, qsum), each token's factors padded with zeros to a
// multiple of 8 blocks. The buffers only grow: no allocation in the decode loop.
template <typename QuantizeBlock>
void prepare_tokens(const QMatrix& w, const float* x, int64_t n, PreparedQ8& p, QuantizeBlock quantize) {
  const int64_t cols = w.cols, nb = cols / kBlock, nbp = pad8(nb);
  if (p.xq.size() < size_t(n * cols)) p.xq.resize(size_t(n * cols));
  if (p.d.size() < size_t(n * nbp)) {
    p.d.resize(size_t(n * nbp));
    p.xsum.resize(size_t(n * nbp));
    p.qsum.resize(size_t(n * nbp));
  }
  for (int64_t t = 0; t < n; ++t) {
    const size_t o = size_t(t * nbp);
    for (int64_t b = 0; b < nb; ++b)
      quantize(x + t * cols + b * kBlock, w.bits == 4, p.xq.data() + t * cols + b * kBlock, p.d[o + size_t(b)],
               p.xsum[o + size_t(b)], p.qsum[o + size_t(b)]);
    for (int64_t b = nb; b < nbp; ++b) p.d[o + size_t(b)] = p.xsum[o + size_t(b)] = p.qsum[o + size_t(b)] = 0;
  }
}

// Calls block(k, a) for k = 0 .. n - 1, a an std::integral_constant alternating 0 and 1: two
// accumulator sets, so consecutive blocks do not wait on one another's additions.
template <typename Block>
void alternate_accumulators(int n, Block block) {
  int k = 0;
  for (; k + 2 <= n; k += 2) {
    block(k, std::integral_constant<int, 0>());
    block(k + 1, std::integral_constant<int, 1>());
  }
  if (k < n) block(k, std::integral_constant<int, 0>());
}

// Rows [r0, r1) for n tokens. n = 1 (decode) streams row after row. Batches go in chunks of rows
// (about 128 KiB of weights, which stay in L2 while every token passes) x tiles of MaxTile tokens
// (as many as the registers hold accumulators for), then 4 (when MaxTile is larger), 2 and 1 for
// the last tokens. row(r, t, tile) computes tokens [t, t + tile) of row r, tile an
// std::integral_constant.
template <int MaxTile, typename RowTokens>
void tile_rows(const Ctx& c, int64_t n, int64_t r0, int64_t r1, RowTokens row) {
  static_assert(MaxTile == 4 || MaxTile == 8);
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  using Four = std::integral_constant<int, 4>;
  if (n == 1) {
    for (int64_t r = r0; r < r1; ++r) row(r, 0, One());
    return;
  }
  const int64_t chunk = std::max<int64_t>(8, int64_t(128 << 10) / int64_t(c.rb + 2 * c.srb));
  for (int64_t rc = r0; rc < r1; rc += chunk) {
    const int64_t re = std::min(r1, rc + chunk);
    int64_t t = 0;
    for (; t + MaxTile <= n; t += MaxTile)
      for (int64_t r = rc; r < re; ++r) row(r, t, std::integral_constant<int, MaxTile>());
    if constexpr (MaxTile > 4) {
      if (t + 4 <= n) {
        for (int64_t r = rc; r < re; ++r) row(r, t, Four());
        t += 4;
      }
    }
    if (t + 2 <= n) {
      for (int64_t r = rc; r < re; ++r) row(r, t, Two());
      t += 2;
    }
    if (t < n)
      for (int64_t r = rc; r < re; ++r) row(r, t, One());
  }
}

// The kernel's entry: rows(c, bits) with the context of w, p and y and the weights' bit width as
// an std::integral_constant (4 or 8), which picks the kernel's instantiation.
template <typename RowsForBits>
void for_bits(const QMatrix& w, const PreparedQ8& p, float* y, RowsForBits rows) {
  const Ctx c = make_ctx(w, p, y);
  if (w.bits == 4)
    rows(c, std::integral_constant<int, 4>());
  else
    rows(c, std::integral_constant<int, 8>());
}

}  // namespace
}  // namespace swiftlet::q8
