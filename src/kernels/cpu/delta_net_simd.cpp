// The 8-lane kernels of the Gated DeltaNet mixer (see delta_net.h), one source for AVX2 and NEON
// (simd_f8.h). On x86-64 built with -mavx2 -mfma in its own translation unit; delta_net.cpp calls
// in here only after checking the CPU.
#include "kernels/cpu/delta_net.h"
#include "kernels/cpu/simd_f8.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace swiftlet {

namespace simd {

namespace {
// MR rows x 8*NV columns of C, k products each; A element broadcast, B row loaded.
template <int MR, int NV>
inline void gemm_tile(int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                      int64_t ldc, bool accumulate) {
  F8 c[MR][NV];
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      c[r][v] = accumulate ? load(C + r * ldc + 8 * v) : zero();
  for (int64_t p = 0; p < k; ++p) {
    F8 b[NV];
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = load(B + p * ldb + 8 * v);
    #pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const F8 a = broadcast(A + r * lda + p);
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = fma(a, b[v], c[r][v]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store(C + r * ldc + 8 * v, c[r][v]);
}

template <int NV>
inline void gemm_rows(int mr, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
                      float* C, int64_t ldc, bool acc) {
  switch (mr) {
    case 6: gemm_tile<6, NV>(k, A, lda, B, ldb, C, ldc, acc); break;
    case 5: gemm_tile<5, NV>(k, A, lda, B, ldb, C, ldc, acc); break;
    case 4: gemm_tile<4, NV>(k, A, lda, B, ldb, C, ldc, acc); break;
    case 3: gemm_tile<3, NV>(k, A, lda, B, ldb, C, ldc, acc); break;
    case 2: gemm_tile<2, NV>(k, A, lda, B, ldb, C, ldc, acc); break;
    default: gemm_tile<1, NV>(k, A, lda, B, ldb, C, ldc, acc); break;
  }
}
}  // namespace

void gemm(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
          float* C, int64_t ldc, bool accumulate, bool lower) {
  // Column panels outside, row tiles inside: a panel of B (k x 16) stays in L1 while every
  // row tile of A passes over it.
  constexpr int MR = 6;
  auto panel = [&](int64_t j, auto nv) {
    for (int64_t i0 = 0; i0 < m; i0 += MR) {
      const int mr = int(std::min<int64_t>(MR, m - i0));
      const int64_t kk = lower ? std::min<int64_t>(k, i0 + mr) : k;
      gemm_rows<decltype(nv)::value>(mr, kk, A + i0 * lda, lda, B + j, ldb, C + i0 * ldc + j, ldc, accumulate);
    }
  };
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) panel(j, std::integral_constant<int, 2>());
  for (; j + 8 <= n; j += 8) panel(j, std::integral_constant<int, 1>());
  for (; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      const int64_t kk = lower ? std::min<int64_t>(k, i + 1) : k;
      float acc = accumulate ? C[i * ldc + j] : 0.0f;
      for (int64_t p = 0; p < kk; ++p) acc += A[i * lda + p] * B[p * ldb + j];
      C[i * ldc + j] = acc;
    }
}

}  // namespace simd

namespace gdn::vec {

using namespace simd;

// ---- decode: one token, one value head ----

// Columns [j0, j0 + 8 NV) of S [dk][dv]: read m = (alpha S)^T k, delta = beta (v - m), then in
// a second pass over the same (L1-resident) columns S <- alpha S + k delta^T and o = S^T q.
template <int NV>
inline void step_columns(float* S, int dk, int dv, int j0, const float* q, const float* k,
                         const float* v, float alpha, float beta, float* o) {
  F8 m0[NV], m1[NV];
  #pragma GCC unroll 8
  for (int c = 0; c < NV; ++c) m0[c] = m1[c] = zero();
  int i = 0;
  for (; i + 2 <= dk; i += 2) {
    const F8 k0 = broadcast(k + i), k1 = broadcast(k + i + 1);
    const float* s0 = S + int64_t(i) * dv + j0;
    #pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) {
      m0[c] = fma(load(s0 + 8 * c), k0, m0[c]);
      m1[c] = fma(load(s0 + dv + 8 * c), k1, m1[c]);
    }
  }
  if (i < dk) {
    const F8 k0 = broadcast(k + i);
    #pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) m0[c] = fma(load(S + int64_t(i) * dv + j0 + 8 * c), k0, m0[c]);
  }
  const F8 va = splat(alpha), vb = splat(beta);
  F8 delta[NV], acc[NV];
  #pragma GCC unroll 8
  for (int c = 0; c < NV; ++c) {
    const F8 m = va * (m0[c] + m1[c]);
    delta[c] = vb * (load(v + j0 + 8 * c) - m);
    acc[c] = zero();
  }
  for (i = 0; i < dk; ++i) {
    const F8 ki = broadcast(k + i), qi = broadcast(q + i);
    float* s = S + int64_t(i) * dv + j0;
    #pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) {
      const F8 x = fma(ki, delta[c], va * load(s + 8 * c));
      store(s + 8 * c, x);
      acc[c] = fma(qi, x, acc[c]);
    }
  }
  #pragma GCC unroll 8
  for (int c = 0; c < NV; ++c) store(o + j0 + 8 * c, acc[c]);
}

