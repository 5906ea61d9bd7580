// The 8-lane attention kernels (see attention.h), one source for AVX2 and NEON (simd_f8.h). On
// x86-64 built with -mavx2 -mfma in its own translation unit; attention.cpp calls in here only
// after checking the CPU.
#include "kernels/cpu/attention.h"
#include "kernels/cpu/simd_f8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace swiftlet::attn::vec {

using namespace simd;

namespace {
constexpr int kHeads = 8;   // query heads per block: one score vector per cache row
constexpr int kRows = 8;    // cache rows per V block (whole rows, stay in L1)
constexpr int kAhead = 6;   // K rows prefetched ahead

struct Scratch {
  std::vector<float> q;       // [blocks][8][hd]: queries by KV head, scaled, zero-padded to 8
  std::vector<float> scores;  // [rows][blocks * 8]: scores, then softmax numerators
  std::vector<float> acc;     // [blocks][8][hd]: unnormalised outputs
};

// acc[g] += sum_s p[s][g] V[s] for heads g0 .. g0 + 3 of a block, columns d .. d + 8 NV.
// p row s at p + s * ps.
template <int NV>
inline void vsum4(const float* p, int64_t ps, const float* V, int64_t stride, int64_t s0, int64_t s1,
                  int g0, int d, float* acc, int hd) {
  F8 a[4][NV];
#pragma GCC unroll 8
  for (int g = 0; g < 4; ++g)
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) a[g][c] = load(acc + (g0 + g) * hd + d + 8 * c);
  for (int64_t s = s0; s < s1; ++s) {
    F8 v[NV];
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) v[c] = load(V + s * stride + d + 8 * c);
#pragma GCC unroll 8
    for (int g = 0; g < 4; ++g) {
      const F8 w = broadcast(p + s * ps + g0 + g);
#pragma GCC unroll 8
      for (int c = 0; c < NV; ++c) a[g][c] = fma(w, v[c], a[g][c]);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < 4; ++g)
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) store(acc + (g0 + g) * hd + d + 8 * c, a[g][c]);
}
}  // namespace

// Cache rows [s0, s1) for every query head of one query row: each cache row is read whole
// (all KV heads, one contiguous stretch), each K row met by all the query heads sharing it.
// Writes per head: o (unnormalised sum of e^(score - m) V), m (max score) and l (sum of
// e^(score - m)), for the caller to merge parts and normalise.
void attend_rows(const float* q, int nh, int nkv, int hd, const float* K, const float* V, int64_t stride,
                 int64_t s0, int64_t s1, float scale, float* o, float* m, float* l) {
  thread_local Scratch w;
  const int group = nh / nkv, per_kv = (group + kHeads - 1) / kHeads, nb = nkv * per_kv;
  const int64_t rows = s1 - s0, ps = int64_t(nb) * kHeads;
  if (w.q.size() < size_t(nb * kHeads * hd)) w.q.resize(size_t(nb * kHeads * hd)), w.acc.resize(size_t(nb * kHeads * hd));
  if (w.scores.size() < size_t(rows * ps)) w.scores.resize(size_t(rows * ps) * 2);  // grows geometrically
  float* qp = w.q.data();
  float* sc = w.scores.data();
  float* acc = w.acc.data();
  // Block b = kvh * per_kv + i holds query heads kvh * group + 8 i + (0..7).
  std::fill(qp, qp + nb * kHeads * hd, 0.0f);
  for (int j = 0; j < nh; ++j) {
    const int kvh = j / group, i = (j % group) / kHeads, g = (j % group) % kHeads;
    float* dst = qp + ((kvh * per_kv + i) * kHeads + g) * hd;
    for (int d = 0; d < hd; ++d) dst[d] = q[int64_t(j) * hd + d] * scale;
  }

  // Scores, row by row.
  alignas(32) float mx[64 * kHeads];  // per block running max (nb <= 64)
  for (int b = 0; b < nb; ++b) store(mx + b * kHeads, splat(-INFINITY));
  for (int64_t s = s0; s < s1; ++s) {
    const float* kr = K + s * stride;
    if (s + kAhead < s1)  // the next rows: a few lines of each ahead of the hardware prefetcher
      for (int d = 0; d < nkv * hd; d += 16)
        prefetch(kr + kAhead * stride + d);
    float* srow = sc + (s - s0) * ps;
    for (int b = 0; b < nb; ++b) {
      const float* kh = kr + (b / per_kv) * hd;
      const float* qb = qp + b * kHeads * hd;
      F8 a[kHeads];
#pragma GCC unroll 8
      for (int g = 0; g < kHeads; ++g) a[g] = zero();
      for (int d = 0; d < hd; d += 8) {
        const F8 kv = load(kh + d);
#pragma GCC unroll 8
        for (int g = 0; g < kHeads; ++g) a[g] = fma(load(qb + g * hd + d), kv, a[g]);
      }
      const F8 r = reduce8(a);
      store(mx + b * kHeads, max(load(mx + b * kHeads), r));
      store(srow + b * kHeads, r);
    }
  }
  // Softmax numerators.
  alignas(32) float sum[64 * kHeads];
  for (int b = 0; b < nb; ++b) {
    const F8 vm = load(mx + b * kHeads);
    F8 vs = zero();
    for (int64_t s = 0; s < rows; ++s) {
      float* p = sc + s * ps + b * kHeads;
      const F8 e = exp(load(p) - vm);
      vs = vs + e;
      store(p, e);
    }
    store(sum + b * kHeads, vs);
  }
  // Weighted V sums, a few whole rows at a time (they stay in L1 for all blocks).
  std::fill(acc, acc + nb * kHeads * hd, 0.0f);
  for (int64_t t0 = s0; t0 < s1; t0 += kRows) {
    const int64_t t1 = std::min(s1, t0 + kRows);
    for (int b = 0; b < nb; ++b) {
      const float* vb = V + t0 * stride + (b / per_kv) * hd;  // rows t0 .. t1
      const float* p = sc + (t0 - s0) * ps + b * kHeads;
      const int real = std::min(kHeads, group - (b % per_kv) * kHeads);
      float* ab = acc + b * kHeads * hd;
      for (int g0 = 0; g0 < real; g0 += 4) {
        int d = 0;
        for (; d + 16 <= hd; d += 16) vsum4<2>(p, ps, vb, stride, 0, t1 - t0, g0, d, ab, hd);
        for (; d < hd; d += 8) vsum4<1>(p, ps, vb, stride, 0, t1 - t0, g0, d, ab, hd);
      }
    }
  }
  for (int j = 0; j < nh; ++j) {
    const int kvh = j / group, i = (j % group) / kHeads, g = (j % group) % kHeads, b = kvh * per_kv + i;
    std::copy(acc + (b * kHeads + g) * hd, acc + (b * kHeads + g + 1) * hd, o + int64_t(j) * hd);
    m[j] = mx[b * kHeads + g];
    l[j] = sum[b * kHeads + g];
  }
}

void sigmoid_gate(float* o, const float* gate, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    store(o + i, load(o + i) * sigmoid(load(gate + i)));
  for (; i < n; ++i) o[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
}

}  // namespace swiftlet::attn::vec
