// GPU decode throughput (issue 8) on a real container, for several VRAM expert-cache sizes, with
// the ceilings measured in the same run: HBM bandwidth (device-to-device copy, bytes read +
// written), host-to-device upload from pinned and pageable memory. Prints tok/s, the HBM bound
// (bytes one token must read / HBM bandwidth) and how close decode gets to it, the VRAM cache's hit
// rate and upload rate, GPU memory used and the peak host RSS.
//
// Then a prompt of --prompt-tokens tokens (default 512) through a fresh session: the batched
// prefill's tok/s (second run; the first allocates), against decode's, with the prompt's products
// on the tensor cores and in fp32 alternately; with --trace, the prompt's kernel timeline.
//
// Usage: swiftlet_bench_gpu_decode MODEL.qpack [--tokens N] [--gpu-cache-gb 4,8,all]
// [--host-cache-gb G|all] [--prompt-tokens N] [--trace STEPS (default 8; 0: off; CUPTI builds)]
// With random weights (the synthetic containers) routing is near uniform: the hit rate of a
// partial cache is a worst case; real models route with much more locality.
#include "core/sys_stats.h"
#include "experts/expert_slots.h"
#include "kernels/cuda/cuda_kernels.h"
#include "model/gpu_forward.h"
#include "runtime/model_loader.h"
#include "runtime/sampler.h"

#ifdef SWIFTLET_HAVE_CUPTI
#include "gpu_trace.h"
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace swiftlet;
namespace cu = swiftlet::cuda;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Ceilings {
  double hbm_gb_s = 0, h2d_pinned_gb_s = 0, h2d_pageable_gb_s = 0;
};

Ceilings measure_ceilings() {
  Ceilings c;
  const size_t n = size_t(2) << 30;  // 2 GiB: far past the 60 MB L2
  void* a = cu::gpu_alloc(n);
  void* b = cu::gpu_alloc(n);
  cu::gpu_memset(a, 1, n);
  const double ms = cu::gpu_time_ms([&] { cu::gpu_copy(b, a, n); }, 10);
  c.hbm_gb_s = 2.0 * double(n) / 1e9 / (ms / 1e3);
  const size_t h = size_t(1) << 30;
  void* pinned = cu::gpu_alloc_pinned(h);
  std::memset(pinned, 3, h);
  c.h2d_pinned_gb_s = double(h) / 1e9 / (cu::gpu_time_ms([&] { cu::gpu_upload(a, pinned, h); }, 5) / 1e3);
  std::vector<uint8_t> pageable(h, 5);
  c.h2d_pageable_gb_s = double(h) / 1e9 / (cu::gpu_time_ms([&] { cu::gpu_upload(a, pageable.data(), h); }, 3) / 1e3);
  cu::gpu_free_pinned(pinned);
  cu::gpu_free(a);
  cu::gpu_free(b);
  return c;
}

