// Shared by the CUDA kernel tests: the skip where no GPU is usable, device copies of host vectors,
// random inputs and the element-wise comparison. Test code only.
#pragma once

#include "kernels/cuda/cuda_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
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

// got ~ want within atol + rtol |want| everywhere; reports the first miss.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rtol, float atol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " at " << i;
}

}  // namespace swiftlet::cuda_test
