// Shared by the CUDA kernel tests: the skip where no GPU is usable, device copies of host vectors,
// random inputs and the element-wise comparison. Test code only.
#pragma once

#include "core/dtype.h"
#include "core/qmatrix.h"
#include "kernels/cuda/cuda_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define REQUIRE_GPU()                                                                   \
  do {                                                                                  \
    std::string why_;                                                                   \
    if (!::swiftlet::cuda::cuda_available(&why_)) GTEST_SKIP() << "no usable CUDA GPU: " << why_; \
  } while (0)

namespace swiftlet::cuda_test {

// A device copy of a host vector (or zeros); frees itself.
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(const std::vector<T>& h) : p(static_cast<T*>(cuda::gpu_alloc(h.size() * sizeof(T)))), n(h.size()) {
    cuda::gpu_upload(p, h.data(), n * sizeof(T));
  }
  explicit DevBuf(size_t count) : p(static_cast<T*>(cuda::gpu_alloc(count * sizeof(T)))), n(count) {
    cuda::gpu_memset(p, 0, n * sizeof(T));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cuda::gpu_free(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    cuda::gpu_download(h.data(), p, n * sizeof(T));
    return h;
  }
};

inline std::vector<float> randn(std::mt19937& rng, size_t n, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

struct HostMatrix {
  QMatrix m;
  std::vector<uint8_t> data, scales, biases;
};

// A random matrix in host memory: affine (random codes, scales ~ N(0, 0.1), biases ~ N(0, 0.5))
// or dense F32/BF16/F16 ~ N(0, 1).
inline HostMatrix random_matrix(std::mt19937& rng, WeightFormat f, int64_t rows, int64_t cols, int bits, int gs,
                         DType sdt) {
  HostMatrix o;
  o.m.format = f;
  o.m.rows = rows;
  o.m.cols = cols;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  auto put16 = [](std::vector<uint8_t>& v, size_t i, uint16_t h) { std::memcpy(v.data() + 2 * i, &h, 2); };
  auto put = [&](std::vector<uint8_t>& v, size_t i, float x, DType t) {
    if (t == DType::F32) std::memcpy(v.data() + 4 * i, &x, 4);
    else put16(v, i, t == DType::BF16 ? f32_to_bf16(x) : f32_to_f16(x));
  };
  if (f == WeightFormat::Affine) {
    o.m.bits = bits;
    o.m.group_size = gs;
    o.m.scale_dtype = sdt;
    o.data.resize(size_t(rows * cols * bits / 8));
    for (auto& b : o.data) b = uint8_t(byte(rng));
    const size_t groups = size_t(rows * (cols / gs)), es = dtype_size(sdt);
    o.scales.resize(groups * es);
    o.biases.resize(groups * es);
    for (size_t i = 0; i < groups; ++i) {
      put(o.scales, i, nd(rng) * 0.1f, sdt);
      put(o.biases, i, nd(rng) * 0.5f, sdt);
    }
    o.m.scales = o.scales.data();
    o.m.biases = o.biases.data();
  } else {
    const DType t = f == WeightFormat::F32 ? DType::F32 : f == WeightFormat::BF16 ? DType::BF16 : DType::F16;
    o.data.resize(size_t(rows * cols) * dtype_size(t));
    for (size_t i = 0; i < size_t(rows * cols); ++i) put(o.data, i, nd(rng), t);
  }
  o.m.data = o.data.data();
  return o;
}

// Experts in VRAM slots for the expert products: expert e's gate, up and down uploaded into slot
// (e * shuffle) % E of one arena (slots out of expert order), the slot table on the device, the
// slot layout. Frees itself.
struct DevExperts {
  uint8_t* arena = nullptr;
  const void** d_table = nullptr;
  cuda::ExpertLayout lay;
  DevExperts(const std::vector<HostMatrix>& gate, const std::vector<HostMatrix>& up,
             const std::vector<HostMatrix>& down, int shuffle) {
    const size_t E = gate.size();
    const size_t slot = cuda::matrix_device_bytes(gate[0].m) + cuda::matrix_device_bytes(up[0].m) +
                        cuda::matrix_device_bytes(down[0].m);
    arena = static_cast<uint8_t*>(cuda::gpu_alloc(slot * E));
    std::vector<const void*> table(E);
    for (size_t e = 0; e < E; ++e) {
      uint8_t* base = arena + (e * size_t(shuffle)) % E * slot;
      table[e] = base;
      lay = cuda::upload_expert_to(gate[e].m, up[e].m, down[e].m, base);
    }
    d_table = static_cast<const void**>(cuda::gpu_alloc(E * sizeof(void*)));
    cuda::gpu_upload(d_table, table.data(), E * sizeof(void*));
  }
  DevExperts(const DevExperts&) = delete;
  DevExperts& operator=(const DevExperts&) = delete;
  ~DevExperts() {
    cuda::gpu_free(d_table);
    cuda::gpu_free(arena);
  }
};

// A prompt's work list (cuda::ExpertBatch) for the choices ids, pair p = t k + j having chosen
// ids[p]: the chosen experts in order, each with its pairs in order; on the device.
struct DevWorkList {
  struct Host {
    std::vector<int32_t> expert, start, pairs;
  };
  static Host group(const std::vector<int32_t>& ids, int E) {
    Host h;
    for (int e = 0; e < E; ++e) {
      const size_t before = h.pairs.size();
      for (size_t p = 0; p < ids.size(); ++p)
        if (ids[p] == e) h.pairs.push_back(int32_t(p));
      if (h.pairs.size() == before) continue;
      h.expert.push_back(e);
      h.start.push_back(int32_t(before));
    }
    h.start.push_back(int32_t(h.pairs.size()));
    return h;
  }
  DevWorkList(const std::vector<int32_t>& ids, int E, int k) : DevWorkList(group(ids, E), k) {}
  DevWorkList(const Host& h, int k) : expert(h.expert), start(h.start), pairs(h.pairs) {
    batch.d_expert = expert.p;
    batch.d_start = start.p;
    batch.d_pairs = pairs.p;
    batch.groups = int(h.expert.size());
    batch.pairs = int64_t(h.pairs.size());
    batch.k = k;
  }
  DevBuf<int32_t> expert, start, pairs;
  cuda::ExpertBatch batch;
};

// got ~ want within atol + rtol |want| everywhere; reports the first miss.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rtol, float atol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " at " << i;
}

}  // namespace swiftlet::cuda_test
