// What every part of the runtime shares: ATen and the pybind11 casters for its types only (torch/extension.h pulls
// in the whole C++ frontend, which nothing here uses and which cost a fresh machine half of the build's time), the
// codes Python passes (Kernel, Activation, Capture: pybind11 enums in bindings.cpp) and the CPU-level macros.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/native/quantized/PackedParams.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <chrono>
#include <string>
#include <vector>

namespace {

using at::Tensor;
using Packed = c10::intrusive_ptr<LinearPackedParamsBase>;

// How one matmul multiplies: the candidates the runtime times on the real weights when a model loads.
enum Kernel : int64_t { kLinear = 0, kTransposed = 1, kInt8 = 2, kOneDnn = 3, kTiles = 4 };

// fbgemm's int8 kernel or the runtime's own int8 tiles (VNNI or AVX2): the two whose numbers are quantized.
bool quantized(int64_t kernel) { return kernel == kInt8 || kernel == kTiles; }

enum Activation : int64_t { kSilu = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3 };
// What a search keeps of the cross-attention per step: nothing, every layer's and head's (N, L, h, S), or one
// head's rows (N, S) (capture_head < 0: the layer's head average).
enum Capture : int64_t { kCaptureNothing = 0, kCaptureEveryHead = 1, kCaptureOneHead = 2 };

bool plain_cpu(const Tensor& t) { return t.is_cpu() && t.scalar_type() == at::kFloat; }


// The small loops (kernels/cpu_loops.inc, kernels/attend_one.inc) are compiled three times, for AVX-512
// (x86-64-v4), AVX2 with FMA (x86-64-v3) and plain x86-64, each copy in its own namespace under `#pragma GCC
// target`, and every call goes to the copy of `cpu_isa()`: this CPU's level, or a lower one asked for at load
// (TRANSLATE_CPU_ISA), so that one build serves every machine it lands on and the
// AVX2 path can be measured on an AVX-512 CPU. Their sums are `omp simd` reductions (built with -fopenmp-simd:
// vector lanes, no threads), so they may add in another order than a scalar loop: float32 rounding, as the
// matmul kernels already differ between CPUs.
enum CpuIsa : int { kIsaBase = 1, kIsaAvx2 = 2, kIsaAvx512 = 3 };

int detected_cpu_isa() {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return kIsaAvx512;
  if (__builtin_cpu_supports("x86-64-v3")) return kIsaAvx2;
#endif
  return kIsaBase;
}

int g_cpu_isa = detected_cpu_isa();  // lowered by set_cpu_isa, never raised above what the CPU has

inline int cpu_isa() { return g_cpu_isa; }

// Limit the loops (and, through cpu_isa(), the int8 tiles) to `level` or what the CPU has, whichever is lower;
// the level now in force.
int set_cpu_isa(int64_t level) {
  g_cpu_isa = std::max<int>(kIsaBase, std::min<int>(detected_cpu_isa(), static_cast<int>(level)));
  return g_cpu_isa;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CPU_ISA_DISPATCH(name) \
  (cpu_isa() >= kIsaAvx512 ? isa_v4::name : cpu_isa() == kIsaAvx2 ? isa_v3::name : isa_v1::name)
#else
#define CPU_ISA_DISPATCH(name) isa_v1::name
#endif
// Independent scalar chains left as scalars: GCC's straight-line vectorizer packs them into one vector filled lane
// by lane from strided loads, which costs more than the chains side by side.
#if defined(__GNUC__) && !defined(__clang__)
#define NO_SLP __attribute__((optimize("no-tree-slp-vectorize")))
#else
#define NO_SLP
#endif

// Each row of x (rows, cols) over its largest magnitude: y = x / scale, scale (rows, 1).

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace
