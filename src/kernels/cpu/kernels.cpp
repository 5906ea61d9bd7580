#include "kernels/cpu/kernels.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul_avx2.h"
#include "kernels/cpu/matmul_avx512.h"
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

// Splits rows [0, rows) over the global pool; small products stay on the calling thread,
// where waking workers would cost more than the work.
template <typename F>
void split_rows(const QMatrix& w, int64_t n, F&& rows_fn) {
  ThreadPool& pool = ThreadPool::global();
  const int64_t work = w.rows * w.cols * n;
  const int64_t tasks = std::min<int64_t>(w.rows, work < (1 << 16) ? 1 : int64_t(pool.size()) * 4);
  if (tasks <= 1) {
    rows_fn(int64_t(0), w.rows);
    return;
  }
  // One captured pointer keeps the lambda inside std::function's small buffer: no allocation
  // per call (decode makes thousands of these).
  struct Job {
    int64_t rows, tasks;
    F& fn;
  } job{w.rows, tasks, rows_fn};
  pool.parallel_for(tasks, [j = &job](int64_t i) { j->fn(j->rows * i / j->tasks, j->rows * (i + 1) / j->tasks); });
}

void matmul_f32act(const QMatrix& w, const float* x, int64_t n, float* y) {
  if (!avx2_usable(w)) {
    ref::matmul(w, x, n, y);
    return;
  }
  thread_local avx2::Prepared prep;
  avx2::prepare(w, x, n, prep);
  const avx2::Prepared& p = prep;
  split_rows(w, n, [&](int64_t r0, int64_t r1) { avx2::matmul_rows(w, x, p, n, y, r0, r1); });
}

template <Isa I>
void matmul_q8act(const QMatrix& w, const float* x, int64_t n, float* y) {
  if (!avx2_usable(w) || !avx2::q8_supported(w)) {
    matmul_f32act(w, x, n, y);
    return;
  }
  thread_local avx2::PreparedQ8 prep;
  avx2::prepare_q8(w, x, n, prep);
  const avx2::PreparedQ8& p = prep;
  split_rows(w, n, [&](int64_t r0, int64_t r1) {
    if constexpr (I == Isa::Avx512Vnni) avx512::matmul_rows_q8(w, p, n, y, r0, r1);
    else avx2::matmul_rows_q8(w, p, n, y, r0, r1);
  });
}

bool has_isa(Isa isa) {
  static const bool avx2 = avx2::cpu_has_avx2(), vnni = avx2 && avx512::cpu_has_avx512_vnni();
  return isa == Isa::Avx2 ? avx2 : vnni;
}

}  // namespace

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::Avx2, Isa::Avx512Vnni})
    if (has_isa(i)) out.push_back(i);
  return out;
}

const char* isa_name(Isa isa) { return isa == Isa::Avx2 ? "avx2" : "avx512-vnni"; }

const Kernels& kernels_for(Backend b, Isa isa) {
  static const Kernels reference{&ref::matmul, &ref::dequant_row, "reference"};
  static const Kernels cpu_avx2{&matmul_q8act<Isa::Avx2>, &ref::dequant_row, "cpu"};
  static const Kernels cpu_vnni{&matmul_q8act<Isa::Avx512Vnni>, &ref::dequant_row, "cpu"};
  static const Kernels cpu_f32{&matmul_f32act, &ref::dequant_row, "cpu-f32"};
  if (b != Backend::Reference && !has_isa(isa)) fail("this CPU has no {}", isa_name(isa));
  switch (b) {
    case Backend::Reference: return reference;
    case Backend::Cpu: return isa == Isa::Avx512Vnni ? cpu_vnni : cpu_avx2;
    case Backend::CpuF32: return cpu_f32;
  }
  return reference;
}

const Kernels& kernels_for(Backend b) {
  static const Isa best = has_isa(Isa::Avx512Vnni) ? Isa::Avx512Vnni : Isa::Avx2;
  if (b != Backend::Reference && !has_isa(best)) return kernels_for(Backend::Reference, best);
  return kernels_for(b, best);
}

Backend parse_backend(std::string_view s) {
  if (s == "reference") return Backend::Reference;
  if (s == "cpu") return Backend::Cpu;
  if (s == "cpu-f32") return Backend::CpuF32;
  fail("unknown backend '{}' (use 'cpu', 'cpu-f32' or 'reference')", s);
}

}  // namespace swiftlet
