// CUDA backend bandwidth: 4-bit (and 8-bit, bf16) matvec GB/s on matrices larger than the L2,
// against a device-to-device copy measured in the same run (the practical HBM ceiling), and
// host-to-device upload GB/s from pinned and pageable memory (the expert-streaming path), and a
// prompt's products on the tensor cores in TFLOP/s, and a decode batch's products (the rows forms).
// Usage: swiftlet_bench_cuda [iterations] [--rows [T]] (--rows: the copy and the batch's products
// alone, T tokens only when given: short enough for a profiler)
#include "bench/cuda/measure.h"
#include "kernels/cuda/cuda_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace swiftlet;
using namespace swiftlet::cuda;
using swiftlet::cuda::bench::measure_stream_chain;
using swiftlet::cuda::bench::measure_sync_cost;
using swiftlet::cuda::bench::StreamChain;
using swiftlet::cuda::bench::SyncCost;

namespace {

void fill_random(std::vector<uint8_t>& v, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= v.size(); i += 8) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    std::memcpy(v.data() + i, &s, 8);
  }
}

// Scales around 0.01 and biases around -0.1 in bf16, so results stay finite.
void fill_scales(std::vector<uint8_t>& v, float base) {
  const uint16_t h = f32_to_bf16(base);
  for (size_t i = 0; i + 2 <= v.size(); i += 2) std::memcpy(v.data() + i, &h, 2);
}

struct Matrix {
  QMatrix m;
  std::vector<uint8_t> data, scales, biases;
};

Matrix make_matrix(WeightFormat f, int bits, int64_t rows, int64_t cols) {
  Matrix o;
  o.m.format = f;
  o.m.rows = rows;
  o.m.cols = cols;
  if (f == WeightFormat::Affine) {
    o.m.bits = bits;
    o.m.group_size = 64;
    o.m.scale_dtype = DType::BF16;
    o.scales.resize(size_t(rows * cols / 64) * 2);
    o.biases.resize(o.scales.size());
    fill_scales(o.scales, 0.01f);
    fill_scales(o.biases, -0.1f);
    o.m.scales = o.scales.data();
    o.m.biases = o.biases.data();
  }
  o.data.resize(matrix_data_bytes(o.m));
  if (f == WeightFormat::BF16) fill_scales(o.data, 0.02f);
  else fill_random(o.data, uint64_t(rows * 31 + cols));
  o.m.data = o.data.data();
  return o;
}

// n experts in VRAM slots (gate, the gate again as up, down), the slot table on the device.
struct ExpertPool {
  uint8_t* arena = nullptr;
  const void** d_table = nullptr;
  ExpertLayout lay;
  size_t slot_bytes = 0;  // one expert's three matrices
  ExpertPool(const Matrix& gate, const Matrix& down, int n) {
    slot_bytes = 2 * matrix_device_bytes(gate.m) + matrix_device_bytes(down.m);
    arena = static_cast<uint8_t*>(gpu_alloc(slot_bytes * size_t(n)));
    std::vector<const void*> table(static_cast<size_t>(n));
    for (int e = 0; e < n; ++e) {
      uint8_t* base = arena + size_t(e) * slot_bytes;
      table[size_t(e)] = base;
      lay = upload_expert_to(gate.m, gate.m, down.m, base);
    }
    d_table = static_cast<const void**>(gpu_alloc(size_t(n) * sizeof(void*)));
    gpu_upload(d_table, table.data(), size_t(n) * sizeof(void*));
  }
  ExpertPool(const ExpertPool&) = delete;
  ExpertPool& operator=(const ExpertPool&) = delete;
  ~ExpertPool() {
    gpu_free(d_table);
    gpu_free(arena);
  }
};

void bench_matvec(const char* name, WeightFormat f, int bits, int64_t rows, int64_t cols, int iters, double copy_gbs) {
  Matrix h = make_matrix(f, bits, rows, cols);
  void* owner = nullptr;
  const GpuMatrix g = upload_matrix(h.m, &owner);
  const size_t bytes = matrix_data_bytes(h.m) + 2 * matrix_scale_bytes(h.m);
  std::vector<float> x(size_t(8 * cols), 0.01f);
  float* dx = static_cast<float*>(gpu_alloc(x.size() * 4));
  float* dy = static_cast<float*>(gpu_alloc(size_t(8 * rows) * 4));
  gpu_upload(dx, x.data(), x.size() * 4);
  for (int n : {1, 4, 8}) {
    const double ms = gpu_time_ms([&] { matmul(g, dx, n, dy); }, iters);
    const double gbs = double(bytes) / (ms * 1e-3) / 1e9;
    std::printf("matvec %-6s %6lld x %-6lld n=%d  %8.1f MB  %8.3f ms  %7.0f GB/s  (%.0f%% of d2d copy)\n", name,
                (long long)rows, (long long)cols, n, double(bytes) / 1e6, ms, gbs, 100.0 * gbs / copy_gbs);
  }
  gpu_free(dx);
  gpu_free(dy);
  gpu_free(owner);
}

