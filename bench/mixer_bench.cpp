// The token mixers at the 80B's shapes (model-math.md 1.1): one attention decode step against a
// growing KV cache (cost per token should grow linearly: the µs per 1k of context ~flat), and the
// Gated DeltaNet delta rule: one decode step per layer, and a 512-token prefill chunked vs token
// by token.
//   build/bin/swiftlet_bench_mixer [--threads N] [--max-ctx 32768]
#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/delta_net.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace swiftlet;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

// Best time of fn over repetitions, running for at least `budget` seconds (and 3 runs).
template <typename F>
double best_seconds(F&& fn, double budget = 0.3) {
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 3 || total < budget; ++rep) {
    auto t0 = Clock::now();
    fn();
    const double s = seconds(t0);
    best = std::min(best, s);
    total += s;
    if (rep > 10000) break;
  }
  return best;
}

std::vector<float> random_vec(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

void bench_attention(int64_t max_ctx) {
  const attn::AttnShape sh{16, 2, 256};  // 80B full attention: 16 query heads, 2 KV heads, 256
  const int64_t qs = int64_t(sh.heads) * sh.head_dim, kvs = int64_t(sh.kv_heads) * sh.head_dim;
  const std::vector<float> K = random_vec(size_t(max_ctx * kvs), 1), V = random_vec(size_t(max_ctx * kvs), 2);
  const std::vector<float> q = random_vec(size_t(qs), 3);
  std::vector<float> out(static_cast<size_t>(qs));
  fmt::print("attention decode step, 16 q heads / 2 kv heads x 256, fp32 KV cache ({} KiB per position)\n",
             kvs * 2 * 4 / 1024);
  fmt::print("  {:>7} {:>12} {:>14} {:>14}\n", "context", "µs/token", "µs per 1k ctx", "KV GB/s");
  for (int64_t ctx = 1024; ctx <= max_ctx; ctx *= 2) {
    attn::AttnBatch b{1, ctx - 1, q.data(), qs, K.data(), V.data(), kvs, 1.0f / 16.0f, out.data(), qs};
    const double s = best_seconds([&] { attn::attend(sh, b); });
    fmt::print("  {:>7} {:>12.1f} {:>14.2f} {:>14.1f}\n", ctx, s * 1e6, s * 1e6 / (double(ctx) / 1024),
               double(ctx * kvs * 2 * 4) / s / 1e9);
  }
  attn::AttnBatch b{1, 1023, q.data(), qs, K.data(), V.data(), kvs, 1.0f / 16.0f, out.data(), qs};
  const double s = best_seconds([&] { attn::attend_reference(sh, b); }, 0.1);
  fmt::print("  scalar reference loop at context 1024: {:.1f} µs/token\n", s * 1e6);
}

struct Delta {
  gdn::DeltaShape sh{16, 32, 128, 128};  // 80B Gated DeltaNet: 16 key heads, 32 value heads, 128
  int64_t T;
  std::vector<float> qkv, g, beta, out;
  int64_t stride() const { return 2 * int64_t(sh.key_heads) * sh.key_dim + int64_t(sh.value_heads) * sh.value_dim; }
  size_t state_floats() const { return size_t(sh.value_heads) * sh.key_dim * sh.value_dim; }
  explicit Delta(int64_t T_) : T(T_) {
    qkv = random_vec(size_t(T * stride()), 4);
    const int64_t kd = int64_t(sh.key_heads) * sh.key_dim;
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < 2 * sh.key_heads; ++h) {
        float* x = qkv.data() + t * stride() + int64_t(h) * sh.key_dim;
        float ss = 0;
        for (int i = 0; i < sh.key_dim; ++i) ss += x[i] * x[i];
        for (int i = 0; i < sh.key_dim; ++i) x[i] /= std::sqrt(ss) * (h < sh.key_heads ? std::sqrt(float(sh.key_dim)) : 1.0f);
      }
    (void)kd;
    g = random_vec(size_t(T * sh.value_heads), 5, 0.1f);
    for (float& x : g) x = -std::fabs(x);
    beta.assign(g.size(), 0.5f);
    out.resize(size_t(T * sh.value_heads * sh.value_dim));
  }
  gdn::DeltaBatch batch(int64_t t0, int64_t n) {
    const int64_t kd = int64_t(sh.key_heads) * sh.key_dim;
    gdn::DeltaBatch b;
    b.T = n;
    b.q = qkv.data() + t0 * stride();
    b.k = b.q + kd;
    b.v = b.q + 2 * kd;
    b.qkv_stride = stride();
    b.g = g.data() + t0 * sh.value_heads;
    b.beta = beta.data() + t0 * sh.value_heads;
    b.gate_stride = sh.value_heads;
    b.out = out.data() + t0 * sh.value_heads * sh.value_dim;
    b.out_stride = int64_t(sh.value_heads) * sh.value_dim;
    return b;
  }
};

