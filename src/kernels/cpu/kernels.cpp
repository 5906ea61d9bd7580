#include "kernels/cpu/kernels.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul_avx2.h"
#include "kernels/cpu/matmul_avx512.h"
#include "kernels/cpu/ops_ref.h"

#include <algorithm>
#include <atomic>

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

// The group one job at a time (the reference, and backends without a grouped kernel).
template <void (*Matmul)(const QMatrix&, const float*, int64_t, float*)>
void group_each(std::span<const MatmulJob> jobs) {
  for (const MatmulJob& j : jobs) Matmul(*j.w, j.x, j.n, j.y);
}

// Rows of one job a task takes: about 64 KiB of weights (a few tasks per expert matrix), so the
// tasks of a group balance over the threads and each still streams long runs of rows.
int64_t group_task_rows(const QMatrix& w) {
  const int64_t bytes = int64_t(w.row_bytes() + 2 * w.scale_row_bytes());
  return std::max<int64_t>(1, (int64_t(64) << 10) / std::max<int64_t>(1, bytes));
}

template <Isa I>
void matmul_q8act_group(std::span<const MatmulJob> jobs) {
  // Each job's activations prepared once (buffers kept per thread, grown only), then one
  // parallel_for over (job, row range) tasks.
  thread_local std::vector<avx2::PreparedQ8> preps;
  thread_local std::vector<int64_t> first_task;  // [job + 1]: the job's first task
  if (preps.size() < jobs.size()) preps.resize(jobs.size());
  first_task.assign(1, 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    int64_t tasks = 0;
    if (avx2_usable(*j.w) && avx2::q8_supported(*j.w) && j.n > 0) {
      avx2::prepare_q8(*j.w, j.x, j.n, preps[i]);
      tasks = (j.w->rows + group_task_rows(*j.w) - 1) / group_task_rows(*j.w);
    } else {
      matmul_q8act<I>(*j.w, j.x, j.n, j.y);  // formats without the int8 kernels: on their own
    }
    first_task.push_back(first_task.back() + tasks);
  }
  const int64_t total = first_task.back();
  if (total == 0) return;
  struct Job {
    std::span<const MatmulJob> jobs;
    const std::vector<avx2::PreparedQ8>& preps;
    const std::vector<int64_t>& first_task;
  } job{jobs, preps, first_task};
  auto run = [j = &job](int64_t task) {
    const size_t i = size_t(std::upper_bound(j->first_task.begin(), j->first_task.end(), task) - j->first_task.begin()) - 1;
    const MatmulJob& m = j->jobs[i];
    const int64_t per = group_task_rows(*m.w);
    const int64_t r0 = (task - j->first_task[i]) * per, r1 = std::min(m.w->rows, r0 + per);
    if constexpr (I == Isa::Avx512Vnni) avx512::matmul_rows_q8(*m.w, j->preps[i], m.n, m.y, r0, r1);
    else avx2::matmul_rows_q8(*m.w, j->preps[i], m.n, m.y, r0, r1);
  };
  if (ThreadPool::global().size() == 1 || total == 1) {
    for (int64_t t = 0; t < total; ++t) run(t);
    return;
  }
  ThreadPool::global().parallel_for(total, run);
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
  static const Kernels reference{&ref::matmul, &group_each<&ref::matmul>, &ref::dequant_row, "reference"};
  static const Kernels cpu_avx2{&matmul_q8act<Isa::Avx2>, &matmul_q8act_group<Isa::Avx2>, &ref::dequant_row, "cpu"};
  static const Kernels cpu_vnni{&matmul_q8act<Isa::Avx512Vnni>, &matmul_q8act_group<Isa::Avx512Vnni>,
                                &ref::dequant_row, "cpu"};
  static const Kernels cpu_f32{&matmul_f32act, &group_each<&matmul_f32act>, &ref::dequant_row, "cpu-f32"};
  if (b != Backend::Reference && !has_isa(isa)) fail("this CPU has no {}", isa_name(isa));
  switch (b) {
    case Backend::Reference: return reference;
    case Backend::Cpu: return isa == Isa::Avx512Vnni ? cpu_vnni : cpu_avx2;
    case Backend::CpuF32: return cpu_f32;
  }
  return reference;
}

namespace {
// set_cpu_isa's choice; -1: none.
std::atomic<int> g_isa{-1};
}  // namespace

void set_cpu_isa(Isa isa) {
  if (!has_isa(isa))
    fail("--isa {}: this CPU does not run it (it runs {}); leave --isa out for the best it has", isa_name(isa),
         available_isas().empty() ? "neither: the reference kernels only" : isa_name(available_isas().back()));
  g_isa.store(int(isa), std::memory_order_relaxed);
}

Isa cpu_isa() {
  const int chosen = g_isa.load(std::memory_order_relaxed);
  if (chosen >= 0) return Isa(chosen);
  return has_isa(Isa::Avx512Vnni) ? Isa::Avx512Vnni : Isa::Avx2;
}

Isa parse_isa(std::string_view s) {
  for (Isa i : {Isa::Avx2, Isa::Avx512Vnni})
    if (s == isa_name(i)) return i;
  fail("unknown instruction set '{}' (use 'avx2' or 'avx512-vnni')", s);
}

const Kernels& kernels_for(Backend b) {
  const Isa isa = cpu_isa();
  if (b != Backend::Reference && !has_isa(isa)) return kernels_for(Backend::Reference, isa);
  return kernels_for(b, isa);
}

Backend parse_backend(std::string_view s) {
  if (s == "reference") return Backend::Reference;
  if (s == "cpu") return Backend::Cpu;
  if (s == "cpu-f32") return Backend::CpuF32;
  fail("unknown backend '{}' (use 'cpu', 'cpu-f32' or 'reference')", s);
}

}  // namespace swiftlet
