#include "kernels/cpu/read_bandwidth.h"

#include "core/thread_pool.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace swiftlet {

double ReadBandwidth::pass() {
  ThreadPool& pool = ThreadPool::global();
  const int64_t tasks = pool.size();
  sums_.resize(size_t(tasks));
  const auto t0 = std::chrono::steady_clock::now();
  pool.parallel_for(tasks, [&](int64_t i) {
    const size_t n = a_.size() / size_t(tasks) / 16 * 16;
    const float* p = a_.data() + size_t(i) * n;
#if defined(__x86_64__)
    __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps(), s2 = _mm_setzero_ps(), s3 = _mm_setzero_ps();
    for (size_t j = 0; j < n; j += 16) {
      s0 = _mm_add_ps(s0, _mm_loadu_ps(p + j));
      s1 = _mm_add_ps(s1, _mm_loadu_ps(p + j + 4));
      s2 = _mm_add_ps(s2, _mm_loadu_ps(p + j + 8));
      s3 = _mm_add_ps(s3, _mm_loadu_ps(p + j + 12));
    }
    alignas(16) float v[4];
    _mm_store_ps(v, _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
    sums_[size_t(i)] = v[0] + v[1] + v[2] + v[3];
#elif defined(__aarch64__)
    float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
    for (size_t j = 0; j < n; j += 16) {
      s0 = vaddq_f32(s0, vld1q_f32(p + j));
      s1 = vaddq_f32(s1, vld1q_f32(p + j + 4));
      s2 = vaddq_f32(s2, vld1q_f32(p + j + 8));
      s3 = vaddq_f32(s3, vld1q_f32(p + j + 12));
    }
    sums_[size_t(i)] = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
#else
    float s[4] = {0, 0, 0, 0};
    for (size_t j = 0; j < n; ++j) s[j % 4] += p[j];
    sums_[size_t(i)] = s[0] + s[1] + s[2] + s[3];
#endif
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return double(a_.size() / size_t(tasks) / 16 * 16 * size_t(tasks) * 4) / secs / 1e9;
}

double ReadBandwidth::best(int reps) {
  double b = 0;
  for (int i = 0; i < reps; ++i) b = std::max(b, pass());
  return b;
}

}  // namespace swiftlet