// One routed expert's matrices at decode (gate/up 512 x 2048 and down 2048 x 512, 4-bit):
// small launches, so latency rather than bandwidth.
void bench_expert(int iters) {
  Matrix gate = make_matrix(WeightFormat::Affine, 4, 512, 2048), down = make_matrix(WeightFormat::Affine, 4, 2048, 512);
  void *og = nullptr, *od = nullptr;
  const GpuMatrix g = upload_matrix(gate.m, &og), d = upload_matrix(down.m, &od);
  float* dx = static_cast<float*>(gpu_alloc(2048 * 4));
  float* dh = static_cast<float*>(gpu_alloc(512 * 4));
  float* dy = static_cast<float*>(gpu_alloc(2048 * 4));
  gpu_memset(dx, 0, 2048 * 4);
  const double ms = gpu_time_ms(
      [&] {
        matmul(g, dx, 1, dh);
        matmul(g, dx, 1, dh);  // stands in for up_proj (same shape)
        matmul(d, dh, 1, dy);
      },
      iters);
  const size_t bytes = 2 * (matrix_data_bytes(gate.m) + 2 * matrix_scale_bytes(gate.m)) + matrix_data_bytes(down.m) +
                       2 * matrix_scale_bytes(down.m);
  std::printf("one expert (gate+up+down, 4-bit, 1 token): %.1f us, %.0f GB/s over %.2f MB\n", ms * 1e3,
              double(bytes) / (ms * 1e-3) / 1e9, double(bytes) / 1e6);
  gpu_free(dx);
  gpu_free(dh);
  gpu_free(dy);
  gpu_free(og);
  gpu_free(od);
}


