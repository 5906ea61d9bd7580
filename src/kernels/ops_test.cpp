// swiftlet_ops_test: every operation x shape x form against its scalar reference, in one table.
// The forms are those this machine runs:
//   products (matmul): cpu/<isa> (int8 activations) and cpu-f32/<isa> for each instruction set
//     of available_isas() (avx2, avx512-vnni; neon, neon-dotprod, neon-i8mm), each distinct
//     kernel once;
//   token mixers and activations: f8/avx2 or f8/neon (mixers.h: one 8-lane source, simd_f8.h);
//   with a usable CUDA GPU, each CUDA kernel of the operation (cuda/...: the prompt's and the
//     decode's forms, the tensor-core and streamed variants the device runs).
// The reference of each operation is the one Backend::Reference runs. Each case's error is
// measured against its own bound (fit <= 1 passes): the int8 rounding bound for int8
// activations, float rounding for the rest.
//   swiftlet_ops_test [--op NAME] [--form PREFIX] [--perf] [--threads N] [--no-gpu]
// Default: check every case, one line each; exit status 1 when any fails. --op keeps one
// operation, --form the forms whose name starts with PREFIX ("cuda", "cpu-f32/avx2"). --perf: also each
// form's best time, GB/s of the bytes the operation must move (weights, activations, state, KV
// cache, each once) and that as a share of its memory's bandwidth measured in the same run (the
// CPU's read bandwidth; the GPU's device-to-device copy rate, read and write counted), and the
// speed-up over the reference (over 100% of the bandwidth where the operation's data stays in the
// caches, as at the smaller shapes here). ctest runs the check (label unit), on aarch64 under qemu.
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/mixers.h"
#include "kernels/cpu/read_bandwidth.h"
#include "kernels/cpu/simd_cpu.h"
#include "support/random_weights.h"

