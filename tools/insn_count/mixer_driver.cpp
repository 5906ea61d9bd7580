// Runs one token-mixer or activation kernel REPEAT times on one thread, for
// tools/insn_count/mixers.sh, which counts under qemu-aarch64 the instructions the calls execute.
//   mixer_driver reference|fast OP REPEAT
// OP and its shape (the 80B's mixer shapes, model-math.md 1.1, with fewer heads where the count
// per element does not depend on them):
//   silu_mul       4096 elements (an expert's intermediate row is 512: 8 rows)
//   sigmoid_gate   4096 elements (16 heads x 256, the attention output gate)
//   conv_silu      one token, 8192 channels, kernel 4 (the DeltaNet's q, k, v)
//   l2_norm        16 heads x 128
//   gated_rms_norm 32 heads x 128
//   delta_decode   one token, 2 key / 4 value heads x 128 x 128 (the state: 65,536 values)
//   delta_prompt   64 tokens, the same heads, in chunks (the reference: token by token)
//   attend_decode  one row at position 255: 16 query / 2 KV heads x 256
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/mixers.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

std::vector<float> random_vec(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace swiftlet;
  if (argc != 4) {
    std::fprintf(stderr, "usage: mixer_driver reference|fast OP REPEAT\n");
    return 2;
  }
  try {
    const std::string form = argv[1], op = argv[2];
    const int repeat = std::atoi(argv[3]);
    if (form != "reference" && form != "fast") fail("form must be reference or fast, not '{}'", form);
    if (repeat <= 0) fail("REPEAT must be positive");
    const MixerKernels& k = mixers_for(form == "reference" ? Backend::Reference : Backend::Cpu);
    ThreadPool::set_global_threads(1);  // one thread: no pool in the count
    std::mt19937 rng(1);
    double check = 0;
    if (op == "silu_mul" || op == "sigmoid_gate") {
      std::vector<float> a = random_vec(4096, rng, 3.0f);
      const std::vector<float> b = random_vec(4096, rng, 3.0f);
      for (int i = 0; i < repeat; ++i) (op == "silu_mul" ? k.silu_mul : k.sigmoid_gate)(a.data(), b.data(), 4096);
      check = a[0];
    } else if (op == "conv_silu") {
      const int64_t C = 8192;
      std::vector<float> x = random_vec(size_t(C), rng), state = random_vec(size_t(3 * C), rng);
      const std::vector<float> w = random_vec(size_t(4 * C), rng, 0.5f);
      for (int i = 0; i < repeat; ++i) k.conv_silu(x.data(), 1, C, w.data(), 4, state.data());
      check = x[0];
    } else if (op == "l2_norm") {
      std::vector<float> x = random_vec(16 * 128, rng);
      for (int i = 0; i < repeat; ++i) k.l2_norm_heads(x.data(), 16, 128, 1e-6f, 1.0f);
      check = x[0];
    } else if (op == "gated_rms_norm") {
      std::vector<float> o = random_vec(32 * 128, rng);
      const std::vector<float> z = random_vec(32 * 128, rng), w = random_vec(128, rng);
      for (int i = 0; i < repeat; ++i) k.gated_rms_norm(o.data(), z.data(), w.data(), 32, 128, 1e-6f);
      check = o[0];
    } else if (op == "delta_decode" || op == "delta_prompt") {
      const gdn::DeltaShape sh{2, 4, 128, 128};
      const int64_t T = op == "delta_decode" ? 1 : 64, stride = 2 * 2 * 128 + 4 * 128;
      std::vector<float> qkv = random_vec(size_t(T * stride), rng, 0.08f), g(size_t(T * 4)), beta(g.size());
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = -0.1f - 0.05f * float(i % 7);
        beta[i] = 0.3f + 0.05f * float(i % 5);
      }
      std::vector<float> S = random_vec(size_t(4 * 128 * 128), rng, 0.1f), out(size_t(T * 4 * 128));
      gdn::DeltaBatch b;
      b.T = T;
      b.q = qkv.data();
      b.k = qkv.data() + 2 * 128;
      b.v = qkv.data() + 4 * 128;
      b.qkv_stride = stride;
      b.g = g.data();
      b.beta = beta.data();
      b.gate_stride = 4;
      b.out = out.data();
      b.out_stride = 4 * 128;
      for (int i = 0; i < repeat; ++i) (T == 1 ? k.delta_rule : k.delta_rule_chunked)(sh, b, S.data());
      check = out[0];
    } else if (op == "attend_decode") {
      const attn::AttnShape sh{16, 2, 256};
      const int64_t pos = 255, kv = 2 * 256;
      const std::vector<float> q = random_vec(16 * 256, rng), K = random_vec(size_t((pos + 1) * kv), rng),
                               V = random_vec(size_t((pos + 1) * kv), rng);
      std::vector<float> out(16 * 256);
      attn::AttnBatch b;
      b.T = 1;
      b.pos0 = pos;
      b.q = q.data();
      b.q_stride = 16 * 256;
      b.K = K.data();
      b.V = V.data();
      b.kv_stride = kv;
      b.scale = 1.0f / 16.0f;
      b.out = out.data();
      b.out_stride = 16 * 256;
      for (int i = 0; i < repeat; ++i) k.attend(sh, b);
      check = out[0];
    } else {
      fail("unknown OP '{}'", op);
    }
    std::printf("%s %s x%d: %g\n", form.c_str(), op.c_str(), repeat, check);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mixer_driver: %s\n", e.what());
    return 1;
  }
  return 0;
}