// The fused decode kernels at Qwen3-Next-80B shapes. `copies` rotating copies of the weights keep
// each call's bytes out of the L2 (60 MB) where the total allows; GB/s counts weight bytes only.
void bench_fused(int iters, double copy_gbs) {
  struct Shape {
    const char* name;
    std::vector<int64_t> rows;
    int64_t cols;
    bool norm, add;
  };
  const Shape shapes[] = {{"qkvz+ba", {12288, 64}, 2048, true, false},
                          {"q+k+v", {8192, 512, 512}, 2048, true, false},
                          {"out (+=)", {2048}, 4096, false, true},
                          {"router+gate", {512, 1}, 2048, true, false},
                          {"lm_head", {151936}, 2048, true, false},
                          {"q4 65536x8192", {65536}, 8192, false, false}};
  for (const Shape& sh : shapes) {
    size_t bytes = 0;
    std::vector<Matrix> hs;
    for (int64_t r : sh.rows) {
      hs.push_back(make_matrix(WeightFormat::Affine, 4, r, sh.cols));
      bytes += matrix_data_bytes(hs.back().m) + 2 * matrix_scale_bytes(hs.back().m);
    }
    const int copies = int(std::max<size_t>(1, std::min<size_t>(8, (size_t(400) << 20) / bytes)));
    std::vector<void*> owners;
    std::vector<std::vector<MatvecSegment>> segs(static_cast<size_t>(copies));
    int64_t max_rows = 0;
    for (int64_t r : sh.rows) max_rows = std::max(max_rows, r);
    float* dx = static_cast<float*>(gpu_alloc(size_t(sh.cols) * 4));
    float* dn = static_cast<float*>(gpu_alloc(size_t(sh.cols) * 4));
    float* dxo = static_cast<float*>(gpu_alloc(size_t(sh.cols) * 4));
    std::vector<float> x(size_t(sh.cols), 0.01f);
    gpu_upload(dx, x.data(), x.size() * 4);
    gpu_upload(dn, x.data(), x.size() * 4);
    std::vector<float*> ys;
    for (size_t i = 0; i < sh.rows.size(); ++i) {
      ys.push_back(static_cast<float*>(gpu_alloc(size_t(sh.rows[i]) * 4)));
      gpu_memset(ys.back(), 0, size_t(sh.rows[i]) * 4);
    }
    for (int c = 0; c < copies; ++c)
      for (size_t i = 0; i < hs.size(); ++i) {
        void* o = nullptr;
        segs[size_t(c)].push_back({upload_matrix(hs[i].m, &o), ys[i], sh.add});
        owners.push_back(o);
      }
    int call = 0;
    const double ms = gpu_time_ms(
        [&] {
          const auto& sg = segs[size_t(call++ % copies)];
          fused_matvec(sg.data(), int(sg.size()), dx, sh.norm ? dn : nullptr, 1e-6f, dxo);
        },
        iters * 5);
    const double gbs = double(bytes) / (ms * 1e-3) / 1e9;
    std::printf("fused_matvec %-14s %7.1f MB  %7.1f us  %6.0f GB/s (%2.0f%% of copy)%s\n", sh.name, double(bytes) / 1e6,
                ms * 1e3, gbs, 100.0 * gbs / copy_gbs, copies == 1 ? "  [L2-resident]" : "");
    for (void* o : owners) gpu_free(o);
    for (float* y : ys) gpu_free(y);
    gpu_free(dx);
    gpu_free(dn);
    gpu_free(dxo);
  }

  // Routed experts: 10 of a pool of 320 (560 MB) per call, plus the shared expert.
  const int pool = 320, k = 10;
  Matrix gate = make_matrix(WeightFormat::Affine, 4, 512, 2048), down = make_matrix(WeightFormat::Affine, 4, 2048, 512);
  const ExpertPool experts(gate, down, pool);
  const ExpertLayout& lay = experts.lay;
  const void* const* d_table = experts.d_table;
  std::vector<int32_t> ids(static_cast<size_t>(pool));
  for (int i = 0; i < pool; ++i) ids[size_t(i)] = (i * 37) % pool;
  auto* d_ids = static_cast<int32_t*>(gpu_alloc(ids.size() * 4));
  gpu_upload(d_ids, ids.data(), ids.size() * 4);
  void *og = nullptr, *ou = nullptr, *od = nullptr;
  float* dlogit = static_cast<float*>(gpu_alloc(4));
  gpu_memset(dlogit, 0, 4);
  const SharedExpert shared{upload_matrix(gate.m, &og), upload_matrix(gate.m, &ou), upload_matrix(down.m, &od), dlogit};
  float* dx = static_cast<float*>(gpu_alloc(2048 * 4));
  float* dh = static_cast<float*>(gpu_alloc(2048 * 4));
  float* dw = static_cast<float*>(gpu_alloc(16 * 4));
  float* dact = static_cast<float*>(gpu_alloc(size_t(k + 1) * 512 * 4));
  gpu_memset(dx, 0, 2048 * 4);
  gpu_memset(dh, 0, 2048 * 4);
  gpu_memset(dw, 0, 16 * 4);
  const double ebytes = double(k + 1) * double(2 * gate.data.size() + 4 * gate.scales.size() + down.data.size() +
                                               2 * down.scales.size());
  int call = 0;
  const double act_ms = gpu_time_ms(
      [&] { expert_act(lay, d_table, d_ids + k * (call++ % (pool / k)), k, &shared, dx, dact); }, iters * 5);
  call = 0;
  const double down_ms = gpu_time_ms(
      [&] { expert_down_add(lay, d_table, d_ids + k * (call++ % (pool / k)), dw, k, &shared, dact, dh); }, iters * 5);
  std::printf("expert_act (10 + shared)  %7.1f us  %6.0f GB/s\n", act_ms * 1e3, ebytes * 2 / 3 / (act_ms * 1e-3) / 1e9);
  std::printf("expert_down_add (10 + sh) %7.1f us  %6.0f GB/s\n", down_ms * 1e3, ebytes / 3 / (down_ms * 1e-3) / 1e9);
  // Router, DeltaNet steps at the model's shapes.
  float* dl = static_cast<float*>(gpu_alloc(512 * 4));
  gpu_memset(dl, 0, 512 * 4);
  const double topk_ms = gpu_time_ms([&] { router_topk(dl, 1, 512, k, true, d_ids, dw); }, iters * 5);
  std::printf("router_topk E=512 k=10    %7.1f us\n", topk_ms * 1e3);
  const int hk = 16, hv = 32, dk = 128, dv = 128, K = 4;
  const int64_t C = 2 * hk * dk + hv * dv;
  const size_t big = size_t(hv) * dk * dv;
  float* buf = static_cast<float*>(gpu_alloc((8 * size_t(C) + big + size_t(K) * C) * 4));
  gpu_memset(buf, 0, (8 * size_t(C) + big + size_t(K) * C) * 4);
  float *P = buf, *u = buf + 2 * C, *z = buf + 3 * C, *bb = buf + 4 * C, *aa = bb + hv, *o = buf + 5 * C,
        *cw = buf + 6 * C, *S = buf + 8 * C, *st = S + big;
  const double prep_ms = gpu_time_ms(
      [&] {
        conv1d_silu_step(P, cw, st, C, K, u);
        l2_norm_qk(u, hk, dk, 1e-6f, 0.08f);
      },
      iters * 5);
  const double dn_ms = gpu_time_ms(
      [&] { delta_rule_norm_step(u, u + hk * dk, u + 2 * hk * dk, bb, aa, bb, aa, S, z, cw, 1e-6f, hk, hv, dk, dv, o); },
      iters * 5);
  std::printf("conv1d_silu + l2_norm_qk  %7.1f us\ndelta_rule_norm_step      %7.1f us  (state %.1f MB read + written)\n",
              prep_ms * 1e3, dn_ms * 1e3, double(big) * 4 / 1e6);
  for (void* p : {static_cast<void*>(d_ids), og, ou, od,
                  static_cast<void*>(dlogit), static_cast<void*>(dx), static_cast<void*>(dh), static_cast<void*>(dw),
                  static_cast<void*>(dact), static_cast<void*>(dl), static_cast<void*>(buf)})
    gpu_free(p);
}