#if SWIFTLET_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace swiftlet {
namespace {

using namespace swiftlet::testing;

// A way to run an operation: a products table or a mixers table (never both). int8: the
// products take int8 activations for affine weights (the cpu backend).
struct Form {
  std::string name;
  const Kernels* products = nullptr;
  const MixerKernels* mixers = nullptr;
  bool int8 = false;
};

// A CUDA kernel of a case, on device copies of the case's inputs: reset() puts its inputs and
// state back (empty: nothing to put back), call() enqueues the kernel(s) on the default stream,
// outputs() reads back what it wrote (waiting for it).
struct GpuForm {
  std::string name;
  std::function<void()> reset;
  std::function<void()> call;
  std::function<std::vector<float>()> outputs;
  std::vector<float> run() const {
    if (reset) reset();
    call();
    return outputs();
  }
};

// One operation at one shape, on buffers of its own: reset() puts its inputs and state back,
// call(form) runs the operation on them in place, outputs() is what it wrote (the updated state
// included); fit(got, want, form) is the worst error in units of the case's bound for that form.
// gpu: its CUDA forms (none without a usable GPU), checked with the same fit as the CPU's float
// forms.
struct Case {
  std::string op, shape;
  double bytes = 0;  // what the operation must move once
  bool product = false;
  std::function<void()> reset = [] {};
  std::function<void(const Form&)> call;
  std::function<std::vector<float>()> outputs;
  std::function<double(const std::vector<float>&, const std::vector<float>&, const Form&)> fit;
  std::vector<GpuForm> gpu;
  std::vector<float> run(const Form& form) const {
    reset();
    call(form);
    return outputs();
  }
};

// Worst |got - want| / (rel |want| + abs) over the elements (fit_q8's measure); NaN is the worst.
double fit_close(const std::vector<float>& got, const std::vector<float>& want, double rel, double abs) {
  if (got.size() != want.size()) return INFINITY;
  std::vector<float> bound(want.size());
  for (size_t i = 0; i < want.size(); ++i) bound[i] = float(rel * std::fabs(want[i]) + abs);
  return fit_q8(got, want, bound).worst;
}

// Worst |got - want| over the largest |want|, in units of `tol`.
double fit_relative_to_max(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  double den = 0;
  for (float w : want) den = std::max(den, double(std::fabs(w)));
  return fit_close(got, want, 0, tol * std::max(den, 1e-30));
}

std::vector<float> normal(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// ---- the CUDA forms ----

// The host inputs of a case, as its GPU forms take them (shared with the CPU forms' closures).
struct MatmulIn {
  std::shared_ptr<OwnedMatrix> w;
  std::shared_ptr<std::vector<float>> x;
  int64_t n;
};
struct SiluMulIn {
  std::shared_ptr<std::vector<float>> g, u;
};
struct ConvIn {
  std::shared_ptr<std::vector<float>> x, w, state;
  int64_t T, C;
  int K;
};
struct NormIn {
  std::shared_ptr<std::vector<float>> x, z, w;
  bool gated;
  int heads, n;
};
struct AttentionIn {
  std::shared_ptr<std::vector<float>> q, K, V;
  attn::AttnShape sh;
  int64_t pos0, T;
};

// Whether the cases get their CUDA forms (a usable GPU, and no --no-gpu).
bool use_gpu = false;

#if SWIFTLET_HAVE_CUDA
// Device memory that frees itself, shared by a case's closures.
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) : p_(cuda::gpu_alloc(std::max<size_t>(bytes, 16))) {
    cuda::gpu_memset(p_, 0, std::max<size_t>(bytes, 16));
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { cuda::gpu_free(p_); }
  void* get() const { return p_; }
  float* f() const { return static_cast<float*>(p_); }

 private:
  void* p_;
};
using Device = std::shared_ptr<DeviceMemory>;

Device device_zeros(size_t floats) { return std::make_shared<DeviceMemory>(floats * sizeof(float)); }
Device device_copy(const std::vector<float>& h) {
  Device d = device_zeros(h.size());
  cuda::gpu_upload(d->f(), h.data(), h.size() * sizeof(float));
  return d;
}
// The floats of each part, one after the other (an output, then the state it advanced).
std::vector<float> device_read(std::initializer_list<std::pair<Device, size_t>> parts) {
  std::vector<float> all;
  for (const auto& [d, n] : parts) {
    const size_t at = all.size();
    all.resize(at + n);
    cuda::gpu_download(all.data() + at, d->f(), n * sizeof(float));
  }
  return all;
}
// Copies `floats` from src to dst on the device (a form's reset).
void device_put(const Device& dst, const Device& src, size_t floats) {
  cuda::gpu_copy(dst->f(), src->f(), floats * sizeof(float));
}

struct DeviceMatrix {
  void* owner = nullptr;
  cuda::GpuMatrix m;
  explicit DeviceMatrix(const QMatrix& w) : m(cuda::upload_matrix(w, &owner)) {}
  DeviceMatrix(const DeviceMatrix&) = delete;
  DeviceMatrix& operator=(const DeviceMatrix&) = delete;
  ~DeviceMatrix() { cuda::gpu_free(owner); }
};

// The prompt's products (fp32 tiles; the tensor cores where they take the matrix) and the
// decode's fused product in each variant the device runs (integer MMAs of streamed rows, the
// streamed rows alone, the plain kernel), one segment over n tokens.
void add_gpu_forms(Case& c, const MatmulIn& in) {
  if (!use_gpu) return;
  const int64_t n = in.n, rows = in.w->m.rows, cols = in.w->m.cols;
  const int group = in.w->m.group_size;
  auto w = std::make_shared<DeviceMatrix>(in.w->m);
  Device x = device_copy(*in.x), y = device_zeros(size_t(n * rows));
  auto out = [y, n, rows] { return device_read({{y, size_t(n * rows)}}); };
  c.gpu.push_back({"cuda/matmul", {}, [=] { cuda::matmul(w->m, x->f(), n, y->f()); }, out});
  if (in.w->m.format != WeightFormat::Affine) return;
  if (cuda::gemm_takes(w->m, group) && rows > 256) {
    auto q = std::make_shared<DeviceMemory>(cuda::quantized_rows_bytes(n, cols, group));
    c.gpu.push_back({"cuda/gemm", {},
                     [=] {
                       const cuda::RowsIn r = cuda::prepare_rows(x->f(), n, cols, group, q->get());
                       cuda::matmul_rows(w->m, r, n, y->f(), false);
                     },
                     out});
  }
  struct Variant {
    const char* name;
    bool streamed, tensor_cores;
  };
  const bool streamed = cuda::streamed_products(), tensor_cores = cuda::tensor_core_products();
  for (Variant v : {Variant{"cuda/matvec-mma", true, true}, Variant{"cuda/matvec-tma", true, false},
                    Variant{"cuda/matvec", false, false}}) {
    if ((v.streamed && !streamed) || (v.tensor_cores && !tensor_cores)) continue;
    c.gpu.push_back({v.name, {},
                     [=] {
                       cuda::set_streamed_products(v.streamed);
                       cuda::set_tensor_core_products(v.tensor_cores);
                       cuda::MatvecSegment seg;
                       seg.w = w->m;
                       seg.d_y = y->f();
                       seg.y_stride = rows;
                       cuda::fused_matvec_rows(&seg, 1, int(n), x->f(), cols, nullptr, 0.0f, nullptr);
                       cuda::set_streamed_products(streamed);
                       cuda::set_tensor_core_products(tensor_cores);
                     },
                     out});
  }
}

void add_gpu_forms(Case& c, const SiluMulIn& in) {
  if (!use_gpu) return;
  const size_t n = in.g->size();
  Device g = device_copy(*in.g), u = device_copy(*in.u), y = device_zeros(n);
  c.gpu.push_back({"cuda", {}, [=] { cuda::silu_mul(g->f(), u->f(), int64_t(n), y->f()); },
                   [=] { return device_read({{y, n}}); }});
}

// The prompt's scan over T tokens and the decode's step token by token.
void add_gpu_forms(Case& c, const ConvIn& in) {
  if (!use_gpu) return;
  const int64_t T = in.T, C = in.C;
  const int K = in.K;
  const size_t states = in.state->size();
  Device x = device_copy(*in.x), w = device_copy(*in.w), s0 = device_copy(*in.state), s = device_zeros(states),
         u = device_zeros(size_t(T * C));
  auto reset = [=] { device_put(s, s0, states); };
  auto out = [=] { return device_read({{u, size_t(T * C)}, {s, states}}); };
  c.gpu.push_back({"cuda/scan", reset,
                   [=] { cuda::conv1d_silu_scan(x->f(), C, w->f(), s->f(), C, K, T, u->f(), C); }, out});
  c.gpu.push_back({"cuda/step", reset,
                   [=] {
                     for (int64_t t = 0; t < T; ++t)
                       cuda::conv1d_silu_step(x->f() + t * C, w->f(), s->f(), C, K, u->f() + t * C);
                   },
                   out});
}

void add_gpu_forms(Case& c, const NormIn& in) {
  if (!use_gpu) return;
  const size_t size = in.x->size();
  const int heads = in.heads, n = in.n;
  Device x = device_copy(*in.x), z = device_copy(*in.z), w = device_copy(*in.w), o = device_zeros(size);
  std::function<void()> call;
  if (in.gated) call = [=] { cuda::gated_rms_norm(o->f(), z->f(), w->f(), heads, n, 1e-6f); };
  else call = [=] { cuda::l2_norm_rows(o->f(), heads, n, 1e-6f, 0.5f); };
  c.gpu.push_back({"cuda", [=] { device_put(o, x, size); }, call, [=] { return device_read({{o, size}}); }});
}

// The decode's kernel, query by query, and the prompt's (a block per head and token below 16
// tokens, tiles of 64 queries from there).
void add_gpu_forms(Case& c, const AttentionIn& in) {
  if (!use_gpu) return;
  const attn::AttnShape sh = in.sh;
  const int64_t T = in.T, pos0 = in.pos0, qs = int64_t(sh.heads) * sh.head_dim;
  const float scale = 1.0f / std::sqrt(float(sh.head_dim));
  Device q = device_copy(*in.q), K = device_copy(*in.K), V = device_copy(*in.V), o = device_zeros(size_t(T * qs));
  auto out = [=] { return device_read({{o, size_t(T * qs)}}); };
  c.gpu.push_back({"cuda/decode", {},
                   [=] {
                     for (int64_t t = 0; t < T; ++t)
                       cuda::attention_decode(q->f() + t * qs, K->f(), V->f(), pos0 + t + 1, sh.heads, sh.kv_heads,
                                              sh.head_dim, scale, nullptr, o->f() + t * qs);
                   },
                   out});
  cuda::AttentionSpec spec;
  spec.nh = sh.heads;
  spec.nkv = sh.kv_heads;
  spec.hd = sh.head_dim;
  spec.scale = scale;
  c.gpu.push_back({"cuda/prefill", {},
                   [=] { cuda::attention_prefill(spec, q->f(), nullptr, K->f(), V->f(), pos0, T, o->f()); }, out});
}

bool gpu_usable(std::string* why) { return cuda::cuda_available(why); }
std::string gpu_description() { return cuda::device_description(); }

// Best seconds of a GPU form's call, timed with CUDA events over enough calls for ~50 ms.
double gpu_seconds(const GpuForm& g) {
  if (g.reset) g.reset();
  const double once = cuda::gpu_time_ms(g.call, 3);
  const int iters = std::clamp(int(50.0 / std::max(once, 1e-3)), 3, 2000);
  return cuda::gpu_time_ms(g.call, iters) / 1e3;
}

// The GPU's device-to-device copy rate in GB/s, the bytes read and written both counted.
double gpu_copy_bandwidth() {
  const size_t bytes = size_t(512) << 20;
  DeviceMemory a(bytes), b(bytes);
  const double ms = cuda::gpu_time_ms([&] { cuda::gpu_copy(b.get(), a.get(), bytes); }, 10);
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}
#else
// Built without CUDA: no case has GPU forms.
template <typename In>
void add_gpu_forms(Case&, const In&) {}
bool gpu_usable(std::string* why) {
  *why = "built without CUDA";
  return false;
}
std::string gpu_description() { return {}; }
double gpu_seconds(const GpuForm&) { return INFINITY; }
double gpu_copy_bandwidth() { return 0; }
#endif

// ---- products ----

double matrix_bytes(const QMatrix& m) {
  double b = double(m.rows) * double(m.row_bytes());
  if (m.format == WeightFormat::Affine) b += 2.0 * double(m.rows) * double(m.scale_row_bytes());
  return b;
}

void add_matmul(std::vector<Case>& cases, std::mt19937& rng, WeightFormat f, int bits, int group, int64_t rows,
                int64_t cols, int64_t n) {
  auto w = std::make_shared<OwnedMatrix>(random_matrix(rng, f, rows, cols, bits, DType::BF16, group));
  auto x = std::make_shared<std::vector<float>>(random_x(rng, n, cols));
  const char* fname = f == WeightFormat::Affine ? (bits == 4 ? "q4" : "q8")
                      : f == WeightFormat::BF16 ? "bf16"
                      : f == WeightFormat::F16  ? "f16"
                                                : "f32";
  Case c;
  c.op = "matmul";
  c.shape = fmt::format("{}{} {}x{} n={}", fname, f == WeightFormat::Affine ? fmt::format(" g{}", group) : "", rows,
                        cols, n);
  c.bytes = matrix_bytes(w->m) + 4.0 * double(n * (rows + cols));
  c.product = true;
  auto y = std::make_shared<std::vector<float>>(size_t(n * rows));
  c.call = [w, x, y, n](const Form& form) { form.products->matmul(w->m, x->data(), n, y->data()); };
  c.outputs = [y] { return *y; };
  // int8 activations (affine weights on the cpu backend): the rounding bound, worst case and on
  // average (rounding errors add up like a random walk: well inside the worst case); float
  // rounding otherwise.
  auto q8 = f == WeightFormat::Affine ? std::make_shared<std::vector<float>>(q8_bound(w->m, *x, n)) : nullptr;
  auto fp = std::make_shared<std::vector<float>>(float_bound(w->m, *x, n));
  c.fit = [q8, fp](const std::vector<float>& got, const std::vector<float>& want, const Form& form) {
    const bool int8 = q8 && form.int8;
    const Fit q = fit_q8(got, want, int8 ? *q8 : *fp);
    return int8 ? std::max(q.worst, q.mean_share / 0.25) : q.worst;
  };
  add_gpu_forms(c, MatmulIn{w, x, n});
  cases.push_back(std::move(c));
}

// ---- mixers and activations ----

void add_elementwise(std::vector<Case>& cases, std::mt19937& rng, const std::string& op, int64_t n) {
  auto a = std::make_shared<std::vector<float>>(normal(rng, size_t(n), 4.0f));
  auto b = std::make_shared<std::vector<float>>(normal(rng, size_t(n), 2.0f));
  Case c;
  c.op = op;
  c.shape = fmt::format("n={}", n);
  c.bytes = 12.0 * double(n);
  auto out = std::make_shared<std::vector<float>>();
  c.reset = [a, out] { *out = *a; };
  c.call = [b, out, op, n](const Form& form) {
    (op == "silu_mul" ? form.mixers->silu_mul : form.mixers->sigmoid_gate)(out->data(), b->data(), n);
  };
  c.outputs = [out] { return *out; };
  c.fit = [](const std::vector<float>& got, const std::vector<float>& want, const Form&) {
    return fit_close(got, want, 2e-6, 2e-6);
  };
  if (op == "silu_mul") add_gpu_forms(c, SiluMulIn{a, b});  // (attention's kernels apply its gate)
  cases.push_back(std::move(c));
}

void add_conv(std::vector<Case>& cases, std::mt19937& rng, int64_t T, int64_t C) {
  const int K = 4;
  auto x = std::make_shared<std::vector<float>>(normal(rng, size_t(T * C)));
  auto w = std::make_shared<std::vector<float>>(normal(rng, size_t(C * K), 0.5f));
  auto st = std::make_shared<std::vector<float>>(normal(rng, size_t((K - 1) * C)));
  Case c;
  c.op = "conv_silu";
  c.shape = fmt::format("T={} C={} K={}", T, C, K);
  c.bytes = 4.0 * double(2 * T * C + C * K + 2 * (K - 1) * C);
  auto out = std::make_shared<std::vector<float>>(), s = std::make_shared<std::vector<float>>();
  c.reset = [x, st, out, s] { *out = *x, *s = *st; };
  c.call = [w, out, s, T, C](const Form& form) { form.mixers->conv_silu(out->data(), T, C, w->data(), K, s->data()); };
  c.outputs = [out, s] {
    std::vector<float> all = *out;
    all.insert(all.end(), s->begin(), s->end());  // the advanced state is an output too
    return all;
  };
  c.fit = [](const std::vector<float>& got, const std::vector<float>& want, const Form&) {
    return fit_relative_to_max(got, want, 1e-6);
  };
  add_gpu_forms(c, ConvIn{x, w, st, T, C, K});
  cases.push_back(std::move(c));
}

void add_norm(std::vector<Case>& cases, std::mt19937& rng, bool gated, int heads, int n) {
  auto x = std::make_shared<std::vector<float>>(normal(rng, size_t(heads * n)));
  auto z = std::make_shared<std::vector<float>>(normal(rng, size_t(heads * n)));
  auto w = std::make_shared<std::vector<float>>(normal(rng, size_t(n)));
  Case c;
  c.op = gated ? "gated_rms_norm" : "l2_norm_heads";
  c.shape = fmt::format("{}x{}", heads, n);
  c.bytes = 4.0 * double(heads * n) * (gated ? 3 : 2);
  auto out = std::make_shared<std::vector<float>>();
  c.reset = [x, out] { *out = *x; };
  c.call = [z, w, out, gated, heads, n](const Form& form) {
    if (gated) form.mixers->gated_rms_norm(out->data(), z->data(), w->data(), heads, n, 1e-6f);
    else form.mixers->l2_norm_heads(out->data(), heads, n, 1e-6f, 0.5f);
  };
  c.outputs = [out] { return *out; };
  c.fit = [](const std::vector<float>& got, const std::vector<float>& want, const Form&) {
    return fit_relative_to_max(got, want, 1e-6);
  };
  add_gpu_forms(c, NormIn{x, z, w, gated, heads, n});
  cases.push_back(std::move(c));
}

// The delta rule over T tokens, token by token (the fused recurrence, decode's form) or chunked
// (prompts' form); the reference runs token by token either way. Inputs as the model makes them: unit q and k (q scaled by
// 1/sqrt(dk)), decays from mild to strong, betas in (0, 1), a nonzero incoming state.
void add_delta(std::vector<Case>& cases, std::mt19937& rng, gdn::DeltaShape sh, int64_t T, bool chunked) {
  const int64_t kd = int64_t(sh.key_heads) * sh.key_dim, stride = 2 * kd + int64_t(sh.value_heads) * sh.value_dim;
  auto qkv = std::make_shared<std::vector<float>>(normal(rng, size_t(T * stride)));
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < sh.key_heads; ++h) {
      float* row = qkv->data() + t * stride;
      ref::l2_norm_scaled(row + h * sh.key_dim, sh.key_dim, 1e-6f, 1.0f / std::sqrt(float(sh.key_dim)));
      ref::l2_norm_scaled(row + kd + h * sh.key_dim, sh.key_dim, 1e-6f, 1.0f);
    }
  // The decays and betas from their inputs as the model makes them: g = -exp(A_log[h])
  // softplus(a + dt_bias[h]), beta = sigmoid(b).
  const int hv = sh.value_heads;
  auto A_log = std::make_shared<std::vector<float>>(size_t(hv));
  auto dt_bias = std::make_shared<std::vector<float>>(size_t(hv));
  auto a = std::make_shared<std::vector<float>>(size_t(T * hv)), b = std::make_shared<std::vector<float>>(a->size());
  auto g = std::make_shared<std::vector<float>>(a->size()), beta = std::make_shared<std::vector<float>>(a->size());
  std::normal_distribution<float> nd;
  for (int h = 0; h < hv; ++h) (*A_log)[size_t(h)] = -1.0f + 0.5f * nd(rng), (*dt_bias)[size_t(h)] = 0.5f * nd(rng);
  for (size_t i = 0; i < g->size(); ++i) {
    const size_t h = i % size_t(hv);
    (*a)[i] = 2.0f * nd(rng), (*b)[i] = nd(rng);
    (*g)[i] = -std::exp((*A_log)[h]) * ref::softplus((*a)[i] + (*dt_bias)[h]);
    (*beta)[i] = ref::sigmoid((*b)[i]);
  }
  const size_t state = size_t(sh.value_heads) * sh.key_dim * sh.value_dim;
  auto S0 = std::make_shared<std::vector<float>>(normal(rng, state, 0.3f));
  Case c;
  c.op = chunked ? "delta_rule_chunked" : "delta_rule";
  c.shape = fmt::format("{}/{} heads x {}x{} T={}", sh.key_heads, sh.value_heads, sh.key_dim, sh.value_dim, T);
  c.bytes = 4.0 * double(2 * state + T * (stride + 2 * sh.value_heads + int64_t(sh.value_heads) * sh.value_dim));
  auto out = std::make_shared<std::vector<float>>(size_t(T * sh.value_heads * sh.value_dim));
  auto S = std::make_shared<std::vector<float>>();
  c.reset = [S0, S] { *S = *S0; };
  c.call = [=](const Form& form) {
    gdn::DeltaBatch b;
    b.T = T;
    b.q = qkv->data();
    b.k = qkv->data() + kd;
    b.v = qkv->data() + 2 * kd;
    b.qkv_stride = stride;
    b.g = g->data();
    b.beta = beta->data();
    b.gate_stride = sh.value_heads;
    b.out = out->data();
    b.out_stride = int64_t(sh.value_heads) * sh.value_dim;
    (chunked ? form.mixers->delta_rule_chunked : form.mixers->delta_rule)(sh, b, S->data());
  };
  // The outputs and the state, each within 1e-4 of its largest value.
  c.outputs = [out, S] {
    std::vector<float> all = *out;
    all.insert(all.end(), S->begin(), S->end());
    return all;
  };
  const size_t outs = out->size();
  c.fit = [outs](const std::vector<float>& got, const std::vector<float>& want, const Form&) {
    if (got.size() != want.size()) return double(INFINITY);
    auto part = [&](const std::vector<float>& v, size_t a, size_t b) {
      return std::vector<float>(v.begin() + ptrdiff_t(a), v.begin() + ptrdiff_t(b));
    };
    return std::max(fit_relative_to_max(part(got, 0, outs), part(want, 0, outs), 1e-4),
                    fit_relative_to_max(part(got, outs, got.size()), part(want, outs, want.size()), 1e-4));
  };
  cases.push_back(std::move(c));
}