void step_head(float* S, int dk, int dv, const float* q, const float* k, const float* v, float alpha,
               float beta, float* o) {
  int j = 0;
  for (; j + 32 <= dv; j += 32) step_columns<4>(S, dk, dv, j, q, k, v, alpha, beta, o);
  for (; j + 8 <= dv; j += 8) step_columns<1>(S, dk, dv, j, q, k, v, alpha, beta, o);
  for (; j < dv; ++j) {  // scalar tail (dv not a multiple of 8)
    float m = 0;
    for (int i = 0; i < dk; ++i) m += S[int64_t(i) * dv + j] * k[i];
    const float delta = beta * (v[j] - alpha * m);
    float acc = 0;
    for (int i = 0; i < dk; ++i) {
      float& s = S[int64_t(i) * dv + j];
      s = alpha * s + k[i] * delta;
      acc += q[i] * s;
    }
    o[j] = acc;
  }
}

void recurrent_head(const DeltaShape& sh, const DeltaBatch& b, int h, float* S) {
  const int r = sh.value_heads / sh.key_heads, kh = h / r;
  const int dk = sh.key_dim, dv = sh.value_dim;
  for (int64_t t = 0; t < b.T; ++t) {
    const float* q = b.q + t * b.qkv_stride + int64_t(kh) * dk;
    const float* k = b.k + t * b.qkv_stride + int64_t(kh) * dk;
    const float* v = b.v + t * b.qkv_stride + int64_t(h) * dv;
    const float alpha = std::exp(b.g[t * b.gate_stride + h]);
    step_head(S, dk, dv, q, k, v, alpha, b.beta[t * b.gate_stride + h], b.out + t * b.out_stride + int64_t(h) * dv);
  }
}

// ---- prefill: chunks of 64 tokens, WY/UT form (model-math.md 5.5) ----