// A decode batch's products with every expert in VRAM, at the 80B's shapes (4-bit; the router
// 8-bit): the rows forms for T tokens (fused_matvec_rows over the DeltaNet's qkvz+ba and over the
// router with the shared expert's gate, expert_act_routed_rows with each
// token's own top 10 of 512 random logits plus the shared expert, expert_down_add_rows on them), us
// a call and GB/s: the projections' weights read once; the experts' bytes as the kernels read
// them, per token (10 + 1 experts a token, so 8 tokens read ~8x one token's). `copies` of the
// dense matrices and 16 sets of logits keep the bytes out of the L2. only_t > 0: that T alone (for a
// profiler).
void bench_batch_rows(int iters, double copy_gbs, int only_t) {
  const int64_t H = 2048, I = 512;
  const int E = 512, k = 10, sets = 16;
  Matrix qkvz = make_matrix(WeightFormat::Affine, 4, 12288, H), ba = make_matrix(WeightFormat::Affine, 4, 64, H);
  const double pbytes = double(qkvz.data.size() + 2 * qkvz.scales.size() + ba.data.size() + 2 * ba.scales.size());
  const int copies = 8;
  std::vector<void*> owners;
  std::vector<std::vector<MatvecSegment>> segs(copies);
  float* dy = static_cast<float*>(gpu_alloc(size_t(8) * (12288 + 64) * 4));
  for (int c = 0; c < copies; ++c)
    for (const Matrix* m : {&qkvz, &ba}) {
      void* o = nullptr;
      const bool first = m == &qkvz;
      segs[size_t(c)].push_back({upload_matrix(m->m, &o), first ? dy : dy + 8 * 12288, false, first ? 12288 : 64});
      owners.push_back(o);
    }
  // The router and the shared expert's gate (8-bit, 512 + 1 rows), on the same normed x.
  Matrix router = make_matrix(WeightFormat::Affine, 8, E, H), sgate = make_matrix(WeightFormat::Affine, 8, 1, H);
  const double rbytes =
      double(router.data.size() + 2 * router.scales.size() + sgate.data.size() + 2 * sgate.scales.size());
  std::vector<std::vector<MatvecSegment>> rsegs(copies);
  float* dr = static_cast<float*>(gpu_alloc(size_t(8) * (E + 1) * 4));
  for (int c = 0; c < copies; ++c)
    for (const Matrix* m : {&router, &sgate}) {
      void* o = nullptr;
      const bool first = m == &router;
      rsegs[size_t(c)].push_back({upload_matrix(m->m, &o), first ? dr : dr + 8 * E, false, first ? E : 1});
      owners.push_back(o);
    }
  Matrix gate = make_matrix(WeightFormat::Affine, 4, I, H), down = make_matrix(WeightFormat::Affine, 4, H, I);
  const ExpertPool experts(gate, down, E);
  void *og = nullptr, *ou = nullptr, *od = nullptr;
  float* dgl = static_cast<float*>(gpu_alloc(8 * 4));
  gpu_memset(dgl, 0, 8 * 4);
  const SharedExpert shared{upload_matrix(gate.m, &og), upload_matrix(gate.m, &ou), upload_matrix(down.m, &od), dgl};
  std::vector<float> logits(size_t(sets) * 8 * E), x(size_t(8) * H);
  uint64_t r = 88172645463325252ull;
  for (float& v : logits) {
    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    v = float(r % 100000) * 1e-4f;
  }
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 2654435761u % 1000) - 500) * 1e-3f;
  float* dlog = static_cast<float*>(gpu_alloc(logits.size() * 4));
  float* dx = static_cast<float*>(gpu_alloc(x.size() * 4));
  float* dxo = static_cast<float*>(gpu_alloc(x.size() * 4));
  float* dnw = static_cast<float*>(gpu_alloc(size_t(H) * 4));
  auto* dids = static_cast<int32_t*>(gpu_alloc(size_t(sets) * 8 * k * 4));
  float* dw = static_cast<float*>(gpu_alloc(size_t(sets) * 8 * k * 4));
  float* dact = static_cast<float*>(gpu_alloc(size_t(8) * (k + 1) * I * 4));
  float* dh = static_cast<float*>(gpu_alloc(size_t(8) * H * 4));
  gpu_upload(dlog, logits.data(), logits.size() * 4);
  gpu_upload(dx, x.data(), x.size() * 4);
  gpu_upload(dnw, x.data(), size_t(H) * 4);
  gpu_memset(dh, 0, size_t(8) * H * 4);
  const double ebytes = double(2 * gate.data.size() + 4 * gate.scales.size() + down.data.size() + 2 * down.scales.size());
  std::printf("\na decode batch's rows forms, 80B shapes (us a call; GB/s: qkvz+ba's %.1f MB and router+gate's %.1f MB "
              "once, the experts' %.2f MB a token-expert, 11 a token; d2d copy %.0f GB/s):\n",
              pbytes / 1e6, rbytes / 1e6, ebytes / 1e6, copy_gbs);
  for (int T : {1, 2, 4, 8}) {
    if (only_t > 0 && T != only_t) continue;
    int call = 0;
    const double p_ms = gpu_time_ms(
        [&] {
          const auto& sg = segs[size_t(call++ % copies)];
          fused_matvec_rows(sg.data(), int(sg.size()), T, dx, H, dnw, 1e-6f, dxo);
        },
        iters * 5);
    call = 0;
    const double r_ms = gpu_time_ms(
        [&] {
          const auto& sg = rsegs[size_t(call++ % copies)];
          fused_matvec_rows(sg.data(), int(sg.size()), T, dx, H, dnw, 1e-6f, dxo);
        },
        iters * 5);
    call = 0;
    const double a_ms = gpu_time_ms(
        [&] {
          const int c = call++ % sets;
          expert_act_routed_rows(experts.lay, experts.d_table, dlog + size_t(c) * 8 * E, E, k, true, &shared, dx, T,
                                 dids + size_t(c) * 8 * k, dw + size_t(c) * 8 * k, dact);
        },
        iters * 5);
    call = 0;
    const double d_ms = gpu_time_ms(
        [&] {
          const int c = call++ % sets;
          expert_down_add_rows(experts.lay, experts.d_table, dids + size_t(c) * 8 * k, dw + size_t(c) * 8 * k, k,
                               &shared, dact, T, dh);
        },
        iters * 5);
    const double te = double(T) * (k + 1) * ebytes;
    std::printf("  T=%d  qkvz+ba %6.1f us %5.0f GB/s | router+gate %5.1f us %5.0f GB/s | act %6.1f us %5.0f GB/s | "
                "down %6.1f us %5.0f GB/s\n",
                T, p_ms * 1e3, pbytes / (p_ms * 1e-3) / 1e9, r_ms * 1e3, rbytes / (r_ms * 1e-3) / 1e9, a_ms * 1e3,
                te * 2 / 3 / (a_ms * 1e-3) / 1e9, d_ms * 1e3, te / 3 / (d_ms * 1e-3) / 1e9);
  }
  for (void* p : owners) gpu_free(p);
  for (void* p : {static_cast<void*>(dy), static_cast<void*>(dr), og, ou, od, static_cast<void*>(dgl), static_cast<void*>(dlog),
                  static_cast<void*>(dx), static_cast<void*>(dxo), static_cast<void*>(dnw), static_cast<void*>(dids),
                  static_cast<void*>(dw), static_cast<void*>(dact), static_cast<void*>(dh)})
    gpu_free(p);
}

}  // namespace

