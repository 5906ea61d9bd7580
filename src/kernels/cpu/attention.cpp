#include "kernels/cpu/attention.h"

#include "core/thread_pool.h"
#include "kernels/cpu/ops_ref.h"
#include "kernels/cpu/simd_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace swiftlet::attn {

#if SWIFTLET_F8_KERNELS
// In attention_simd.cpp; call only when simd::cpu_runs_f8().
namespace vec {
void attend_rows(const float* q, int nh, int nkv, int hd, const float* K, const float* V, int64_t stride,
                 int64_t s0, int64_t s1, float scale, float* o, float* m, float* l);
void sigmoid_gate(float* o, const float* gate, int64_t n);
}  // namespace vec
#endif

void attend_reference(const AttnShape& sh, const AttnBatch& b) {
  const int nh = sh.heads, hd = sh.head_dim, group = sh.heads / sh.kv_heads;
  std::vector<float> sc(size_t(b.pos0 + b.T));
  for (int64_t t = 0; t < b.T; ++t) {
    const int64_t n = b.pos0 + t + 1;
    for (int j = 0; j < nh; ++j) {
      const float* qj = b.q + t * b.q_stride + int64_t(j) * hd;
      const int64_t off = int64_t(j / group) * hd;
      for (int64_t s = 0; s < n; ++s) {
        const float* ks = b.K + s * b.kv_stride + off;
        double acc = 0;
        for (int d = 0; d < hd; ++d) acc += double(qj[d]) * ks[d];
        sc[size_t(s)] = float(acc) * b.scale;
      }
      ref::softmax(sc.data(), n);
      float* oj = b.out + t * b.out_stride + int64_t(j) * hd;
      std::fill(oj, oj + hd, 0.0f);
      for (int64_t s = 0; s < n; ++s) {
        const float* vs = b.V + s * b.kv_stride + off;
        for (int d = 0; d < hd; ++d) oj[d] += sc[size_t(s)] * vs[d];
      }
    }
  }
}

namespace {
// A query row over n cache rows is split into parts (flash-decoding) so that one decoded token
// uses every thread. Prefill rows use the same split, done in turn: a row's result then does not
// depend on whether it was prefilled or decoded, so prefix reuse stays exact.
int parts_for(int64_t n, int threads) { return int(std::max<int64_t>(1, std::min<int64_t>(threads, n / 512))); }

struct RowScratch {
  std::vector<float> o;   // [parts][nh][hd] unnormalised part outputs
  std::vector<float> ml;  // [parts][2][nh] part max and sum
  void grow(int parts, int nh, int hd) {
    if (o.size() < size_t(parts * nh * hd)) o.resize(size_t(parts * nh * hd));
    if (ml.size() < size_t(parts * nh * 2)) ml.resize(size_t(parts * nh * 2));
  }
};

void run_part(const AttnShape& sh, const AttnBatch& b, const float* q, int64_t n, int parts, int p, RowScratch& w) {
#if SWIFTLET_F8_KERNELS
  const int nh = sh.heads, hd = sh.head_dim;
  vec::attend_rows(q, nh, sh.kv_heads, hd, b.K, b.V, b.kv_stride, n * p / parts, n * (p + 1) / parts, b.scale,
                   w.o.data() + p * nh * hd, w.ml.data() + p * nh * 2, w.ml.data() + p * nh * 2 + nh);
#endif
}

// out[j] = sum_p e^(m_p - m) o_p / sum_p e^(m_p - m) l_p
void merge(int nh, int hd, int parts, const RowScratch& w, float* out) {
  for (int j = 0; j < nh; ++j) {
    float mx = -INFINITY;
    for (int p = 0; p < parts; ++p) mx = std::max(mx, w.ml[size_t(p * nh * 2 + j)]);
    float* o = out + int64_t(j) * hd;
    std::fill(o, o + hd, 0.0f);
    float l = 0;
    for (int p = 0; p < parts; ++p) {
      const float s = std::exp(w.ml[size_t(p * nh * 2 + j)] - mx);
      l += s * w.ml[size_t(p * nh * 2 + nh + j)];
      const float* po = w.o.data() + (p * nh + j) * hd;
      for (int d = 0; d < hd; ++d) o[d] += s * po[d];
    }
    const float inv = 1.0f / l;
    for (int d = 0; d < hd; ++d) o[d] *= inv;
  }
}
}  // namespace

void attend(const AttnShape& sh, const AttnBatch& b) {
  const int nh = sh.heads, nkv = sh.kv_heads, hd = sh.head_dim;
  const int blocks = nkv * ((nh / nkv + 7) / 8);
  if (!simd::cpu_runs_f8() || hd % 8 != 0 || blocks > 64) return attend_reference(sh, b);
  ThreadPool& pool = ThreadPool::global();
  const int threads = pool.size();
  if (b.T > 1) {
    // Prefill: one task per query row, its parts in turn, with the scratch of the thread that
    // runs it (grown once, no allocation per call).
    auto row = [&](int64_t t) {
      thread_local RowScratch w;
      const int64_t n = b.pos0 + t + 1;
      const int parts = parts_for(n, threads);
      w.grow(parts, nh, hd);
      for (int p = 0; p < parts; ++p) run_part(sh, b, b.q + t * b.q_stride, n, parts, p, w);
      merge(nh, hd, parts, w, b.out + t * b.out_stride);
    };
    if (threads <= 1 || b.T * (b.pos0 + b.T) < 256) {
      for (int64_t t = 0; t < b.T; ++t) row(t);
    } else {
      pool.parallel_for(b.T, [&row](int64_t t) { row(t); });  // one pointer: no allocation
    }
    return;
  }
  // Decode: the parts on the threads, merged here.
  thread_local RowScratch w;
  const int64_t n = b.pos0 + 1;
  const int parts = parts_for(n, threads);
  w.grow(parts, nh, hd);
  if (parts == 1) {
    run_part(sh, b, b.q, n, 1, 0, w);
  } else {
    // One captured pointer keeps the std::function small (no allocation per token); it also
    // hands the workers this thread's scratch rather than their own thread_local one.
    struct Ctx {
      const AttnShape& sh;
      const AttnBatch& b;
      int64_t n;
      int parts;
      RowScratch& w;
    } ctx{sh, b, n, parts, w};
    pool.parallel_for(parts, [c = &ctx](int64_t p) { run_part(c->sh, c->b, c->b.q, c->n, c->parts, int(p), c->w); });
  }
  merge(nh, hd, parts, w, b.out);
}

void sigmoid_gate_reference(float* o, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] *= ref::sigmoid(gate[i]);
}

void sigmoid_gate(float* o, const float* gate, int64_t n) {
#if SWIFTLET_F8_KERNELS
  if (simd::cpu_runs_f8()) return vec::sigmoid_gate(o, gate, n);
#endif
  sigmoid_gate_reference(o, gate, n);
}

}  // namespace swiftlet::attn