// Causal attention of T rows at positions pos0 .. over the cache (peaked softmaxes as well as
// flat ones: inputs of scale 2).
void add_attention(std::vector<Case>& cases, std::mt19937& rng, attn::AttnShape sh, int64_t pos0, int64_t T) {
  const int64_t qs = int64_t(sh.heads) * sh.head_dim, kvs = int64_t(sh.kv_heads) * sh.head_dim, n = pos0 + T;
  auto q = std::make_shared<std::vector<float>>(normal(rng, size_t(T * qs), 2.0f));
  auto K = std::make_shared<std::vector<float>>(normal(rng, size_t(n * kvs), 2.0f));
  auto V = std::make_shared<std::vector<float>>(normal(rng, size_t(n * kvs), 2.0f));
  Case c;
  c.op = "attend";
  c.shape = fmt::format("{}/{} heads x {} pos {} T={}", sh.heads, sh.kv_heads, sh.head_dim, pos0, T);
  c.bytes = 4.0 * double(2 * n * kvs + 2 * T * qs);
  auto out = std::make_shared<std::vector<float>>(size_t(T * qs));
  c.call = [=](const Form& form) {
    const attn::AttnBatch b{T, pos0, q->data(), qs, K->data(), V->data(), kvs,
                            1.0f / std::sqrt(float(sh.head_dim)), out->data(), qs};
    form.mixers->attend(sh, b);
  };
  c.outputs = [out] { return *out; };
  c.fit = [](const std::vector<float>& got, const std::vector<float>& want, const Form&) {
    return fit_close(got, want, 0, 5e-5);
  };
  add_gpu_forms(c, AttentionIn{q, K, V, sh, pos0, T});
  cases.push_back(std::move(c));
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  std::mt19937 rng(2026);
  // Products: an expert's projection in decode and in a batch of 8 (4 and 8 bits, groups of 64
  // and 128), tile and block remainders, dense weights with ragged columns.
  for (int64_t n : {1, 8}) {
    add_matmul(cases, rng, WeightFormat::Affine, 4, 64, 512, 2048, n);
    add_matmul(cases, rng, WeightFormat::Affine, 8, 64, 512, 2048, n);
    add_matmul(cases, rng, WeightFormat::BF16, 0, 0, 512, 2048, n);
  }
  add_matmul(cases, rng, WeightFormat::Affine, 4, 128, 130, 1152, 17);
  add_matmul(cases, rng, WeightFormat::Affine, 8, 64, 7, 576, 3);
  add_matmul(cases, rng, WeightFormat::F16, 0, 0, 33, 389, 5);
  add_matmul(cases, rng, WeightFormat::F32, 0, 0, 7, 131, 2);
  // Mixers and activations at the models' shapes and at shapes with tails: lengths around the
  // 8-lane width, the conv's channels past a multiple of 8, the delta rule's fixture shapes (dv
  // not a multiple of 32), real head sizes and tails everywhere, at chunk boundaries; attention
  // with grouped and single KV heads, head sizes of 24 to 256, contexts split over threads, prompt
  // rows past the GPU's 16 (its tiled form).
  for (int64_t n : {1, 7, 8, 9, 63, 512, 1027, 4096}) add_elementwise(cases, rng, "silu_mul", n);
  for (int64_t n : {37, 4096}) add_elementwise(cases, rng, "sigmoid_gate", n);
  for (int64_t C : {64, 77})
    for (int64_t T : {1, 2, 5}) add_conv(cases, rng, T, C);
  add_conv(cases, rng, 1, 8192);
  for (bool gated : {false, true}) {
    add_norm(cases, rng, gated, 3, 20);
    add_norm(cases, rng, gated, gated ? 32 : 16, 128);
  }
  const gdn::DeltaShape small{2, 4, 16, 24}, real{2, 4, 128, 128}, odd{1, 3, 12, 13};
  for (const gdn::DeltaShape& sh : {small, real, odd}) {
    for (int64_t T : {1, 2, 65}) add_delta(cases, rng, sh, T, false);
    for (int64_t T : {1, 2, 63, 64, 65, 130, 200}) add_delta(cases, rng, sh, T, true);
  }
  for (attn::AttnShape sh : {attn::AttnShape{16, 2, 256}, attn::AttnShape{4, 2, 32}, attn::AttnShape{16, 1, 64},
                             attn::AttnShape{6, 2, 24}})
    for (auto [pos0, T] :
         {std::pair<int64_t, int64_t>{0, 1}, {0, 7}, {37, 1}, {100, 3}, {1000, 1}, {3000, 1}, {0, 64}, {100, 20}})
      add_attention(cases, rng, sh, pos0, T);
  return cases;
}