// A prompt's products (matmul_rows) at the models' projection shapes (both families: hidden 2048)
// over T tokens, on the tensor cores and in fp32: ms a call, the product's 2 rows cols T over the
// time as TFLOP/s (against the H200's dense bf16 peak, 989), and the quantisation of the rows
// (quantize_rows) on its own. 4-bit, groups of 64.
void bench_gemm(int iters) {
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{"DeltaNet qkv+z", 12288, 2048}, {"attention q (gated)", 8192, 2048},
                          {"out_proj / o_proj", 2048, 4096}, {"expert gate (one)", 512, 2048},
                          {"expert down (one)", 2048, 512}};
  for (int64_t T : {512, 2048, 8192}) {
    for (const Shape& sh : shapes) {
      Matrix h = make_matrix(WeightFormat::Affine, 4, sh.rows, sh.cols);
      void* owner = nullptr;
      const GpuMatrix g = upload_matrix(h.m, &owner);
      std::vector<float> x(size_t(T * sh.cols));
      for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 2654435761u % 1000) - 500) * 1e-3f;
      float* dx = static_cast<float*>(gpu_alloc(x.size() * 4));
      float* dy = static_cast<float*>(gpu_alloc(size_t(T * sh.rows) * 4));
      void* dq = gpu_alloc(quantized_rows_bytes(T, sh.cols, 64));
      gpu_upload(dx, x.data(), x.size() * 4);
      const double q_ms = gpu_time_ms([&] { quantize_rows(dx, T, sh.cols, 64, dq); }, iters);
      const RowsIn in = prepare_rows(dx, T, sh.cols, 64, dq);
      const double tc_ms = gpu_time_ms([&] { matmul_rows(g, in, T, dy, false); }, iters);
      set_tensor_core_gemm(false);
      const double f_ms = gpu_time_ms([&] { matmul_rows(g, RowsIn{dx}, T, dy, false); }, std::max(1, iters / 4));
      set_tensor_core_gemm(true);
      const double flop = 2.0 * double(sh.rows) * double(sh.cols) * double(T);
      std::printf("gemm %-20s %6lld x %-5lld T=%-5lld tensor cores %8.3f ms %6.1f TFLOP/s (%4.1f%% of 989) | "
                  "fp32 %8.3f ms %5.1f TFLOP/s | quantise rows %6.3f ms\n",
                  sh.name, (long long)sh.rows, (long long)sh.cols, (long long)T, tc_ms, flop / (tc_ms * 1e-3) / 1e12,
                  100.0 * flop / (tc_ms * 1e-3) / 989e12, f_ms, flop / (f_ms * 1e-3) / 1e12, q_ms);
      gpu_free(dq);
      gpu_free(dx);
      gpu_free(dy);
      gpu_free(owner);
    }
  }
}

// A prompt's routed experts of one layer (the 35B's: 256 experts of 512 x 2048 gate/up and 2048 x
// 512 down, 4-bit, top 8) over T tokens with random choices: gate+up and down on the tensor cores
// and in fp32; TFLOP/s as above and the experts' weights read once over the time (GB/s: every
// expert is chosen at these T, so the HBM rate bounds it).
void bench_expert_pairs(int iters) {
  const int E = 256, k = 8;
  const int64_t H = 2048, I = 512;
  Matrix gate = make_matrix(WeightFormat::Affine, 4, I, H), down = make_matrix(WeightFormat::Affine, 4, H, I);
  const ExpertPool experts(gate, down, E);
  const ExpertLayout& lay = experts.lay;
  const void* const* d_table = experts.d_table;
  for (int64_t T : {512, 2048, 8192}) {
    // Token t chooses experts (t * 37 + j * 97 + t / 3) mod E, j < k: distinct, spread evenly.
    std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j) by_expert[size_t((t * 37 + j * 97 + t / 3) % E)].push_back(int32_t(t * k + j));
    std::vector<int32_t> gexp, gstart, pairs;
    for (int e = 0; e < E; ++e) {
      if (by_expert[size_t(e)].empty()) continue;
      gexp.push_back(e);
      gstart.push_back(int32_t(pairs.size()));
      pairs.insert(pairs.end(), by_expert[size_t(e)].begin(), by_expert[size_t(e)].end());
    }
    gstart.push_back(int32_t(pairs.size()));
    auto up = [](const std::vector<int32_t>& v) {
      auto* d = static_cast<int32_t*>(gpu_alloc(v.size() * 4));
      gpu_upload(d, v.data(), v.size() * 4);
      return d;
    };
    int32_t *d_gexp = up(gexp), *d_gstart = up(gstart), *d_pairs = up(pairs);
    ExpertBatch eb;
    eb.d_expert = d_gexp;
    eb.d_start = d_gstart;
    eb.d_pairs = d_pairs;
    eb.groups = int(gexp.size());
    eb.pairs = int64_t(pairs.size());
    eb.k = k;
    std::vector<float> x(size_t(T * H));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 2654435761u % 1000) - 500) * 1e-3f;
    float* dx = static_cast<float*>(gpu_alloc(x.size() * 4));
    gpu_upload(dx, x.data(), x.size() * 4);
    float* dg = static_cast<float*>(gpu_alloc(size_t(T * k * I) * 4));
    float* du = static_cast<float*>(gpu_alloc(size_t(T * k * I) * 4));
    float* dy = static_cast<float*>(gpu_alloc(size_t(T * k * H) * 4));
    gpu_memset(dg, 0, size_t(T * k * I) * 4);
    void* dqx = gpu_alloc(quantized_rows_bytes(T, H, 64));
    void* dqa = gpu_alloc(quantized_rows_bytes(T * k, I, 64));
    const RowsIn xin = prepare_rows(dx, T, H, 64, dqx), ain = prepare_rows(dg, T * k, I, 64, dqa);
    const double tc_ms = gpu_time_ms(
        [&] {
          expert_gate_up_pairs(lay, d_table, eb, xin, dg, du);
          expert_down_pairs(lay, d_table, eb, ain, dy);
        },
        iters);
    set_tensor_core_gemm(false);
    const double f_ms = gpu_time_ms(
        [&] {
          expert_gate_up_pairs(lay, d_table, eb, RowsIn{dx}, dg, du);
          expert_down_pairs(lay, d_table, eb, RowsIn{dg}, dy);
        },
        std::max(1, iters / 4));
    set_tensor_core_gemm(true);
    const double flop = 2.0 * 3.0 * double(I) * double(H) * double(T * k);
    const double wbytes = double(E) * double(experts.slot_bytes);
    std::printf("experts of a layer, T=%-5lld (%lld pairs): tensor cores %8.3f ms %6.1f TFLOP/s %6.0f GB/s of weights | "
                "fp32 %8.3f ms %5.1f TFLOP/s\n",
                (long long)T, (long long)(T * k), tc_ms, flop / (tc_ms * 1e-3) / 1e12, wbytes / (tc_ms * 1e-3) / 1e9,
                f_ms, flop / (f_ms * 1e-3) / 1e12);
    for (void* p : {static_cast<void*>(d_gexp), static_cast<void*>(d_gstart), static_cast<void*>(d_pairs),
                    static_cast<void*>(dx), static_cast<void*>(dg), static_cast<void*>(du), static_cast<void*>(dy), dqx,
                    dqa})
      gpu_free(p);
  }
}

