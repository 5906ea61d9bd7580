#include "kernels/cpu/kernels.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul_q8.h"
#include "kernels/cpu/ops_ref.h"
#if defined(__x86_64__)
#include "kernels/cpu/matmul_avx2.h"
#include "kernels/cpu/matmul_avx512.h"
#elif defined(__aarch64__)
#include "kernels/cpu/matmul_neon.h"
#endif

#include <algorithm>
#include <atomic>

namespace swiftlet {

namespace {

#if defined(__x86_64__)
bool avx2_usable(const QMatrix& w) {
  static const bool has = avx2::cpu_has_avx2();
  if (!has) return false;
  if (w.format != WeightFormat::Affine) return true;
  return (w.bits == 4 || w.bits == 8) && w.group_size % (8 * (32 / w.bits)) == 0;
}
// Whether the int8-activation kernels take w (else: the fp32-activation ones).
bool q8_usable(const QMatrix& w) { return avx2_usable(w) && q8::supported(w); }
void prepare_q8(const QMatrix& w, const float* x, int64_t n, q8::PreparedQ8& p) { avx2::prepare_q8(w, x, n, p); }
#elif defined(__aarch64__)
bool q8_usable(const QMatrix& w) { return q8::supported(w); }
void prepare_q8(const QMatrix& w, const float* x, int64_t n, q8::PreparedQ8& p) { neon::prepare_q8(w, x, n, p); }
#else
bool q8_usable(const QMatrix&) { return false; }
void prepare_q8(const QMatrix&, const float*, int64_t, q8::PreparedQ8&) {}
#endif

// Rows [r0, r1) of the int8-activation product on instruction set I.
template <Isa I>
void rows_q8(const QMatrix& w, const q8::PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1) {
#if defined(__x86_64__)
  if constexpr (I == Isa::Avx512Vnni)
    avx512::matmul_rows_q8(w, p, n, y, r0, r1);
  else
    avx2::matmul_rows_q8(w, p, n, y, r0, r1);
#elif defined(__aarch64__)
  if constexpr (I == Isa::NeonI8mm)
    neon::matmul_rows_q8_i8mm(w, p, n, y, r0, r1);
  else if constexpr (I == Isa::NeonDotprod)
    neon::matmul_rows_q8_dotprod(w, p, n, y, r0, r1);
  else
    neon::matmul_rows_q8(w, p, n, y, r0, r1);
#endif
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

// fp32 activations: the AVX2 kernels on x86, the NEON ones on Arm; elsewhere the reference.
void matmul_f32act(const QMatrix& w, const float* x, int64_t n, float* y) {
#if defined(__x86_64__)
  if (avx2_usable(w)) {
    thread_local avx2::Prepared prep;
    avx2::prepare(w, x, n, prep);
    const avx2::Prepared& p = prep;
    split_rows(w, n, [&](int64_t r0, int64_t r1) { avx2::matmul_rows(w, x, p, n, y, r0, r1); });
    return;
  }
#elif defined(__aarch64__)
  split_rows(w, n, [&](int64_t r0, int64_t r1) { neon::matmul_rows_f32(w, x, n, y, r0, r1); });
  return;
#endif
  ref::matmul(w, x, n, y);
}

template <Isa I>
void matmul_q8act(const QMatrix& w, const float* x, int64_t n, float* y) {
  if (!q8_usable(w)) {
    matmul_f32act(w, x, n, y);
    return;
  }
  thread_local q8::PreparedQ8 prep;
  prepare_q8(w, x, n, prep);
  const q8::PreparedQ8& p = prep;
  split_rows(w, n, [&](int64_t r0, int64_t r1) { rows_q8<I>(w, p, n, y, r0, r1); });
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
  thread_local std::vector<q8::PreparedQ8> preps;
  thread_local std::vector<int64_t> first_task;  // [job + 1]: the job's first task
  if (preps.size() < jobs.size()) preps.resize(jobs.size());
  first_task.assign(1, 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    int64_t tasks = 0;
    if (q8_usable(*j.w) && j.n > 0) {
      prepare_q8(*j.w, j.x, j.n, preps[i]);
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
    const std::vector<q8::PreparedQ8>& preps;
    const std::vector<int64_t>& first_task;
  } job{jobs, preps, first_task};
  auto run = [j = &job](int64_t task) {
    const size_t i = size_t(std::upper_bound(j->first_task.begin(), j->first_task.end(), task) - j->first_task.begin()) - 1;
    const MatmulJob& m = j->jobs[i];
    const int64_t per = group_task_rows(*m.w);
    const int64_t r0 = (task - j->first_task[i]) * per, r1 = std::min(m.w->rows, r0 + per);
    rows_q8<I>(*m.w, j->preps[i], m.n, m.y, r0, r1);
  };
  if (ThreadPool::global().size() == 1 || total == 1) {
    for (int64_t t = 0; t < total; ++t) run(t);
    return;
  }
  ThreadPool::global().parallel_for(total, run);
}

constexpr Isa kAllIsas[] = {Isa::Avx2, Isa::Avx512Vnni, Isa::Neon, Isa::NeonDotprod, Isa::NeonI8mm};

bool has_isa(Isa isa) {
#if defined(__x86_64__)
  static const bool avx2 = avx2::cpu_has_avx2(), vnni = avx2 && avx512::cpu_has_avx512_vnni();
  return isa == Isa::Avx2 ? avx2 : isa == Isa::Avx512Vnni ? vnni : false;
#elif defined(__aarch64__)
  static const bool dotprod = neon::cpu_has_dotprod(), i8mm = neon::cpu_has_i8mm();
  return isa == Isa::Neon ? true : isa == Isa::NeonDotprod ? dotprod : isa == Isa::NeonI8mm ? i8mm : false;
#else
  return false;
#endif
}

}  // namespace

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa i : kAllIsas)
    if (has_isa(i)) out.push_back(i);
  return out;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512Vnni:
      return "avx512-vnni";
    case Isa::Neon:
      return "neon";
    case Isa::NeonDotprod:
      return "neon-dotprod";
    case Isa::NeonI8mm:
      return "neon-i8mm";
  }
  return "?";
}