namespace {
constexpr int kChunk = 64;

// Per-thread scratch, grown once to the largest shapes seen (no allocation per chunk).
struct ChunkScratch {
  std::vector<float> Qc, Kc, KT;  // [n][dk], [n][dk], [dk][n]
  std::vector<float> G, QK;       // [n][n]: K K^T, Q K^T
  std::vector<float> D;           // [n]: one row of exp(gamma_i - gamma_j)
  std::vector<float> L, A;        // [n][n]: beta_i D_ij G_ij (j < i), D_ij QK_ij (j <= i)
  std::vector<float> X;           // [n][dv + dk]: solved [U | -W], then [V' | -W]
  std::vector<float> gamma, eg;   // [n]
  void grow(int dk, int dv) {
    auto g = [](std::vector<float>& v, size_t n) { if (v.size() < n) v.resize(n); };
    g(Qc, size_t(kChunk * dk)); g(Kc, size_t(kChunk * dk)); g(KT, size_t(kChunk * dk));
    g(G, kChunk * kChunk); g(QK, kChunk * kChunk); g(L, kChunk * kChunk); g(A, kChunk * kChunk);
    g(D, kChunk); g(X, size_t(kChunk * (dv + dk))); g(gamma, kChunk); g(eg, kChunk);
  }
};

inline void scale_copy(float* dst, const float* src, int64_t n, float s) {
  const F8 vs = splat(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store(dst + i, vs * load(src + i));
  for (; i < n; ++i) dst[i] = s * src[i];
}

// Rows i of X [n][w] (ld = w): X_i <- X_i - sum_{j<i} L_ij X_j, i.e. X <- (I + L)^{-1} X for the
// strictly lower L: forward substitution, vectorised along the rows.
void forward_substitute(const float* L, int n, float* X, int w) {
  for (int i = 1; i < n; ++i) {
    const float* li = L + int64_t(i) * n;
    float* xi = X + int64_t(i) * w;
    int c = 0;
    for (; c + 32 <= w; c += 32) {
      F8 a0 = load(xi + c), a1 = load(xi + c + 8), a2 = load(xi + c + 16), a3 = load(xi + c + 24);
      for (int j = 0; j < i; ++j) {
        const F8 l = broadcast(li + j);
        const float* xj = X + int64_t(j) * w + c;
        a0 = fnma(l, load(xj), a0);
        a1 = fnma(l, load(xj + 8), a1);
        a2 = fnma(l, load(xj + 16), a2);
        a3 = fnma(l, load(xj + 24), a3);
      }
      store(xi + c, a0);
      store(xi + c + 8, a1);
      store(xi + c + 16, a2);
      store(xi + c + 24, a3);
    }
    for (; c + 8 <= w; c += 8) {
      F8 a0 = load(xi + c);
      for (int j = 0; j < i; ++j) a0 = fnma(broadcast(li + j), load(X + int64_t(j) * w + c), a0);
      store(xi + c, a0);
    }
    for (; c < w; ++c) {
      float a = xi[c];
      for (int j = 0; j < i; ++j) a -= li[j] * X[int64_t(j) * w + c];
      xi[c] = a;
    }
  }
}

// One chunk of n tokens starting at t0 for key head kh and its value heads.
void chunk(const DeltaShape& sh, const DeltaBatch& b, int kh, int64_t t0, int n, float* S, ChunkScratch& w) {
  const int r = sh.value_heads / sh.key_heads, dk = sh.key_dim, dv = sh.value_dim;
  const int xw = dv + dk;
  float *Qc = w.Qc.data(), *Kc = w.Kc.data(), *KT = w.KT.data();
  for (int i = 0; i < n; ++i) {
    const float* q = b.q + (t0 + i) * b.qkv_stride + int64_t(kh) * dk;
    const float* k = b.k + (t0 + i) * b.qkv_stride + int64_t(kh) * dk;
    if (i + 4 < n) {
      // Each token's slice of this head is short and a long way from the next token's (the rows
      // hold every head): fetch a few tokens ahead, v included for the value heads' turn.
      const int64_t ahead = 4 * b.qkv_stride;
      const float* v = b.v + (t0 + i) * b.qkv_stride + int64_t(kh) * r * dv;
      for (int d = 0; d < dk; d += 16) {
        prefetch(q + ahead + d);
        prefetch(k + ahead + d);
      }
      for (int d = 0; d < r * dv; d += 16) prefetch(v + ahead + d);
    }
    std::copy(q, q + dk, Qc + int64_t(i) * dk);
    std::copy(k, k + dk, Kc + int64_t(i) * dk);
    for (int d = 0; d < dk; ++d) KT[int64_t(d) * n + i] = k[d];
  }
  // Shared by the key head's value heads: K K^T and Q K^T.
  gemm(n, n, dk, Kc, dk, KT, n, w.G.data(), n, false);
  gemm(n, n, dk, Qc, dk, KT, n, w.QK.data(), n, false);

  float *gamma = w.gamma.data(), *eg = w.eg.data(), *X = w.X.data(), *L = w.L.data(), *A = w.A.data();
  for (int hh = 0; hh < r; ++hh) {
    const int h = kh * r + hh;
    float* Sh = S + int64_t(h) * dk * dv;
    float acc = 0;
    for (int i = 0; i < n; ++i) {
      acc += b.g[(t0 + i) * b.gate_stride + h];
      gamma[i] = acc;  // cumulative log decay
      eg[i] = std::exp(acc);
    }
    // Right-hand sides [beta V | -beta e^gamma K], then L and the causal decay mask.
    for (int i = 0; i < n; ++i) {
      const float beta = b.beta[(t0 + i) * b.gate_stride + h];
      const float* v = b.v + (t0 + i) * b.qkv_stride + int64_t(h) * dv;
      float* xi = X + int64_t(i) * xw;
      scale_copy(xi, v, dv, beta);
      scale_copy(xi + dv, Kc + int64_t(i) * dk, dk, -beta * eg[i]);
      // D_ij = exp(gamma_i - gamma_j) for j <= i; the difference is clamped at 0 before the
      // exponential so that the masked (j > i) side never overflows.
      const F8 gi = splat(gamma[i]);
      int j = 0;
      for (; j + 8 <= i + 1; j += 8) store(w.D.data() + j, exp(min(gi - load(gamma + j), zero())));
      for (; j <= i; ++j) w.D[size_t(j)] = std::exp(gamma[i] - gamma[j]);
      float* li = L + int64_t(i) * n;
      float* ai = A + int64_t(i) * n;
      const float* gr = w.G.data() + int64_t(i) * n;
      const float* qr = w.QK.data() + int64_t(i) * n;
      for (j = 0; j < i; ++j) li[j] = beta * w.D[size_t(j)] * gr[j];
      for (j = 0; j <= i; ++j) ai[j] = w.D[size_t(j)] * qr[j];
      for (j = i; j < n; ++j) li[j] = 0.0f;
      for (j = i + 1; j < n; ++j) ai[j] = 0.0f;
    }
    forward_substitute(L, n, X, xw);  // X = [U | -W]
    // V' = U - W S (in place over U).
    gemm(n, dv, dk, X + dv, xw, Sh, dv, X, xw, true);
    // O = diag(e^gamma) Q S + (D o Q K^T) V'.
    float* O = b.out + t0 * b.out_stride + int64_t(h) * dv;
    gemm(n, dv, dk, Qc, dk, Sh, dv, O, b.out_stride, false);
    for (int i = 0; i < n; ++i) scale_row(O + i * b.out_stride, dv, eg[i]);
    gemm(n, dv, n, A, n, X, xw, O, b.out_stride, true, true);
    // S <- e^{gamma_n} S + K^T diag(e^{gamma_n - gamma}) V'.
    const float gl = gamma[n - 1];
    scale_row(Sh, int64_t(dk) * dv, std::exp(gl));
    for (int i = 0; i < n; ++i) scale_row(X + int64_t(i) * xw, dv, std::exp(gl - gamma[i]));
    gemm(dk, dv, n, KT, n, X, xw, Sh, dv, true);
  }
}
}  // namespace

void chunked_key_head(const DeltaShape& sh, const DeltaBatch& b, int kh, float* S) {
  thread_local ChunkScratch w;
  w.grow(sh.key_dim, sh.value_dim);
  for (int64_t t0 = 0; t0 < b.T; t0 += kChunk)
    chunk(sh, b, kh, t0, int(std::min<int64_t>(kChunk, b.T - t0)), S, w);
}

// ---- conv, norms ----

void conv_silu(float* x, int64_t T, int64_t C, const float* w, int K, float* state) {
  // K = 4 (both models) here; other kernel sizes go to the scalar path in delta_net.cpp.
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) {
    F8 wj[4];  // tap j of channels c .. c + 7
    load_deinterleave4(w + c * 4, wj);
    const F8 w0 = wj[0], w1 = wj[1], w2 = wj[2], w3 = wj[3];
    F8 h0 = load(state + c), h1 = load(state + C + c), h2 = load(state + 2 * C + c);
    for (int64_t t = 0; t < T; ++t) {
      float* xt = x + t * C + c;
      const F8 cur = load(xt);
      F8 acc = w3 * cur;
      acc = fma(w0, h0, acc);
      acc = fma(w1, h1, acc);
      acc = fma(w2, h2, acc);
      store(xt, silu(acc));
      h0 = h1;
      h1 = h2;
      h2 = cur;
    }
    store(state + c, h0);
    store(state + C + c, h1);
    store(state + 2 * C + c, h2);
  }
  for (; c < C; ++c) {
    float h0 = state[c], h1 = state[C + c], h2 = state[2 * C + c];
    const float* wc = w + c * 4;
    for (int64_t t = 0; t < T; ++t) {
      const float cur = x[t * C + c];
      const float a = wc[3] * cur + wc[0] * h0 + wc[1] * h1 + wc[2] * h2;
      x[t * C + c] = a / (1.0f + std::exp(-a));
      h0 = h1;
      h1 = h2;
      h2 = cur;
    }
    state[c] = h0;
    state[C + c] = h1;
    state[2 * C + c] = h2;
  }
}

void l2_norm_heads(float* x, int heads, int n, float eps, float scale) {
  for (int h = 0; h < heads; ++h) {
    float* xh = x + int64_t(h) * n;
    const float inv = 1.0f / std::sqrt(dot(xh, xh, n) + eps) * scale;
    scale_row(xh, n, inv);
  }
}

void gated_rms_norm(float* o, const float* z, const float* w, int heads, int n, float eps) {
  for (int h = 0; h < heads; ++h) {
    float* oh = o + int64_t(h) * n;
    const float* zh = z + int64_t(h) * n;
    const float inv = 1.0f / std::sqrt(dot(oh, oh, n) / float(n) + eps);
    const F8 vi = splat(inv);
    int j = 0;
    for (; j + 8 <= n; j += 8) store(oh + j, load(oh + j) * vi * load(w + j) * silu(load(zh + j)));
    for (; j < n; ++j) oh[j] = oh[j] * inv * w[j] * (zh[j] / (1.0f + std::exp(-zh[j])));
  }
}

}  // namespace gdn::vec
}  // namespace swiftlet