// The forms of this CPU, each distinct kernel table once.
std::vector<Form> product_forms() {
  std::vector<Form> out;
  for (Backend b : {Backend::Cpu, Backend::CpuF32})
    for (Isa isa : available_isas()) {
      const Kernels* k = &kernels_for(b, isa);
      if (std::none_of(out.begin(), out.end(), [&](const Form& f) { return f.products->matmul == k->matmul; }))
        out.push_back({fmt::format("{}/{}", k->name, isa_name(isa)), k, nullptr, b == Backend::Cpu});
    }
  return out;
}

std::vector<Form> mixer_forms() {
  if (!simd::cpu_runs_f8()) return {};
  return {{fmt::format("f8/{}", simd::f8_isa()), nullptr, &mixers_for(Backend::Cpu)}};
}

// Best seconds of fn over repetitions lasting at least `budget` seconds (and 3 runs).
double best_seconds(const std::function<void()>& fn, double budget) {
  using Clock = std::chrono::steady_clock;
  double best = INFINITY, total = 0;
  for (int rep = 0; rep < 3 || (total < budget && rep < 100000); ++rep) {
    const auto t0 = Clock::now();
    fn();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
  }
  return best;
}

int run(int argc, char** argv) {
  std::string only, form_prefix;
  bool perf = false, gpu = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--perf") {
      perf = true;
    } else if (a == "--form" && i + 1 < argc) {
      form_prefix = argv[++i];
    } else if (a == "--no-gpu") {
      gpu = false;
    } else if (a == "--op" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      const int t = std::atoi(argv[++i]);
      if (t < 1) fail("--threads takes a positive count, not '{}'", argv[i]);
      ThreadPool::set_global_threads(t);
    } else {
      fail("usage: swiftlet_ops_test [--op NAME] [--form PREFIX] [--perf] [--threads N] [--no-gpu] ('{}' is not an "
           "option)",
           a);
    }
  }
  std::vector<Form> pforms = product_forms(), mforms = mixer_forms();
  auto unwanted = [&](const std::string& name) { return name.compare(0, form_prefix.size(), form_prefix) != 0; };
  std::erase_if(pforms, [&](const Form& f) { return unwanted(f.name); });
  std::erase_if(mforms, [&](const Form& f) { return unwanted(f.name); });
  const Form pref{"reference", &kernels_for(Backend::Reference), nullptr, false};
  const Form mref{"reference", nullptr, &mixers_for(Backend::Reference), false};
  std::string why = "--no-gpu";
  use_gpu = gpu && gpu_usable(&why);
  fmt::print("gpu: {}\n", use_gpu ? gpu_description() : "none (" + why + ")");
  double bw = 0, gpu_bw = 0;
  if (perf) {
    ReadBandwidth r(size_t(256) << 20);
    bw = r.best(5);
    fmt::print("threads {}  read bandwidth {:.1f} GB/s (best of 5 passes over 256 MiB)\n", ThreadPool::global().size(), bw);
    if (use_gpu) {
      gpu_bw = gpu_copy_bandwidth();
      fmt::print("gpu copy bandwidth {:.1f} GB/s (512 MiB device to device, read and write counted)\n", gpu_bw);
    }
  }
  std::vector<Case> cases = all_cases();
  std::erase_if(cases, [&](const Case& c) { return !only.empty() && c.op != only; });
  if (cases.empty()) fail("no operation named '{}'", only);
  fmt::print("{:<19} {:<32} {:<20} {:>8}{}\n", "op", "shape", "form", "fit", perf ? "       us      GB/s   of bw  vs ref" : "");
  int failed = 0, checked = 0;
  for (const Case& c : cases) {
    const Form& ref = c.product ? pref : mref;
    const std::vector<float> want = c.run(ref);
    // The time of a call alone: of reset + call, less that of reset.
    const double t_reset = perf ? best_seconds(c.reset, 0.05) : 0;
    auto timed = [&](const Form& form) {
      return std::max(1e-9, best_seconds([&] { c.reset(), c.call(form); }, 0.2) - t_reset);
    };
    const double t_ref = perf ? timed(ref) : 0;
    // One line a form: its fit and, with --perf, its time (seconds()) against `bound` GB/s.
    auto report = [&](const std::string& name, double fit, auto seconds, double bound) {
      const bool ok = fit <= 1.0;
      failed += !ok;
      ++checked;
      std::string line = fmt::format("{:<19} {:<32} {:<20} {:>8.3f}", c.op, c.shape, name, fit);
      if (perf) {
        const double t = seconds();
        const double gbs = c.bytes / t / 1e9;
        line += fmt::format(" {:>8.1f} {:>9.2f} {:>6.1f}% {:>6.1f}x", t * 1e6, gbs, 100.0 * gbs / bound, t_ref / t);
      }
      fmt::print("{}{}\n", line, ok ? "" : "  FAIL");
    };
    for (const Form& form : c.product ? pforms : mforms)
      report(form.name, c.fit(c.run(form), want, form), [&] { return timed(form); }, bw);
    for (const GpuForm& g : c.gpu)
      if (!unwanted(g.name)) report(g.name, c.fit(g.run(), want, Form{g.name}), [&] { return gpu_seconds(g); }, gpu_bw);
  }
  if (checked == 0 && !form_prefix.empty()) fail("no form named '{}...' runs here for these operations", form_prefix);
  fmt::print("{} of {} cases within their bounds\n", checked - failed, checked);
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace swiftlet

int main(int argc, char** argv) {
  try {
    return swiftlet::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swiftlet_ops_test: %s\n", e.what());
    return 2;
  }
}