const Kernels& kernels_for(Backend b, Isa isa) {
  static const Kernels reference{&ref::matmul, &group_each<&ref::matmul>, &ref::dequant_row, "reference"};
  // One set per instruction set, in the order of Isa.
  static const Kernels cpu[] = {
      {&matmul_q8act<Isa::Avx2>, &matmul_q8act_group<Isa::Avx2>, &ref::dequant_row, "cpu"},
      {&matmul_q8act<Isa::Avx512Vnni>, &matmul_q8act_group<Isa::Avx512Vnni>, &ref::dequant_row, "cpu"},
      {&matmul_q8act<Isa::Neon>, &matmul_q8act_group<Isa::Neon>, &ref::dequant_row, "cpu"},
      {&matmul_q8act<Isa::NeonDotprod>, &matmul_q8act_group<Isa::NeonDotprod>, &ref::dequant_row, "cpu"},
      {&matmul_q8act<Isa::NeonI8mm>, &matmul_q8act_group<Isa::NeonI8mm>, &ref::dequant_row, "cpu"}};
  static const Kernels cpu_f32{&matmul_f32act, &group_each<&matmul_f32act>, &ref::dequant_row, "cpu-f32"};
  if (b != Backend::Reference && !has_isa(isa)) fail("this CPU has no {}", isa_name(isa));
  switch (b) {
    case Backend::Reference: return reference;
    case Backend::Cpu:
      return cpu[int(isa)];
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
         available_isas().empty() ? "none of them: the reference kernels only" : isa_name(available_isas().back()));
  g_isa.store(int(isa), std::memory_order_relaxed);
}

Isa cpu_isa() {
  const int chosen = g_isa.load(std::memory_order_relaxed);
  if (chosen >= 0) return Isa(chosen);
  static const Isa best = available_isas().empty() ? Isa::Avx2 : available_isas().back();
  return best;
}

Isa parse_isa(std::string_view s) {
  for (Isa i : kAllIsas)
    if (s == isa_name(i)) return i;
  fail(
      "unknown instruction set '{}' (use 'avx2' or 'avx512-vnni' on x86-64, 'neon', 'neon-dotprod' or "
      "'neon-i8mm' on Arm)",
      s);
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
