#include "kernels/cpu/kernels.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul_avx2.h"
#include "kernels/cpu/ops_ref.h"

#include <algorithm>

namespace swiftlet {

namespace {

bool avx2_usable(const QMatrix& w) {
  static const bool has = avx2::cpu_has_avx2();
  if (!has) return false;
  if (w.format != WeightFormat::Affine) return true;
  return (w.bits == 4 || w.bits == 8) && w.group_size % (8 * (32 / w.bits)) == 0;
}

// Rows are split over the global pool; small products stay on the calling thread, where the
// cost of waking workers would exceed the work.
void matmul_cpu(const QMatrix& w, const float* x, int64_t n, float* y) {
  if (!avx2_usable(w)) {
    ref::matmul(w, x, n, y);
    return;
  }
  thread_local avx2::Prepared prep;
  avx2::prepare(w, x, n, prep);
  ThreadPool& pool = ThreadPool::global();
  const int64_t work = w.rows * w.cols * n;
  int64_t tasks = std::min<int64_t>(w.rows, work < (1 << 16) ? 1 : int64_t(pool.size()) * 4);
  if (tasks <= 1) {
    avx2::matmul_rows(w, x, prep, n, y, 0, w.rows);
    return;
  }
  const avx2::Prepared& p = prep;
  pool.parallel_for(tasks, [&](int64_t i) {
    const int64_t r0 = w.rows * i / tasks, r1 = w.rows * (i + 1) / tasks;
    avx2::matmul_rows(w, x, p, n, y, r0, r1);
  });
}

}  // namespace

const Kernels& kernels_for(Backend b) {
  static const Kernels reference{&ref::matmul, &ref::dequant_row, "reference"};
  static const Kernels cpu{&matmul_cpu, &ref::dequant_row, "cpu"};
  return b == Backend::Reference ? reference : cpu;
}

Backend parse_backend(std::string_view s) {
  if (s == "reference") return Backend::Reference;
  if (s == "cpu") return Backend::Cpu;
  fail("unknown backend '{}' (use 'cpu' or 'reference')", s);
}

}  // namespace swiftlet