// Bytes one decode token must read from VRAM: every dense matrix but the embedding (one row), the
// lm_head, the top-k experts of every layer, and the DeltaNet states (read and written).
double bytes_per_token(const Model& m, const GpuStats& s) {
  const ModelConfig& c = m.config;
  double dense = double(s.dense_bytes);
  if (!c.tie_word_embeddings) dense -= double(cu::matrix_device_bytes(m.weights.embed_tokens));
  const double experts = double(c.num_experts_per_tok) * c.num_layers * double(s.slot_bytes);
  const double state = 2.0 * 4.0 * c.num_linear_layers() *
                       (double(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim +
                        double(c.linear_conv_kernel_dim - 1) * double(c.conv_dim()));
  return dense + experts + state;
}

// Microseconds per launch (back to back, 200 launches) of the small per-token kernels at this
// model's shapes, and their share of one token: the fixed cost the weight products sit among.
void op_breakdown(const ModelConfig& c, double ms_per_token) {
  const int64_t H = c.hidden_size, C = c.conv_dim(), I = c.moe_intermediate_size;
  const int k = c.num_experts_per_tok, hk = c.linear_num_key_heads, hv = c.linear_num_value_heads;
  const int dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  const int hd = c.head_dim;
  const size_t big = size_t(64) << 20;
  auto* a = static_cast<float*>(cu::gpu_alloc(big));
  auto* b = static_cast<float*>(cu::gpu_alloc(big));
  auto* w = static_cast<float*>(cu::gpu_alloc(big));
  auto* st = static_cast<float*>(cu::gpu_alloc(big));
  auto* ids = static_cast<int32_t*>(cu::gpu_alloc(1024));
  auto* pos = static_cast<int64_t*>(cu::gpu_alloc(64));
  cu::gpu_memset(a, 0, big);
  cu::gpu_memset(b, 0, big);
  cu::gpu_memset(w, 0, big);
  cu::gpu_memset(st, 0, big);
  cu::set_step(ids, 0, pos, 99);
  const int L = c.num_layers, Ll = c.num_linear_layers(), La = L - Ll;
  struct Op {
    const char* name;
    int per_token;
    std::function<void()> fn;
  };
  const std::vector<Op> ops = {
      {"rms_norm", L + 1, [&] { cu::rms_norm(a, w, 1, H, 1e-6f, b); }},
      {"add_rms_norm", L, [&] { cu::add_rms_norm(a, b, w, H, 1e-6f, st); }},
      {"router_topk", L, [&] { cu::router_topk(a, 1, c.num_experts, k, true, ids, b); }},
      {"silu_mul (shared+experts)", 2 * L, [&] { cu::silu_mul(a, b, k * I, a); }},
      {"moe_finish_rows", L, [&] { cu::moe_finish_rows(a, b, w, st, w, 1, k, H); }},
      {"attn_prep", La,
       [&] { cu::attn_prep(a, b, b, w, w, nh, nkv, hd, true, c.rotary_dim(), 0, pos, 1e7f, 1e-6f, st, st, a, b); }},
      {"attention_decode n=100", La, [&] { cu::attention_decode_at(a, b, b, 0, pos, nh, nkv, hd, 0.06f, w, st); }},
      {"conv1d_silu_step", Ll, [&] { cu::conv1d_silu_step(a, w, b, C, c.linear_conv_kernel_dim, st); }},
      {"l2_norm_qk", Ll, [&] { cu::l2_norm_qk(a, hk, dk, 1e-6f, 0.1f); }},
      {"delta_rule_step", Ll, [&] { cu::delta_rule_step(a, a, a, w, w, w, w, st, hk, hv, dk, dv, b); }},
      {"gated_rms_norm", Ll, [&] { cu::gated_rms_norm(a, b, w, hv, dv, 1e-6f); }},
  };
  double total_us = 0;
  std::printf("\nthe unfused small ops of the earlier decode path (reference; decode now uses the fused\n"
              "kernels of kernels/cuda/matvec.cu and moe_experts.cu, timed by swiftlet_bench_cuda):\n");
  std::printf("%-28s %10s %10s %12s\n", "small op", "us/launch", "per token", "us/token");
  for (const Op& op : ops) {
    const double us = 1e3 * cu::gpu_time_ms(op.fn, 200);
    total_us += us * op.per_token;
    std::printf("%-28s %10.2f %10d %12.1f\n", op.name, us, op.per_token, us * op.per_token);
  }
  std::printf(
      "those small ops: %.0f us against the %.0f us a token takes now (%.0f%%)\n",
      total_us, 1e3 * ms_per_token, 100 * total_us / (1e3 * ms_per_token));
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(w), static_cast<void*>(st),
                  static_cast<void*>(ids), static_cast<void*>(pos)})
    cu::gpu_free(p);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s MODEL [--tokens N] [--gpu-cache-gb 4,8,all] "
                 "[--host-cache-gb G|all]\n",
                 argv[0]);
    return 2;
  }
  std::string model = argv[1], caches = "4,8,all", host_cache;
  int tokens = 64, prompt_tokens = 512, trace_steps = 8;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--tokens")
      tokens = std::atoi(v.c_str());
    else if (k == "--gpu-cache-gb")
      caches = v;
    else if (k == "--host-cache-gb")
      host_cache = v;
    else if (k == "--prompt-tokens")
      prompt_tokens = std::atoi(v.c_str());
    else if (k == "--trace")
      trace_steps = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    std::string why;
    if (!cu::cuda_available(&why)) {
      std::fprintf(stderr, "no usable GPU: %s\n", why.c_str());
      return 1;
    }
    std::printf("device: %s\n", cu::device_description().c_str());
    const Ceilings ceil = measure_ceilings();
    std::printf(
        "HBM (D2D copy, read+write): %.0f GB/s | H2D pinned %.1f GB/s "
        "| H2D pageable %.1f GB/s\n",
        ceil.hbm_gb_s, ceil.h2d_pinned_gb_s, ceil.h2d_pageable_gb_s);

    LoadOptions lo;
    lo.verify_experts = false;
    if (host_cache == "all")
      lo.cache_bytes = 0;
    else if (!host_cache.empty())
      lo.cache_bytes = uint64_t(std::atof(host_cache.c_str()) * 1e9);
    lo.cache_alloc = gpu_host_alloc;
    lo.cache_free = gpu_host_free;
    const auto t_load = Clock::now();
    auto lm = load_model(model, lo);
    const Model& m = lm->model;
    const ModelConfig& c = m.config;
    std::printf("model: %s, %d layers, %d experts (top %d), loaded in %.1f s\n", model.c_str(), c.num_layers,
                c.num_experts, c.num_experts_per_tok, seconds_since(t_load));

    std::printf("\n%-8s %8s %9s %8s %9s %9s %9s %10s %9s %9s %9s\n", "cache", "tok/s", "ms/tok", "hit%", "miss/tok",
                "H2D GB/s", "GPU GB", "bytes/tok", "bound t/s", "%bound", "RSS GB");
    for (const std::string& cs : split(caches)) {
      GpuOptions go;
      go.cache_bytes = cs == "all" ? 0 : size_t(std::atof(cs.c_str()) * 1e9);
      go.make_slots = make_expert_slots;
      const auto t0 = Clock::now();
      auto g = make_gpu_model(m, go, &why);
      if (!g) {
        std::fprintf(stderr, "GPU model: %s\n", why.c_str());
        return 1;
      }
      const double setup_s = seconds_since(t0);
      auto f = make_gpu_forward(g);
      SessionState st = SessionState::create(c);
      std::vector<float> logits;
      std::vector<int32_t> prompt;
      for (int i = 0; i < 8; ++i) prompt.push_back(int32_t((i * 7919 + 13) % c.vocab_size));
      f->run(st, prompt, LogitsMode::Last, logits);
      // n greedy steps on fp from the logits at hand (picked by the CLI's sampler: a plain
      // std::max_element over the vocabulary took ~0.5 ms a step); the seconds they took.
      SamplingParams greedy_params;
      greedy_params.greedy = true;
      Sampler greedy(greedy_params, c.vocab_size);
      auto decode = [&](ForwardPass& fp, SessionState& s, int n) {
        const auto t0 = Clock::now();
        for (int i = 0; i < n; ++i) {
          const int32_t t = greedy.sample(logits, {});
          fp.run(s, std::span(&t, 1), LogitsMode::Last, logits);
        }
        return seconds_since(t0);
      };
      decode(*f, st, 8);  // warm-up
      const GpuStats before = gpu_stats(*g);
      const double dt = decode(*f, st, tokens);
      const GpuStats after = gpu_stats(*g);
      size_t free_b = 0, total_b = 0;
      cu::device_memory(&free_b, &total_b);
      const double tok_s = tokens / dt;
      const std::string host_timing = gpu_host_timing(*f);
      const uint64_t hits = after.hits - before.hits, misses = after.misses - before.misses;
      const double up_bytes = double(after.bytes_uploaded - before.bytes_uploaded);
      const double up_s = after.upload_seconds - before.upload_seconds;
      const double bpt = bytes_per_token(m, after);
      const double bound = ceil.hbm_gb_s * 1e9 / bpt;
      std::printf(
          "%-8s %8.2f %9.3f %8.1f %9.1f %9.2f %9.2f %9.2fG %9.0f %8.1f%% "
          "%9.2f\n",
          cs.c_str(), tok_s, 1e3 * dt / tokens, hits + misses ? 100.0 * double(hits) / double(hits + misses) : 0.0,
          double(misses) / tokens, up_s > 0 ? up_bytes / 1e9 / up_s : 0.0, double(total_b - free_b) / 1e9, bpt / 1e9,
          bound, 100.0 * tok_s / bound, double(peak_rss_bytes()) / 1e9);
      std::printf("         (%s; set-up %.1f s", gpu_summary(*g).c_str(), setup_s);
      if (after.preload_bytes)
        std::printf(
            ", preload %.2f GB in %.1f s: %.2f GB/s incl. host reads, "
            "upload part %.1f s",
            double(after.preload_bytes) / 1e9, after.preload_seconds,
            double(after.preload_bytes) / 1e9 / after.preload_seconds, after.preload_upload_seconds);
      std::printf(")\n");
      if (!host_timing.empty()) std::printf("         %s", host_timing.c_str());
      // Decode tok/s of a forward pass on a fresh session after the short prompt.
      auto fresh_decode_tok_s = [&](ForwardPass& fp) {
        SessionState s = SessionState::create(c);
        fp.run(s, prompt, LogitsMode::Last, logits);
        return tokens / decode(fp, s, tokens);
      };
      std::vector<int32_t> long_prompt;
      for (int i = 0; i < std::max(prompt_tokens, 2); ++i)
        long_prompt.push_back(int32_t((i * 7919 + 101) % c.vocab_size));
      if (after.all_resident) {
#ifdef SWIFTLET_HAVE_CUPTI
        if (trace_steps > 0) {  // the kernel timeline of a few steps of the decode just measured
          bench::trace_start();
          decode(*f, st, trace_steps);
          std::printf("\n%s\n", bench::trace_summary(bench::trace_stop(), trace_steps).c_str());
        }
#endif
#ifdef SWIFTLET_GPU_PROBE
        for (int rep = 0; rep < 2; ++rep) {  // phase timestamps of one step (the last layer's kernels)
          swiftlet::cuda::probe_begin();
          decode(*f, st, 1);
          std::printf("%s\n", swiftlet::cuda::probe_end().c_str());
        }
#endif
        // Launch settings of the fused kernels (PDL, blocks per SM of the products), each in a
        // fresh forward pass (its own graph); the default comes last again.
        struct Variant {
          const char* name;
          bool pdl;
          int bps;
          bool stream;  // the streamed products (TMA tiles in shared memory)
          int warps;    // per block of the streamed products
          bool tc;      // their arithmetic on the tensor cores
        };
        for (const Variant& v :
             {Variant{"no PDL", false, 0, true, 16, true}, Variant{"not streamed", true, 0, false, 8, false},
              Variant{"not streamed, no PDL", false, 0, false, 8, false},
              Variant{"streamed, 8 warps", true, 0, true, 8, false},
              Variant{"streamed, no tensor cores", true, 0, true, 16, false},
              Variant{"default (PDL)", true, 0, true, 16, true}}) {
          cu::set_fused_launch(v.pdl, v.bps);
          cu::set_streamed_products(v.stream, v.warps);
          cu::set_tensor_core_products(v.tc);
          std::printf("         %-26s %.2f tok/s\n", v.name, fresh_decode_tok_s(*make_gpu_forward(g)));
        }
        op_breakdown(c, 1e3 * dt / tokens);
        // Where a step's and a prompt's time goes, part by part (timing events between the parts,
        // decode without the graph).
        auto fp = make_gpu_forward(g, /*profile=*/true);
        const double profiled_tok_s = fresh_decode_tok_s(*fp);
        SessionState stq = SessionState::create(c);
        fp->run(stq, long_prompt, LogitsMode::Last, logits);
        std::printf("\nby part, timing events between the parts (decode kernel by kernel, no CUDA graph: %.2f "
                    "tok/s):\n%s",
                    profiled_tok_s, gpu_decode_profile(*fp).c_str());
      }
      if (prompt_tokens > 1) {
        // The prompt's products on the tensor cores (the default) and in fp32, alternately.
        for (const bool tc : {true, false, true, false}) {
          cu::set_tensor_core_gemm(tc);
          auto f4 = make_gpu_forward(g);
          for (int rep = 0; rep < 2; ++rep) {
            SessionState st4 = SessionState::create(c);
            const GpuStats b4 = gpu_stats(*g);
            const auto tp = Clock::now();
            f4->run(st4, long_prompt, LogitsMode::Last, logits);
            const double prefill_tok_s = prompt_tokens / seconds_since(tp);
            const GpuStats a4 = gpu_stats(*g);
            std::printf("         prefill %d tokens, %s (run %d): %.1f tok/s = %.1fx decode, %.2f GB uploaded\n",
                        prompt_tokens, tc ? "tensor cores" : "fp32 products", rep + 1, prefill_tok_s,
                        prefill_tok_s / tok_s, double(a4.bytes_uploaded - b4.bytes_uploaded) / 1e9);
          }
        }
        cu::set_tensor_core_gemm(true);
#ifdef SWIFTLET_HAVE_CUPTI
        if (trace_steps > 0) {  // the kernel timeline of one prompt (tensor cores), per kernel
          auto ft = make_gpu_forward(g);
          SessionState stt = SessionState::create(c);
          ft->run(stt, long_prompt, LogitsMode::Last, logits);  // buffers allocated
          SessionState st2 = SessionState::create(c);
          bench::trace_start();
          ft->run(st2, long_prompt, LogitsMode::Last, logits);
          std::printf("\nprompt of %d tokens, kernel timeline (CUPTI), per prompt:\n%s\n", prompt_tokens,
                      bench::trace_summary(bench::trace_stop(), 1).c_str());
        }
#endif
        std::printf("         peak RSS %.2f GB\n", double(peak_rss_bytes()) / 1e9);
      }
      std::fflush(stdout);
      f.reset();
      g.reset();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