void bench_delta_net() {
  fmt::print("\nGated DeltaNet delta rule, 16 key heads / 32 value heads x 128 (state 2 MiB per layer)\n");
  {
    Delta d(1);
    std::vector<float> S(d.state_floats(), 0.0f);
    const double fast = best_seconds([&] { gdn::delta_rule_recurrent(d.sh, d.batch(0, 1), S.data()); });
    const double ref = best_seconds([&] { gdn::delta_rule_reference(d.sh, d.batch(0, 1), S.data()); }, 0.1);
    // 36 layers' states (72 MiB, more than the L3) visited in turn, as in a real decode step.
    std::vector<std::vector<float>> states(36, std::vector<float>(d.state_floats(), 0.0f));
    const double cold = best_seconds([&] {
      for (auto& s : states) gdn::delta_rule_recurrent(d.sh, d.batch(0, 1), s.data());
    }) / 36;
    fmt::print("  decode step: {:.1f} µs/layer (state in cache), {:.1f} µs/layer (36 layers' states "
               "in turn), scalar reference {:.1f} µs/layer\n", fast * 1e6, cold * 1e6, ref * 1e6);
  }
  for (int64_t T : {64, 512}) {
    Delta d(T);
    std::vector<float> S(d.state_floats(), 0.0f);
    const double chunked = best_seconds([&] { gdn::delta_rule_chunked(d.sh, d.batch(0, T), S.data()); });
    const double rec = best_seconds([&] { gdn::delta_rule_recurrent(d.sh, d.batch(0, T), S.data()); });
    const double ref = T <= 64 ? best_seconds([&] { gdn::delta_rule_reference(d.sh, d.batch(0, T), S.data()); }, 0.1) : 0;
    fmt::print("  prefill {:>3} tokens: chunked {:>7.0f} tok/s, fused recurrent {:>7.0f} tok/s", T, double(T) / chunked,
               double(T) / rec);
    if (ref > 0) fmt::print(", scalar reference {:>6.0f} tok/s", double(T) / ref);
    fmt::print("  (per layer)\n");
  }
  // Small chunks, where the chunked form's fixed cost shows (speculative / short prompts).
  for (int64_t T : {2, 4, 8, 16, 32}) {
    Delta d(T);
    std::vector<float> S(d.state_floats(), 0.0f);
    const double chunked = best_seconds([&] { gdn::delta_rule_chunked(d.sh, d.batch(0, T), S.data()); }, 0.1);
    const double rec = best_seconds([&] { gdn::delta_rule_recurrent(d.sh, d.batch(0, T), S.data()); }, 0.1);
    fmt::print("  T = {:>2}: chunked {:>7.1f} µs, fused recurrent {:>7.1f} µs\n", T, chunked * 1e6, rec * 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  int64_t max_ctx = 32768;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::stoi(argv[i + 1]);
    else if (a == "--max-ctx") max_ctx = std::stoll(argv[i + 1]);
  }
  if (threads > 0) ThreadPool::set_global_threads(threads);
  fmt::print("threads {}\n", ThreadPool::global().size());
  bench_attention(max_ctx);
  bench_delta_net();
}