int main(int argc, char** argv) {
  std::string why;
  if (!cuda_available(&why)) {
    std::printf("no usable CUDA GPU (%s): nothing to measure\n", why.c_str());
    return 0;
  }
  const int iters = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  const bool rows_only = argc > 2 && std::strcmp(argv[2], "--rows") == 0;
  const int only_t = rows_only && argc > 3 ? std::atoi(argv[3]) : 0;
  std::printf("device: %s\n", device_description().c_str());

  // Device-to-device copy: 2 GiB, bandwidth counted as bytes read + bytes written.
  const size_t copy_bytes = size_t(2) << 30;
  void* a = gpu_alloc(copy_bytes);
  void* b = gpu_alloc(copy_bytes);
  gpu_memset(a, 1, copy_bytes);
  const double copy_ms = gpu_time_ms([&] { gpu_copy(b, a, copy_bytes); }, iters);
  const double copy_gbs = 2.0 * double(copy_bytes) / (copy_ms * 1e-3) / 1e9;
  std::printf("d2d copy %.1f GB: %.3f ms, %.0f GB/s (read + write)\n", copy_bytes / 1e9, copy_ms, copy_gbs);
  gpu_free(b);
  if (rows_only) {
    gpu_free(a);
    bench_batch_rows(iters, copy_gbs, only_t);
    return 0;
  }

  // Host-to-device, pinned and pageable, 1 GiB.
  const size_t up_bytes = size_t(1) << 30;
  void* pinned = gpu_alloc_pinned(up_bytes);
  std::memset(pinned, 1, up_bytes);
  const double pin_ms = gpu_time_ms([&] { gpu_upload(a, pinned, up_bytes); }, 5);
  std::printf("h2d pinned   %.1f GB: %.2f ms, %.1f GB/s\n", up_bytes / 1e9, pin_ms, double(up_bytes) / (pin_ms * 1e-3) / 1e9);
  gpu_free_pinned(pinned);
  std::vector<uint8_t> pageable(up_bytes, 1);
  const double page_ms = gpu_time_ms([&] { gpu_upload(a, pageable.data(), up_bytes); }, 3);
  std::printf("h2d pageable %.1f GB: %.2f ms, %.1f GB/s\n", up_bytes / 1e9, page_ms, double(up_bytes) / (page_ms * 1e-3) / 1e9);
  // One expert-sized upload (3 x 4-bit 512x2048 with scales, ~1.7 MB) from pinned memory.
  const size_t expert_bytes = 3 * (512 * 2048 / 2 + 2 * 512 * 32 * 2);
  void* pe = gpu_alloc_pinned(expert_bytes);
  std::memset(pe, 1, expert_bytes);
  const double pe_ms = gpu_time_ms([&] { gpu_upload(a, pe, expert_bytes); }, 50);
  std::printf("h2d pinned one expert %.2f MB: %.1f us, %.1f GB/s\n", expert_bytes / 1e6, pe_ms * 1e3,
              double(expert_bytes) / (pe_ms * 1e-3) / 1e9);
  gpu_free_pinned(pe);
  gpu_free(a);

  bench_gemm(iters);
  bench_expert_pairs(iters);

  // Matvec on matrices several times the L2 (60 MB on an H200).
  bench_matvec("q4", WeightFormat::Affine, 4, 65536, 8192, iters, copy_gbs);
  bench_matvec("q8", WeightFormat::Affine, 8, 32768, 8192, iters, copy_gbs);
  bench_matvec("bf16", WeightFormat::BF16, 0, 16384, 8192, iters, copy_gbs);
  // The model's own shapes: lm_head-like (151936 x 2048) and in_proj_qkvz-like (12288 x 2048), 4-bit.
  bench_matvec("q4", WeightFormat::Affine, 4, 151936, 2048, iters, copy_gbs);
  bench_matvec("q4", WeightFormat::Affine, 4, 12288, 2048, iters, copy_gbs);
  bench_expert(200);
  // The floor a chain of dependent kernels puts under a decode step (~290 launches).
  const SyncCost sc = measure_sync_cost();
  std::printf("\na dependent step across the GPU (read 8 KB written by the step before, write a share):\n"
              "  kernel boundary with PDL %5.2f us, without %5.2f us; grid barrier in one kernel %5.2f us"
              " (acquire/release, no sleep: %5.2f us; a growing count: %5.2f us); results %s\n",
              sc.boundary_pdl_us, sc.boundary_us, sc.barrier_us, sc.barrier_ar_us, sc.barrier_count_us,
              sc.ok ? "match the host's" : "WRONG");
  // The 80B's DeltaNet layer as its chain of phases, by the bytes each reads (4-bit rows with a bf16
  // scale and bias a group of 64: 9/16 of a byte a weight; the router 8-bit: 68/64), streamed ahead
  // of the chain or not: what the persistent design could reach before any arithmetic.
  auto q4 = [](int64_t rows, int64_t cols) { return rows * cols * 9 / 16; };
  const std::vector<int64_t> phases = {
      q4(12288 + 64, 2048),         // in_proj_qkvz + in_proj_ba
      int64_t(32) * 128 * 128 * 4,  // the DeltaNet step's state (read; its write-back not counted)
      q4(2048, 4096),               // out_proj
      (512 + 1) * 2048 * 68 / 64,   // router + the shared expert's gate, 8-bit
      11 * 2 * q4(512, 2048),       // act: gate and up of 10 experts and the shared one
      11 * q4(2048, 512)};          // down
  // Then the same bytes in n equal phases: what a link costs while the copies stream.
  const int chain_layers = 48;
  int64_t layer_bytes = 0;
  for (int64_t b : phases) layer_bytes += b;
  std::printf("\nthe 80B's DeltaNet layer as a chain of phases (%.1f MB, 16 KB tiles, 192 KB of ring an SM), us a"
              " layer\n(a token of %d such layers at that rate, tok/s); the bytes alone / a kernel a phase with PDL"
              " (the\npresent shape) / one persistent kernel whose copies run ahead:\n",
              double(layer_bytes) / 1e6, chain_layers);
  for (int n : {0, 1, 3, 4, 5, 12, 24}) {  // 0: the six real phases
    const std::vector<int64_t> ph = n == 0 ? phases : std::vector<int64_t>(size_t(n), layer_bytes / n);
    const StreamChain ch = measure_stream_chain(ph, chain_layers);
    if (ch.layer_bytes == 0) break;  // below sm_90
    auto tok_s = [&](double us) { return 1e6 / (us * chain_layers); };
    std::printf("  %2zu phases%-9s %6.2f (%4.0f)  %6.2f (%4.0f)  %6.2f (%4.0f)  results %s\n", ph.size(),
                n == 0 ? " (real)" : " (equal)", ch.stream_us, tok_s(ch.stream_us), ch.kernels_us,
                tok_s(ch.kernels_us), ch.persistent_us, tok_s(ch.persistent_us),
                ch.ok ? "match the host's" : "WRONG");
  }
  // The kernels before the streamed products, then those (warps per block), then on the tensor cores.
  for (int warps : {0, 8, 16, -16}) {
    set_streamed_products(warps != 0, warps < 0 ? -warps : warps);
    set_tensor_core_products(warps < 0);
    std::printf("\nfused kernels, streamed products %s, %d warps%s:\n", streamed_products() ? "on" : "off",
                warps < 0 ? -warps : warps, tensor_core_products() ? ", tensor cores" : "");
    bench_fused(iters, copy_gbs);
  }
  bench_batch_rows(iters, copy_gbs, 0);
  return 0;
}
