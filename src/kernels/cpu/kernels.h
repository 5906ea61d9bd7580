// One dispatch point for the CPU kernels: the scalar reference (the oracle) or the fast ones,
// chosen at run time (--backend).
#pragma once

#include "core/qmatrix.h"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace swiftlet {

// Reference: scalar fp32 (the oracle). Cpu: AVX2 / NEON kernels with int8 activations for
// quantised weights (fast; activations rounded to 8 bits per group of 64). CpuF32: AVX2 / NEON
// kernels with fp32 activations throughout (as exact as the reference, slower on quantised
// weights).
enum class Backend { Reference, Cpu, CpuF32 };

// One product of a group: Y[t, rows] = W X[t, cols] for t < n.
struct MatmulJob {
  const QMatrix* w;
  const float* x;
  int64_t n;
  float* y;
};

struct Kernels {
  // Y[t, rows] = W X[t, cols] for t < n.
  void (*matmul)(const QMatrix& w, const float* x, int64_t n, float* y);
  // Every job of a group, as matmul computes each (the same results bit for bit), with the rows
  // of all of them split over the thread pool at once: a layer's routed experts, small products
  // each, keep every thread busy without a wait per product.
  void (*matmul_group)(std::span<const MatmulJob> jobs);
  // out[0..cols) = row r of W.
  void (*dequant_row)(const QMatrix& w, int64_t r, float* out);
  const char* name;
};

// The instruction sets the fast kernels are built for. Kernels choose the best one the CPU has;
// tests and benchmarks select each in turn. x86-64: AVX2, AVX-512 VNNI (so far only the
// int8-activation products, the cpu backend on affine weights, have an AVX-512 form; everything
// else runs the AVX2 kernels). aarch64: NEON (every CPU), NEON with dotprod (`sdot`), NEON with
// i8mm (`smmla`); there the int8-activation products have a form for each, the fp32-activation
// products one NEON form. The token mixers and activations (mixers.h) have one 8-lane form,
// AVX2 or NEON (simd_f8.h), whatever the choice here.
enum class Isa { Avx2, Avx512Vnni, Neon, NeonDotprod, NeonI8mm };
std::vector<Isa> available_isas();  // those this CPU runs, weakest first; empty: scalar code only
const char* isa_name(Isa isa);      // "avx2", "avx512-vnni", "neon", "neon-dotprod", "neon-i8mm"

// On cpu_isa(): the best instruction set of this CPU unless set_cpu_isa chose another.
const Kernels& kernels_for(Backend b);
// On `isa`; throws Error when the CPU lacks it.
const Kernels& kernels_for(Backend b, Isa isa);
// The instruction set kernels_for(b) uses from now on (--isa: to compare the kernels on one
// machine, or to avoid one); throws Error when the CPU lacks it. Forwards built before keep theirs.
void set_cpu_isa(Isa isa);
// What kernels_for(b) uses: set_cpu_isa's choice, else the best this CPU runs (AVX2 on a CPU
// without any: kernels_for then gives the reference kernels).
Isa cpu_isa();
// One of isa_name's names (on any machine; set_cpu_isa refuses what the CPU lacks); throws Error
// otherwise.
Isa parse_isa(std::string_view s);
// "reference", "cpu" or "cpu-f32"; throws Error otherwise.
Backend parse_backend(std::string_view s);

}  // namespace swiftlet
