// The decoding runtime's step: every decoder layer, the output projection and the fast modes' rescoring of the
// best candidates, for one new position per row, in one call from Python. The arithmetic is model/transformer.py's
// DecoderLayer.step (the reference it is tested against), on ATen ops, so it runs on any device ATen does; only the
// int8 kernels (fbgemm's dynamic quantized linear) are CPU-only.
// ATen and the pybind11 casters for its types only: torch/extension.h pulls in the whole C++ frontend (torch::nn,
// optim, data), which nothing here uses and which cost a fresh machine half of the build's time.
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
enum Kernel : int64_t { kLinear = 0, kTransposed = 1, kInt8 = 2, kOneDnn = 3, kVnni = 4 };

// fbgemm's int8 kernel or the VNNI tiles: the two whose numbers are quantized.
bool quantized(int64_t kernel) { return kernel == kInt8 || kernel == kVnni; }

// oneDNN's fp32 linear on a weight it laid out once (its blocked format), through the dispatcher.
Tensor onednn_reorder(const Tensor& weight) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_reorder_linear_weight", "");
  std::vector<c10::IValue> stack{weight, c10::IValue()};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// oneDNN builds and keeps one primitive per input shape it meets (up to 1,024 of them, most of a replica's memory
// growth under mixed traffic: an encoder's row count is its batch's token count). Above 64 rows they are padded up
// to a multiple of 32, so that a service meets a few dozen row counts instead of hundreds; a decoding step's rows
// (at most 64 at 16 texts' beams) and a text alone's encoder are left as they are.
int64_t onednn_rows(int64_t rows) { return rows <= 64 ? rows : (rows + 31) / 32 * 32; }

Tensor onednn_linear(const Tensor& x, const Tensor& packed, const Tensor& bias) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  const int64_t rows = x.dim() == 2 ? x.size(0) : -1, bucket = rows < 0 ? rows : onednn_rows(rows);
  Tensor input = x;
  if (bucket != rows) {
    input = at::empty({bucket, x.size(1)}, x.options());
    input.narrow(0, 0, rows).copy_(x);
    input.narrow(0, rows, bucket - rows).zero_();
  }
  std::vector<c10::IValue> stack{input, packed, bias.defined() ? c10::IValue(bias) : c10::IValue(),
                                 std::string("none"), c10::List<std::optional<at::Scalar>>(),
                                 c10::IValue(std::string(""))};
  op.callBoxed(&stack);
  Tensor out = stack[0].toTensor();
  return bucket != rows ? out.narrow(0, 0, rows) : out;
}

const char* kernel_name(int64_t kernel) {
  switch (kernel) {
    case kLinear: return "linear";
    case kTransposed: return "transposed";
    case kInt8: return "int8";
    case kOneDnn: return "onednn";
    case kVnni: return "vnni";
  }
  return "?";
}

// ---- fp32 CPU loops for the small operations of a step ------------------------------------------------------
// At a few rows per step each of these is a few thousand multiply-adds, where an ATen call's dispatch and
// allocation would cost more than the arithmetic; elsewhere (another device or dtype) the ATen ops below run.
bool plain_cpu(const Tensor& t) { return t.is_cpu() && t.scalar_type() == at::kFloat; }

// The loops below are compiled three times, for AVX-512 (x86-64-v4), AVX2 with FMA (x86-64-v3) and plain x86-64,
// and the loader picks the one this CPU runs (GCC's target_clones): one build serves every machine it lands on.
// (Helpers are written out inside them: GCC does not inline another function into a target clone.) Their
// sums are `omp simd` reductions (built with -fopenmp-simd: vector lanes, no threads), so they may add in
// another order than a scalar loop: float32 rounding, as the matmul kernels already differ between CPUs.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_CLONES
#endif
// Independent scalar chains left as scalars: GCC's straight-line vectorizer packs them into one vector filled lane
// by lane from strided loads, which costs more than the chains side by side.
#if defined(__GNUC__) && !defined(__clang__)
#define NO_SLP __attribute__((optimize("no-tree-slp-vectorize")))
#else
#define NO_SLP
#endif

// Each row of x (rows, cols) over its largest magnitude: y = x / scale, scale (rows, 1).
CPU_CLONES void divide_rows_loop(const float* in, float* out, float* scales, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * cols;
    float top = 0.0f;
#pragma omp simd reduction(max : top)
    for (int64_t c = 0; c < cols; ++c) top = top > std::fabs(row[c]) ? top : std::fabs(row[c]);
    top = std::max(top, std::numeric_limits<float>::min());
    scales[r] = top;
    float* target = out + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) target[c] = row[c] / top;
  }
}

void divide_rows(const Tensor& x, Tensor& y, Tensor& scale) {
  divide_rows_loop(x.data_ptr<float>(), y.data_ptr<float>(), scale.data_ptr<float>(), x.size(0), x.size(1));
}

// y = y * scale[row] (+ bias): the per-row scale put back after the int8 matmul.
CPU_CLONES void scale_rows_loop(float* out, const float* scales, const float* b, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out + r * cols;
    const float s = scales[r];
    if (b) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) row[c] = b[c] + row[c] * s;
    } else {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) row[c] *= s;
    }
  }
}

void scale_rows(Tensor& y, const Tensor& scale, const Tensor& bias) {
  scale_rows_loop(y.data_ptr<float>(), scale.data_ptr<float>(), bias.defined() ? bias.data_ptr<float>() : nullptr,
                  y.size(0), y.size(1));
}

// Σ a[i]·b[i] in vector lanes.
CPU_CLONES float dot_loop(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

enum Activation : int64_t { kSilu = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3 };
// What a search keeps of the cross-attention per step: nothing, every layer's and head's (N, L, h, S), or one
// head's rows (N, S) (capture_head < 0: the layer's head average).
enum Capture : int64_t { kCaptureNothing = 0, kCaptureEveryHead = 1, kCaptureOneHead = 2 };

Tensor activate(const Tensor& x, int64_t activation) {
  switch (activation) {
    case kRelu: return at::relu(x);
    case kGelu: return at::gelu(x);
    case kGeluTanh: return at::gelu(x, "tanh");
  }
  return at::silu(x);
}

// out = e^y for y in [-87, 88], Cephes' expf in vector lanes: 2^n e^r with n = round(y / ln 2) (the 1.5·2^23
// rounding trick), |r| ≤ ln 2 / 2 and e^r a degree-7 polynomial, within 2 ulp. A macro: GCC does not inline a
// function into a target clone, and a call in an `omp simd` loop would keep it scalar. Its constants are shared
// with exp_lanes, the same polynomial in AVX-512 intrinsics.
constexpr float kLog2E = 1.44269504088896341f, kRound = 12582912.0f, kLn2High = 0.693359375f, kLn2Low = 2.12194440e-4f;
constexpr float kExp[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                           4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
#define EXP_IN_LANES(y, out)                                                              \
  do {                                                                                    \
    const float k_ = ((y) * kLog2E + kRound) - kRound;                                    \
    const float r_ = (y) - k_ * kLn2High + k_ * kLn2Low;                                  \
    float p_ = kExp[0];                                                                   \
    p_ = p_ * r_ + kExp[1];                                                               \
    p_ = p_ * r_ + kExp[2];                                                               \
    p_ = p_ * r_ + kExp[3];                                                               \
    p_ = p_ * r_ + kExp[4];                                                               \
    p_ = p_ * r_ + kExp[5];                                                               \
    p_ = p_ * r_ * r_ + r_ + 1.0f;                                                        \
    (out) = p_ * __builtin_bit_cast(float, (static_cast<int32_t>(k_) + 127) << 23);       \
  } while (0)

// y = silu(b + y · scale[row]): the int8 matmul's per-row scale, the bias and SiLU (x / (1 + e^-x)) in one pass
// over its output instead of three; e^-x by EXP_IN_LANES, its argument held to [-87, 88] where float's exponent
// ends. The int8 mode only (the fp32 kernels keep at::silu, exact).
CPU_CLONES void scale_rows_silu_loop(float* out, const float* scales, const float* b, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out + r * cols;
    const float s = scales[r];
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      const float x = b[c] + row[c] * s;
      float y = -x;
      y = y < -87.0f ? -87.0f : (y > 88.0f ? 88.0f : y);
      float e;
      EXP_IN_LANES(y, e);
      row[c] = x / (1.0f + e);
    }
  }
}

// ---- int8 matmul on AVX-512 VNNI --------------------------------------------------------------------------------
// x Wᵀ (· scales) + b with W per-channel int8 and x quantized per row to 8 bits, multiplied by vpdpbusd (u8·s8 pairs
// summed straight into int32) in tiles of up to 4 rows × 64 columns held in registers, and the scales, the bias and
// (for fc1) SiLU put on in those registers before anything is stored. Against fbgemm's dynamic linear, which reads
// the activations twice to find one range for the call, quantizes, packs them with row offsets and then rewrites its
// int32 output as floats that the per-row scale pass reads once more, it makes one pass over x and none over the
// output: at a text's four beam rows its fixed cost per call is what the matmul costs (perf: requantization alone
// was 6 % of a 16-text int8 decode). Built for CPUs with VNNI only and chosen where it times faster on the weights
// (Runtime::choose); elsewhere fbgemm's kernel stays.
#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_VNNI_KERNEL 1
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#else
#define HAVE_VNNI_KERNEL 0
#define VNNI_TARGET
#endif

bool cpu_has_vnni() {
#if HAVE_VNNI_KERNEL
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

// W (out, in) int8 laid out for the tiles: blocks of 16 output channels, each a run over the input in groups of 4
// ([block][in / 4][16 channels][4 inputs], zero-padded), so one 64-byte load feeds 16 channels' next four products.
// `sums[c]` = Σ_i W_q[c, i]: each row's zero point times it is what the row's u8 codes add over its real values.
struct VnniWeight {
  Tensor packed;  // int8 (blocks, groups, 16, 4)
  Tensor scales;  // float (blocks · 16): W[c] ≈ scales[c] · W_q[c], zero past `out`
  Tensor sums;    // int32 (blocks · 16)
  int64_t out = 0, in = 0, groups = 0, blocks = 0;
  explicit operator bool() const { return packed.defined(); }
};

VnniWeight vnni_weight(const Tensor& integers, const Tensor& scales) {
  VnniWeight w;
  const Tensor q = integers.contiguous();
  w.out = q.size(0);
  w.in = q.size(1);
  w.groups = (w.in + 3) / 4;
  w.blocks = (w.out + 15) / 16;
  w.packed = at::zeros({w.blocks, w.groups, 16, 4}, q.options().dtype(at::kChar));
  w.scales = at::zeros({w.blocks * 16}, q.options().dtype(at::kFloat));
  w.sums = at::zeros({w.blocks * 16}, q.options().dtype(at::kInt));
  w.scales.narrow(0, 0, w.out).copy_(scales);
  const int8_t* source = q.data_ptr<int8_t>();
  int8_t* target = w.packed.data_ptr<int8_t>();
  int32_t* sums = w.sums.data_ptr<int32_t>();
  for (int64_t c = 0; c < w.out; ++c) {
    int32_t sum = 0;
    for (int64_t i = 0; i < w.in; ++i) {
      const int8_t value = source[c * w.in + i];
      target[((c / 16) * w.groups + i / 4) * 64 + (c % 16) * 4 + i % 4] = value;
      sum += value;
    }
    sums[c] = sum;
  }
  return w;
}

#if HAVE_VNNI_KERNEL
// e^y in 16 lanes for y in [-87, 88]: EXP_IN_LANES' Cephes polynomial, written in intrinsics.
VNNI_TARGET inline __m512 exp_lanes(__m512 y) {
  const __m512 k = _mm512_sub_ps(_mm512_fmadd_ps(y, _mm512_set1_ps(kLog2E), _mm512_set1_ps(kRound)),
                                 _mm512_set1_ps(kRound));
  const __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(kLn2Low), _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2High), y));
  __m512 p = _mm512_set1_ps(kExp[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExp[i]));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i two_n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(two_n));
}

// Each row of x (rows, in) to u8 codes over its own range [lo, hi] (lo = min(x, 0), hi = max(x, 0)): step
// s = (hi - lo) / 255, zero point z = round(-lo / s), q = round(x / s) + z in [0, 255], so x ≈ s (q - z); `steps` and
// `zeros` get s and z per row (0 and 0 for a row of zeros); the padding to `groups` · 4 inputs is z (a zero). A
// row's own range rather than one for the call (fbgemm's) or a symmetric one: after SiLU a row is nearly all
// positive, and a symmetric grid spends half its codes on values it never has (bench.fast_modes: en-zh BLEU -0.53
// with the symmetric one against -0.04 with fbgemm's).
VNNI_TARGET void quantize_rows_vnni(const float* x, int64_t rows, int64_t in, int64_t groups, uint8_t* a,
                                    float* steps, int32_t* zeros) {
  const int64_t width = groups * 4;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * in;
    uint8_t* target = a + r * width;
    __m512 low = _mm512_setzero_ps(), high = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= in; i += 16) {
      const __m512 v = _mm512_loadu_ps(row + i);
      low = _mm512_min_ps(low, v);
      high = _mm512_max_ps(high, v);
    }
    float lo = _mm512_reduce_min_ps(low), hi = _mm512_reduce_max_ps(high);
    for (; i < in; ++i) {
      lo = std::min(lo, row[i]);
      hi = std::max(hi, row[i]);
    }
    const float range = hi - lo;
    const float inverse = range > 0.0f ? 255.0f / range : 0.0f;
    const int32_t zero = static_cast<int32_t>(std::nearbyint(-lo * inverse));
    steps[r] = range > 0.0f ? range / 255.0f : 0.0f;
    zeros[r] = zero;
    const __m512 times = _mm512_set1_ps(inverse);
    const __m512i shift = _mm512_set1_epi32(zero), floor = _mm512_setzero_si512();
    for (i = 0; i + 16 <= in; i += 16) {
      const __m512i q = _mm512_max_epi32(
          _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + i), times)), shift), floor);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(target + i), _mm512_cvtusepi32_epi8(q));
    }
    for (; i < in; ++i) {
      const int32_t q = static_cast<int32_t>(std::nearbyint(row[i] * inverse)) + zero;
      target[i] = static_cast<uint8_t>(std::min(255, std::max(0, q)));
    }
    for (; i < width; ++i) target[i] = static_cast<uint8_t>(zero);
  }
}

// What every tile of one vnni_matmul call reads and writes.
struct TileCall {
  const uint8_t* a;     // the quantized rows (rows, groups · 4)
  const float* steps;   // per row
  const int32_t* zeros;  // per row
  const int8_t* packed;  // VnniWeight::packed
  const float* scales;
  const int32_t* sums;
  const float* bias;  // or null
  bool silu;
  float* out;      // (rows, columns)
  float* maxes;    // (rows, panels) or null
  int64_t groups, columns, panels;
};

// R rows from `row` × NB blocks of 16 columns of panel `panel`: Σ over the input in registers, then scale, bias,
// SiLU and a masked store (and the row's largest value of the panel, where `maxes` is given).
template <int R, int NB>
VNNI_TARGET inline void vnni_tile(const TileCall& t, int64_t row, int64_t panel) {
  const int64_t groups = t.groups, a_stride = groups * 4, column = 64 * panel, columns = t.columns;
  const int64_t block_bytes = groups * 64;
  const uint8_t* a = t.a + row * a_stride;
  const int8_t* w = t.packed + 4 * panel * block_bytes;
  const float* steps = t.steps + row;
  const int32_t* zeros = t.zeros + row;
  float* out = t.out + row * columns;
  __m512i acc[R][NB];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_si512();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i weights[NB];
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) weights[b] = _mm512_loadu_si512(w + b * block_bytes + g * 64);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, a + r * a_stride + g * 4, 4);
      const __m512i x = _mm512_set1_epi32(four);
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], x, weights[b]);
    }
  }
  __m512 top[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) top[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    const int64_t c = column + 16 * b;
    const __mmask16 lanes = c + 16 <= columns ? static_cast<__mmask16>(0xFFFF)
                                              : static_cast<__mmask16>((1u << (columns - c)) - 1u);
    const __m512 scale = _mm512_loadu_ps(t.scales + c);
    const __m512i sum = _mm512_loadu_si512(t.sums + c);
    const __m512 add = t.bias ? _mm512_maskz_loadu_ps(lanes, t.bias + c) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512i real = _mm512_sub_epi32(acc[r][b], _mm512_mullo_epi32(sum, _mm512_set1_epi32(zeros[r])));
      const __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(real),
                                       _mm512_mul_ps(scale, _mm512_set1_ps(steps[r])), add);
      __m512 result = y;
      if (t.silu) {  // y / (1 + e^-y), e^-y's argument held to [-87, 88]
        const __m512 e = exp_lanes(_mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), y),
                                                               _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f)));
        result = _mm512_div_ps(y, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
      }
      _mm512_mask_storeu_ps(out + r * columns + c, lanes, result);
      top[r] = _mm512_mask_max_ps(top[r], lanes, top[r], result);
    }
  }
  if (t.maxes) {  // each row's largest value of these 64 columns: the block maxima the candidates start from
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) t.maxes[(row + r) * t.panels + panel] = _mm512_reduce_max_ps(top[r]);
  }
}

template <int R>
VNNI_TARGET void vnni_rows(const TileCall& t, int64_t row, int64_t panel, int64_t blocks) {
  switch (blocks) {
    case 4: return vnni_tile<R, 4>(t, row, panel);
    case 3: return vnni_tile<R, 3>(t, row, panel);
    case 2: return vnni_tile<R, 2>(t, row, panel);
    default: return vnni_tile<R, 1>(t, row, panel);
  }
}

// out (rows, W.out) = the quantized rows `a` times W: panels of 64 columns, each panel's weights (16 KB at 256
// inputs) kept in L1 while every 4-row tile passes over them.
VNNI_TARGET void vnni_matmul(const uint8_t* a, const float* steps, const int32_t* zeros, int64_t rows,
                             const VnniWeight& w, const float* bias, bool silu, float* out, float* maxes) {
  const TileCall t{a, steps, zeros, w.packed.data_ptr<int8_t>(), w.scales.data_ptr<float>(), w.sums.data_ptr<int32_t>(),
                   bias, silu, out, maxes, w.groups, w.out, (w.blocks + 3) / 4};
  at::parallel_for(0, t.panels, 8, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t blocks = std::min<int64_t>(4, w.blocks - 4 * p);
      int64_t r = 0;
      for (; r + 4 <= rows; r += 4) vnni_rows<4>(t, r, p, blocks);
      switch (rows - r) {
        case 3: vnni_rows<3>(t, r, p, blocks); break;
        case 2: vnni_rows<2>(t, r, p, blocks); break;
        case 1: vnni_rows<1>(t, r, p, blocks); break;
        default: break;
      }
    }
  });
}
#endif

// x (rows, in) contiguous fp32 → x Wᵀ + b (then SiLU if `silu`) through the VNNI tiles; `maxes` (when given, rows ×
// ⌈out / 64⌉ floats): each row's largest output of every 64 columns, taken in the tiles' registers.
Tensor vnni_linear(const Tensor& x, const VnniWeight& w, const Tensor& bias, bool silu, float* maxes = nullptr) {
  const int64_t rows = x.size(0);
  Tensor out = at::empty({rows, w.out}, x.options());
#if HAVE_VNNI_KERNEL
  Tensor a = at::empty({rows, w.groups * 4}, x.options().dtype(at::kByte));
  Tensor steps = at::empty({rows}, x.options());
  Tensor zeros = at::empty({rows}, x.options().dtype(at::kInt));
  quantize_rows_vnni(x.data_ptr<float>(), rows, w.in, w.groups, a.data_ptr<uint8_t>(), steps.data_ptr<float>(),
                     zeros.data_ptr<int32_t>());
  vnni_matmul(a.data_ptr<uint8_t>(), steps.data_ptr<float>(), zeros.data_ptr<int32_t>(), rows, w,
              bias.defined() ? bias.data_ptr<float>() : nullptr, silu, out.data_ptr<float>(), maxes);
#endif
  return out;
}

struct Linear {
  Tensor weight;      // (out, in): at::linear
  Tensor transposed;  // (in, out) contiguous: at::addmm, made when a kernel needs it
  Tensor onednn;      // oneDNN's blocked copy, made when a kernel needs it
  Tensor bias;        // (out,) or undefined
  Packed int8;        // per-channel int8 weight prepacked by fbgemm (no bias: added after the per-row scale)
  VnniWeight vnni;    // the same int8 weight laid out for the VNNI tiles, on CPUs that have them
  bool reduce_range = false;
  int64_t small = kLinear;  // the kernel for a step of at most `rows_cut` rows
  int64_t large = kLinear;  // and above it
  int64_t rows_cut = 8;

  // The int8 copy fbgemm multiplies by, and on a CPU with VNNI the same integers laid out for the VNNI tiles.
  void attach_int8(const Packed& packed) {
    int8 = packed;
    if (cpu_has_vnni()) {
      const Tensor q = std::get<0>(packed->unpack());
      vnni = vnni_weight(q.int_repr(), q.q_per_channel_scales().to(at::kFloat));
    }
  }

  // x (N, in) → (N, out), then `activation` (an Activation; -1: none). SiLU after the int8 kernel on the CPU is
  // applied in its per-row scale pass (scale_rows_silu_loop).
  Tensor run(const Tensor& x, int64_t kernel, int64_t activation = -1) const {
    const bool fused =
        activation == kSilu && quantized(kernel) && bias.defined() && plain_cpu(x) && x.is_contiguous();
    Tensor out = multiply(x, kernel, fused);
    return activation < 0 || fused ? out : activate(out, activation);
  }

  // x Wᵀ + b on `kernel`; `silu`: SiLU too, in the int8 kernel's scale pass (only where `run` fuses it).
  Tensor multiply(const Tensor& x, int64_t kernel, bool silu) const {
    switch (kernel) {
      case kTransposed:
        return bias.defined() ? at::addmm(bias, x, transposed) : at::mm(x, transposed);
      case kOneDnn:
        return onednn_linear(x, onednn, bias);
      case kVnni:
        if (vnni && plain_cpu(x) && x.is_contiguous()) return vnni_linear(x, vnni, bias, silu);
        [[fallthrough]];
      case kInt8: {
        // Each row divided by its largest magnitude before fbgemm quantizes the call's activations to 8 bits,
        // with one more row [1, -1, 0, …] below them: the call's range is then always exactly [-1, 1], so a
        // row's 8 bits are the same whatever else shares the batch (batch-invariant), a fraction of its own range.
        if (plain_cpu(x) && x.is_contiguous()) {
          const int64_t rows = x.size(0);
          Tensor padded = at::empty({rows + 1, x.size(1)}, x.options()), scale = at::empty({rows, 1}, x.options());
          Tensor scaled = padded.narrow(0, 0, rows);
          divide_rows(x, scaled, scale);
          Tensor sentinel = padded.select(0, rows);
          sentinel.zero_();
          sentinel.data_ptr<float>()[0] = 1.0f;
          if (x.size(1) > 1) sentinel.data_ptr<float>()[1] = -1.0f;
          Tensor out = int8->apply_dynamic(padded, reduce_range).narrow(0, 0, rows);
          if (silu) {
            scale_rows_silu_loop(out.data_ptr<float>(), scale.data_ptr<float>(), bias.data_ptr<float>(),
                                 out.size(0), out.size(1));
          } else {
            scale_rows(out, scale, bias);
          }
          return out;
        }
        Tensor scale = x.abs().amax({-1}, true).clamp_min_(std::numeric_limits<float>::min());
        Tensor out = int8->apply_dynamic(x / scale, reduce_range);
        return bias.defined() ? at::addcmul(bias, out, scale) : out.mul_(scale);
      }
      default:
        return at::linear(x, weight, bias.defined() ? c10::optional<Tensor>(bias) : c10::nullopt);
    }
  }
  Tensor operator()(const Tensor& x, int64_t activation = -1) const {
    return run(x, x.size(0) <= rows_cut ? small : large, activation);
  }
};

struct Layer {
  Linear qkv, self_out, cross_q, cross_out, fc1, fc2, cross_kv;  // cross_kv: [W_k; W_v] of cross-attention
  Tensor norm1_w, norm1_b, norm2_w, norm2_b, norm3_w, norm3_b;
};

struct EncoderLayer {
  Linear qkv, out, fc1, fc2;
  Tensor norm1_w, norm1_b, norm2_w, norm2_b;
};

// Σ e^(x[i] - shift) over a row whose largest value is `shift`: a log-softmax's denominator, in one read (e^y by
// EXP_IN_LANES; below e^-87, 1.6e-38, it counts as that, which a sum with e^0 in it cannot see).
CPU_CLONES float sum_exp_loop(const float* x, int64_t n, float shift) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    float y = x[i] - shift;
    y = y < -87.0f ? -87.0f : y;
    float e;
    EXP_IN_LANES(y, e);
    sum += e;
  }
  return sum;
}

// Each block's largest value: maxes[b] = max(x[b·block … b·block + block - 1]), the last block possibly shorter.
CPU_CLONES void block_max_loop(const float* x, int64_t n, int64_t block, float* maxes) {
  for (int64_t start = 0, b = 0; start < n; start += block, ++b) {
    const int64_t end = n < start + block ? n : start + block;
    float top = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : top)
    for (int64_t i = start; i < end; ++i) top = top > x[i] ? top : x[i];
    maxes[b] = top;
  }
}

// The m largest values of a row and their columns, largest first and of equal values the lower column first (as
// at::topk orders them). One vectorised pass takes each block of 64's largest value; the m-th largest of those is
// a floor for the row's m-th largest value (m blocks reach it), so only the values at or above it, in the blocks
// that reach it, are gathered and sorted. (Inserting as a pass meets them, in columns ordered by frequency where
// the likeliest tokens come first, shifted a sorted list for most values: 6 % of a 16-text int8 decode.)
constexpr int64_t kBlock = 64;  // top_of_row's blocks (the VNNI tiles' panels are the same 64 columns)

void top_of_row(const float* row, int64_t width, int64_t m, float* v, int64_t* at_column,
                const float* block_maxes = nullptr) {
  constexpr int64_t block = kBlock;
  const int64_t blocks = (width + block - 1) / block;
  thread_local std::vector<float> own_maxes, floor_of;
  thread_local std::vector<std::pair<float, int64_t>> found;
  if (!block_maxes) {
    own_maxes.resize(blocks);
    block_max_loop(row, width, block, own_maxes.data());
    block_maxes = own_maxes.data();
  }
  const float* maxes = block_maxes;
  float floor = -std::numeric_limits<float>::infinity();
  if (blocks > m) {
    floor_of.assign(maxes, maxes + blocks);
    std::nth_element(floor_of.begin(), floor_of.begin() + (m - 1), floor_of.end(), std::greater<float>());
    floor = floor_of[m - 1];
  }
  found.clear();
  for (int64_t b = 0; b < blocks; ++b) {
    if (!(maxes[b] >= floor)) continue;
    const int64_t end = std::min(width, (b + 1) * block);
    for (int64_t c = b * block; c < end; ++c)
      if (row[c] >= floor) found.emplace_back(row[c], c);
  }
  const auto first = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (static_cast<int64_t>(found.size()) < m) {  // NaNs: fewer than m comparable values; keep those, then NaN
    std::sort(found.begin(), found.end(), first);
    for (int64_t c = 0; c < width && static_cast<int64_t>(found.size()) < m; ++c)
      if (std::isnan(row[c])) found.emplace_back(row[c], c);
  } else {
    std::partial_sort(found.begin(), found.begin() + m, found.end(), first);
  }
  for (int64_t j = 0; j < m; ++j) {
    v[j] = found[j].first;
    at_column[j] = found[j].second;
  }
}

// One query's attention over `length` positions: w = softmax(q·k_j · scale + mask_j), out = Σ_j w_j v_j. Each q·k
// sum and each Σ_j stays one chain of multiply-adds in index order: summed in vector lanes they moved a random
// checkpoint's log-probabilities by 2.4e-5, past the 1e-5 the runtime keeps to the reference
// (tests/model/test_runtime.py). Several chains run side by side instead, which leaves each result the same to
// the bit: eight keys' q·k as scalars (a key at a time, each multiply-add waited for the last: 70 % of this
// function), and 64 output columns of Σ_j w_j v_j in four vectors. `lanes` (the int8 mode, which keeps no bit
// to the reference): each q·k summed in vector lanes instead, four keys at a time (attend_one was 13 % of a 16-text
// int8 decode with the chains).
constexpr int64_t kKeys = 8;

CPU_CLONES NO_SLP void attend_one(const float* query, const float* k, int64_t k_pos, const float* v, int64_t v_pos,
                           const float* mask, int64_t m_pos, int64_t length, int64_t d_k, float scale,
                           float* w, float* out, bool lanes) {
  float top = -std::numeric_limits<float>::infinity();
  int64_t first_chained = 0;
  if (lanes) {
    int64_t j = 0;
    for (; j + 4 <= length; j += 4) {
      const float *k0 = k + j * k_pos, *k1 = k0 + k_pos, *k2 = k1 + k_pos, *k3 = k2 + k_pos;
      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t c = 0; c < d_k; ++c) {
        s0 += query[c] * k0[c];
        s1 += query[c] * k1[c];
        s2 += query[c] * k2[c];
        s3 += query[c] * k3[c];
      }
      w[j] = s0;
      w[j + 1] = s1;
      w[j + 2] = s2;
      w[j + 3] = s3;
    }
    for (; j < length; ++j) {
      const float* key = k + j * k_pos;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < d_k; ++c) sum += query[c] * key[c];
      w[j] = sum;
    }
    first_chained = length;
  }
  for (int64_t j0 = first_chained; j0 < length; j0 += kKeys) {
    // kKeys keys' chains in flight, each in index order; a last block of fewer keys repeats its last key
    const int64_t n = length - j0 < kKeys ? length - j0 : kKeys;
    const float* key[kKeys];
    for (int64_t l = 0; l < kKeys; ++l) key[l] = k + (j0 + (l < n ? l : n - 1)) * k_pos;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f, s7 = 0.0f;
    for (int64_t c = 0; c < d_k; ++c) {
      const float q = query[c];
      s0 += q * key[0][c];
      s1 += q * key[1][c];
      s2 += q * key[2][c];
      s3 += q * key[3][c];
      s4 += q * key[4][c];
      s5 += q * key[5][c];
      s6 += q * key[6][c];
      s7 += q * key[7][c];
    }
    const float sums[kKeys] = {s0, s1, s2, s3, s4, s5, s6, s7};
    for (int64_t l = 0; l < n; ++l) w[j0 + l] = sums[l];
  }
  for (int64_t j = 0; j < length; ++j) {
    float dot = w[j] * scale;
    if (mask) dot += mask[j * m_pos];
    w[j] = dot;
    top = dot > top ? dot : top;
  }
  float total = 0.0f;
  for (int64_t j = 0; j < length; ++j) {
    w[j] = std::exp(w[j] - top);
    total += w[j];
  }
  const float inverse = 1.0f / total;
  for (int64_t j = 0; j < length; ++j) w[j] *= inverse;
  int64_t c0 = 0;
  for (; c0 + 64 <= d_k; c0 += 64) {  // four vectors' chains in flight
    float s0[16] = {}, s1[16] = {}, s2[16] = {}, s3[16] = {};
    for (int64_t j = 0; j < length; ++j) {
      const float weight = w[j];
      const float* value = v + j * v_pos + c0;
#pragma omp simd
      for (int64_t l = 0; l < 16; ++l) {
        s0[l] += weight * value[l];
        s1[l] += weight * value[16 + l];
        s2[l] += weight * value[32 + l];
        s3[l] += weight * value[48 + l];
      }
    }
    for (int64_t l = 0; l < 16; ++l) {
      out[c0 + l] = s0[l];
      out[c0 + 16 + l] = s1[l];
      out[c0 + 32 + l] = s2[l];
      out[c0 + 48 + l] = s3[l];
    }
  }
  for (; c0 + 16 <= d_k; c0 += 16) {
    float sums[16] = {};
    for (int64_t j = 0; j < length; ++j) {
      const float weight = w[j];
      const float* value = v + j * v_pos + c0;
#pragma omp simd
      for (int64_t l = 0; l < 16; ++l) sums[l] += weight * value[l];
    }
    for (int64_t l = 0; l < 16; ++l) out[c0 + l] = sums[l];
  }
  for (int64_t c = c0; c < d_k; ++c) {
    float sum = 0.0f;
    for (int64_t j = 0; j < length; ++j) sum += w[j] * v[j * v_pos + c];
    out[c] = sum;
  }
}

// softmax(q Kᵀ/√d_k + mask) V for one query per row: q (N, h·d_k); key/value (N, h, t, d_k) whose first two
// dimensions merge (a slice of a cache); mask additive (N, 1, 1, t) or undefined; `kv_rows` (N,) long, when defined,
// the row of key, value and mask each query reads (a search's rows of a source that others left). Returns the
// heads' contexts side by side (N, h·d_k) and the weights (N·h, 1, t). `lanes`: attend_one's.
std::pair<Tensor, Tensor> attend_cpu(const Tensor& q, const Tensor& key, const Tensor& value, const Tensor& mask,
                                     int64_t heads, const Tensor& kv_rows, bool lanes) {
  const int64_t rows = q.size(0), length = key.size(2), d_k = key.size(3);
  const Tensor at_rows = kv_rows.defined() ? kv_rows.contiguous() : Tensor();
  const int64_t* row_of = at_rows.defined() ? at_rows.data_ptr<int64_t>() : nullptr;
  Tensor context = at::empty({rows, heads * d_k}, q.options());
  Tensor weights = at::empty({rows * heads, 1, length}, q.options());
  const float* qs = q.data_ptr<float>();
  const float* ks = key.data_ptr<float>();
  const float* vs = value.data_ptr<float>();
  const float* ms = mask.defined() ? mask.data_ptr<float>() : nullptr;
  float* cs = context.data_ptr<float>();
  float* ws = weights.data_ptr<float>();
  const int64_t k_row = key.stride(0), k_head = key.stride(1), k_pos = key.stride(2);
  const int64_t v_row = value.stride(0), v_head = value.stride(1), v_pos = value.stride(2);
  const int64_t m_row = mask.defined() ? mask.stride(0) : 0, m_pos = mask.defined() ? mask.stride(3) : 0;
  const int64_t q_row = q.stride(0);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_k)));
  at::parallel_for(0, rows * heads, 16, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t r = index / heads, h = index % heads, kv = row_of ? row_of[r] : r;
      attend_one(qs + r * q_row + h * d_k, ks + kv * k_row + h * k_head, k_pos, vs + kv * v_row + h * v_head, v_pos,
                 ms ? ms + kv * m_row : nullptr, m_pos, length, d_k, scale, ws + index * length,
                 cs + r * heads * d_k + h * d_k, lanes);
    }
  });
  return {context, weights};
}

std::pair<Tensor, Tensor> attend(const Tensor& q, const Tensor& key, const Tensor& value, const Tensor& mask,
                                 int64_t heads, const Tensor& kv_rows = Tensor(), bool lanes = false) {
  const int64_t head_width = key.size(3);
  const bool heads_side_by_side = q.stride(-1) == 1 && (q.dim() == 2 || q.stride(1) == head_width);
  if (plain_cpu(q) && plain_cpu(key) && plain_cpu(value) && key.stride(3) == 1 && value.stride(3) == 1 &&
      heads_side_by_side && (!mask.defined() || plain_cpu(mask)) && (!kv_rows.defined() || kv_rows.is_cpu())) {
    return attend_cpu(q, key, value, mask, heads, kv_rows, lanes);
  }
  if (kv_rows.defined()) {
    return attend(q, key.index_select(0, kv_rows), value.index_select(0, kv_rows),
                  mask.defined() ? mask.index_select(0, kv_rows) : mask, heads);
  }
  const int64_t rows = key.size(0), length = key.size(2), d_k = key.size(3);
  Tensor scores = at::bmm(q.reshape({rows * heads, 1, d_k}), key.view({rows * heads, length, d_k}).transpose(1, 2));
  scores.mul_(1.0 / std::sqrt(static_cast<double>(d_k)));
  if (mask.defined()) scores.view({rows, heads, 1, length}).add_(mask);
  Tensor weights = scores.softmax(-1);
  Tensor context = at::bmm(weights, value.view({rows * heads, length, d_k}));
  return {context.view({rows, heads * d_k}), weights};
}

CPU_CLONES void add_norm_loop(const float* xs, const float* ys, const float* ws, const float* bs, float* os,
                              int64_t rows, int64_t d, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* o = os + r * d;
    const float *x = xs + r * d, *y = ys + r * d;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < d; ++c) {
      o[c] = x[c] + y[c];
      sum += o[c];
    }
    const double mean = sum / d;
    double squares = 0.0;
#pragma omp simd reduction(+ : squares)
    for (int64_t c = 0; c < d; ++c) squares += (o[c] - mean) * (o[c] - mean);
    const float inverse = static_cast<float>(1.0 / std::sqrt(squares / d + eps));
    const float m = static_cast<float>(mean);
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) o[c] = (o[c] - m) * inverse * ws[c] + bs[c];
  }
}

// layer_norm(x + y) over the last dimension, x and y (rows, d); on the CPU in one pass per row.
Tensor add_norm(const Tensor& x, const Tensor& y, const Tensor& w, const Tensor& b, double eps) {
  if (!(plain_cpu(x) && plain_cpu(y) && x.is_contiguous() && y.is_contiguous() && plain_cpu(w))) {
    return at::layer_norm(x + y, {x.size(-1)}, w, b, eps);
  }
  Tensor out = at::empty_like(x);
  add_norm_loop(x.data_ptr<float>(), y.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                out.data_ptr<float>(), x.size(0), x.size(1), eps);
  return out;
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Memory the search caches reuse from one decode to the next. Their self-attention buffers (a 16-text beam: about
// 30 MB) were allocated and freed per decode, and the allocator handed them back to the system and took them again:
// page faults, 3-5 % of a 16-text int8 decode (perf). A decode takes the smallest kept block that fits (or a new
// one) and gives it back when its cache goes; at most kKept blocks of at most kMaxFloats are kept. Decodes may run
// at once (the GIL is released), so the list is locked.
class Workspace {
 public:
  static constexpr size_t kKept = 2;
  static constexpr int64_t kMaxFloats = int64_t{64} << 20;  // 256 MB

  // A block of at least `floats` floats, returned to the workspace when the last holder lets go.
  std::shared_ptr<Tensor> take(int64_t floats, const at::TensorOptions& options) {
    Tensor block;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto best = blocks_.end();
      for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
        if (it->numel() >= floats && (best == blocks_.end() || it->numel() < best->numel())) best = it;
      if (best != blocks_.end()) {
        block = *best;
        blocks_.erase(best);
      }
    }
    if (!block.defined()) block = at::empty({floats}, options);
    return std::shared_ptr<Tensor>(new Tensor(block), [this](Tensor* held) {
      give_back(*held);
      delete held;
    });
  }

 private:
  void give_back(const Tensor& block) {
    if (block.numel() > kMaxFloats) return;
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.push_back(block);
    if (blocks_.size() > kKept) {  // keep the largest
      auto smallest = std::min_element(blocks_.begin(), blocks_.end(),
                                       [](const Tensor& a, const Tensor& b) { return a.numel() < b.numel(); });
      blocks_.erase(smallest);
    }
  }

  std::mutex mutex_;
  std::vector<Tensor> blocks_;
};

class Runtime {
 public:
  Runtime(Tensor embed, Tensor positions, double embed_scale, int64_t heads, int64_t activation, double eps)
      : embed_(std::move(embed)), positions_(std::move(positions)), embed_scale_(embed_scale), heads_(heads),
        activation_(activation), eps_(eps) {}

  // One decoder layer's weights as transformers names them: the seven matmuls (qkv, self out, cross q, cross
  // out, fc1, fc2, cross kv), the three norms' weights and biases; `int8` their prepacked int8 copies or empty.
  void add_layer(std::vector<Tensor> weights, std::vector<Tensor> biases, std::vector<Tensor> norms,
                 std::vector<std::optional<Packed>> int8, bool reduce_range) {
    Layer layer;
    fill({&layer.qkv, &layer.self_out, &layer.cross_q, &layer.cross_out, &layer.fc1, &layer.fc2, &layer.cross_kv},
         weights, biases, int8, reduce_range);
    fill_norms({&layer.norm1_w, &layer.norm1_b, &layer.norm2_w, &layer.norm2_b, &layer.norm3_w, &layer.norm3_b}, norms);
    layers_.push_back(std::move(layer));
  }

  // One encoder layer: [qkv, out, fc1, fc2] and the two norms' weights and biases.
  void add_encoder_layer(std::vector<Tensor> weights, std::vector<Tensor> biases, std::vector<Tensor> norms,
                         std::vector<std::optional<Packed>> int8, bool reduce_range) {
    EncoderLayer layer;
    fill({&layer.qkv, &layer.out, &layer.fc1, &layer.fc2}, weights, biases, int8, reduce_range);
    fill_norms({&layer.norm1_w, &layer.norm1_b, &layer.norm2_w, &layer.norm2_b}, norms);
    encoder_.push_back(std::move(layer));
  }

  static void fill(std::initializer_list<Linear*> parts, const std::vector<Tensor>& weights,
                   const std::vector<Tensor>& biases, const std::vector<std::optional<Packed>>& int8,
                   bool reduce_range) {
    size_t i = 0;
    for (Linear* part : parts) {
      part->weight = weights[i];
      part->bias = biases[i];
      part->reduce_range = reduce_range;
      if (i < int8.size() && int8[i].has_value()) part->attach_int8(*int8[i]);
      ++i;
    }
  }

  static void fill_norms(std::initializer_list<Tensor*> parts, const std::vector<Tensor>& norms) {
    size_t i = 0;
    for (Tensor* part : parts) *part = norms[i++];
  }

  void set_encoder_embedding(Tensor embed) { encoder_embed_ = std::move(embed); }

  // The encoder (model.transformer.Transformer.encode) over right-padded ids (B, S) and their mask (B, S), True at
  // real tokens: hidden states (B, S, d_model).
  Tensor encode(const Tensor& ids, const Tensor& mask) {
    at::InferenceMode guard;
    const int64_t batch = ids.size(0), length = ids.size(1), d = encoder_embed_.size(1), d_k = d / heads_;
    Tensor additive = at::zeros({batch, 1, 1, length}, encoder_embed_.options())
                          .masked_fill_(mask.logical_not().view({batch, 1, 1, length}),
                                        std::numeric_limits<float>::lowest());
    // On the CPU only the real tokens' rows are computed (a batch of sixteen dev sentences is 40 % padding), and
    // every query attends through attend_cpu (the decoder's loops) over its text's keys and values, which each
    // layer writes into a padded (B·S, 2d) block whose padding stays zero (the mask gives it weight 0). Padding
    // positions' hidden states come back as zeros: nothing reads them (cross-attention masks them too). Elsewhere
    // ATen's matmuls and softmax over the padded batch.
    const bool cpu = plain_cpu(encoder_embed_);
    const Tensor flat = mask.reshape({-1});
    const bool padded = cpu && flat.sum().item<int64_t>() < batch * length;
    const Tensor real = padded ? flat.nonzero().squeeze(1) : Tensor();  // (N,) positions in B·S order
    Tensor x, text_of;
    if (padded) {
      x = at::embedding(encoder_embed_, ids.reshape({-1}).index_select(0, real)).mul_(embed_scale_);
      x.add_(positions_.index_select(0, real.remainder(length)));
      text_of = real.div(length, "floor");
    } else {
      x = at::embedding(encoder_embed_, ids.reshape({-1})).mul_(embed_scale_).view({batch, length, d});
      x = (x + positions_.narrow(0, 0, length)).view({batch * length, d});
      if (cpu) text_of = at::arange(batch, ids.options().dtype(at::kLong)).repeat_interleave(length);
    }
    Tensor key_values = padded ? at::zeros({batch * length, 2 * d}, x.options()) : Tensor();
    for (const EncoderLayer& layer : encoder_) {
      Tensor qkv = layer.qkv(x);  // (N, 3d)
      Tensor context;
      if (cpu) {
        Tensor parts = padded ? key_values.index_copy_(0, real, qkv.narrow(1, d, 2 * d)).view({batch, length, 2, heads_, d_k})
                              : qkv.view({batch, length, 3, heads_, d_k}).narrow(2, 1, 2);
        context = attend(qkv.narrow(1, 0, d), parts.select(2, 0).permute({0, 2, 1, 3}),
                         parts.select(2, 1).permute({0, 2, 1, 3}), additive, heads_, text_of, lanes_).first;
      } else {
        Tensor heads = qkv.view({batch, length, 3, heads_, d_k}).permute({2, 0, 3, 1, 4});  // 3, B, h, S, d_k
        Tensor scores = at::matmul(heads[0], heads[1].transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(d_k)));
        context = at::matmul(scores.add_(additive).softmax(-1), heads[2]);  // (B, h, S, d_k)
        context = context.transpose(1, 2).reshape({batch * length, d});
      }
      x = add_norm(x, layer.out(context), layer.norm1_w, layer.norm1_b, eps_);
      x = add_norm(x, layer.fc2(layer.fc1(x, activation_)), layer.norm2_w, layer.norm2_b, eps_);
    }
    if (!padded) return x.view({batch, length, d});
    return at::zeros({batch * length, d}, x.options()).index_copy_(0, real, x).view({batch, length, d});
  }

  // Every decoder layer's cross-attention K and V of `hidden` (B, S, d_model), each (B·beams, h, S, d_k)
  // contiguous, source b's on its beams[b] rows (model.transformer.Transformer.cross_key_values).
  std::pair<std::vector<Tensor>, std::vector<Tensor>> cross_key_values(const Tensor& hidden, const Tensor& beams) {
    at::InferenceMode guard;
    const int64_t batch = hidden.size(0), length = hidden.size(1), d = hidden.size(2), d_k = d / heads_;
    Tensor rows = hidden.reshape({batch * length, d});
    std::vector<Tensor> keys, values;
    for (const Layer& layer : layers_) {
      Tensor kv = layer.cross_kv(rows).view({batch, length, 2, heads_, d_k}).permute({2, 0, 3, 1, 4});
      keys.push_back(kv[0].repeat_interleave(beams, 0).contiguous());
      values.push_back(kv[1].repeat_interleave(beams, 0).contiguous());
    }
    return {keys, values};
  }

  // The output projection (V, d) with final_logits_bias; `int8` (optional) its prepacked copy, whose logits are
  // then corrected: each row's `rescore` best candidates recomputed from the fp32 weight.
  void set_output(Tensor weight, Tensor bias, std::vector<Packed> int8, bool reduce_range, int64_t rescore) {
    output_.weight = weight;
    output_.bias = bias;
    output_.reduce_range = reduce_range;
    if (!int8.empty()) output_.attach_int8(int8[0]);
    lanes_ = !int8.empty();  // the int8 mode: attention's sums in vector lanes as well
    rescore_ = rescore;
  }

  std::vector<Linear*> matmuls() {  // the encoder's, the decoder's, then the output projection
    std::vector<Linear*> all;
    for (auto& l : encoder_) {
      for (Linear* p : {&l.qkv, &l.out, &l.fc1, &l.fc2}) all.push_back(p);
    }
    for (auto& l : layers_) {
      for (Linear* p : {&l.qkv, &l.self_out, &l.cross_q, &l.cross_out, &l.fc1, &l.fc2, &l.cross_kv}) all.push_back(p);
    }
    all.push_back(&output_);
    return all;
  }

  // Whether `kernel` gives each row of a call the same bits as the row alone or among fewer rows (at 1, 2, 3 and
  // `rows` - 1 rows against `rows`): oneDNN's and the VNNI tiles' do; BLAS's small-matrix paths may not.
  static bool row_invariant(const Linear& p, int64_t kernel, int64_t rows) {
    Tensor x = at::randn({rows, p.weight.size(1)}, p.weight.options());
    const Tensor all = p.run(x, kernel);
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, rows - 1}) {
      if (n < 1 || n >= rows) continue;
      if (!at::equal(p.run(x.narrow(0, 0, n).contiguous(), kernel), all.narrow(0, 0, n))) return false;
    }
    return true;
  }

  // Time every allowed row-invariant kernel of every matmul at `small_rows` and `large_rows` rows on the real
  // weights (the fastest of `repeats` interleaved runs each) and keep, per matmul, the one of least relative cost
  // over both (one kernel for every row count). Returns, per matmul, [small kernel, large kernel] (the same) and
  // the microseconds of every candidate.
  std::vector<std::vector<double>> choose(std::vector<int64_t> allowed, int64_t small_rows, int64_t large_rows,
                                          int64_t repeats) {
    std::vector<std::vector<double>> report;
    at::NoGradGuard no_grad;
    // Matmuls of one shape (the same layer's in every encoder or decoder layer) run the same kernels at the same
    // cost: each shape is timed once and its choice applied to the others.
    std::map<std::tuple<int64_t, int64_t, bool>, std::pair<Linear*, size_t>> timed;
    for (Linear* p : matmuls()) {
      const auto shape = std::make_tuple(p->weight.size(0), p->weight.size(1), static_cast<bool>(p->int8));
      if (auto found = timed.find(shape); found != timed.end()) {
        const Linear* same = found->second.first;
        p->small = same->small;
        p->large = same->large;
        p->rows_cut = same->rows_cut;
        prepare(*p);
        report.push_back(report[found->second.second]);
        continue;
      }
      timed[shape] = {p, report.size()};
      std::vector<int64_t> candidates;
      for (int64_t kernel : allowed) {
        if (quantized(kernel) && !p->int8) continue;
        if (kernel == kVnni && !p->vnni) continue;
        if (kernel == kTransposed && !p->transposed.defined()) p->transposed = p->weight.t().contiguous();
        if (kernel == kOneDnn) {
          if (!at::hasMKLDNN() || !p->weight.is_cpu()) continue;
          if (!p->onednn.defined()) p->onednn = onednn_reorder(p->weight);
        }
        candidates.push_back(kernel);
      }
      // Batch invariance: a row's numbers may not depend on the rows beside it, so only kernels whose rows come
      // out bit for bit the same alone and among others (checked here, on this CPU: BLAS's few-row paths are
      // not) are candidates, and one kernel serves every row count (a text alone and in a batch of sixteen run
      // the same arithmetic).
      std::vector<int64_t> invariant;
      for (int64_t kernel : candidates)
        if (row_invariant(*p, kernel, large_rows)) invariant.push_back(kernel);
      if (!invariant.empty()) candidates = invariant;
      std::vector<double> row{0, 0};
      int64_t rows_list[2] = {small_rows, large_rows};
      std::vector<double> cost(candidates.size(), 0.0);
      std::vector<std::vector<double>> best_of(2);
      for (int which = 0; which < 2; ++which) {
        Tensor x = at::randn({rows_list[which], p->weight.size(1)}, p->weight.options());
        std::vector<double> best(candidates.size(), 1e9);
        for (int64_t r = 0; r < repeats; ++r) {
          for (size_t c = 0; c < candidates.size(); ++c) {
            double start = seconds_now();
            Tensor out = p->run(x, candidates[c]);
            (void)out.data_ptr();
            best[c] = std::min(best[c], seconds_now() - start);
          }
        }
        // each kernel's cost: its time over the fastest's, at few rows plus at many
        const double fastest = *std::min_element(best.begin(), best.end());
        for (size_t c = 0; c < candidates.size(); ++c) cost[c] += best[c] / fastest;
        best_of[which] = best;
      }
      size_t pick = std::min_element(cost.begin(), cost.end()) - cost.begin();
      // int8 only where it pays: a margin of 10 % over the fastest fp32 kernel, so that timing noise on a
      // matmul where both cost the same does not decide whether its numbers are quantized
      if (quantized(candidates[pick])) {
        size_t exact = pick;
        for (size_t c = 0; c < candidates.size(); ++c)
          if (!quantized(candidates[c]) && (exact == pick || cost[c] < cost[exact])) exact = c;
        if (exact != pick && cost[pick] > 0.9 * cost[exact]) pick = exact;
      }
      p->small = p->large = candidates[pick];
      row[0] = row[1] = static_cast<double>(candidates[pick]);
      for (int which = 0; which < 2; ++which) {
        for (size_t c = 0; c < candidates.size(); ++c) {
          row.push_back(static_cast<double>(candidates[c]));
          row.push_back(best_of[which][c] * 1e6);
        }
      }
      p->rows_cut = small_rows + (large_rows - small_rows) / 2;
      prepare(*p);
      report.push_back(row);
    }
    return report;
  }

  // The weight copies the chosen kernels multiply by, and none other (no second copy nothing reads).
  static void prepare(Linear& p) {
    const auto uses = [&](int64_t kernel) { return p.small == kernel || p.large == kernel; };
    if (!uses(kTransposed)) {
      p.transposed = Tensor();
    } else if (!p.transposed.defined()) {
      p.transposed = p.weight.t().contiguous();
    }
    if (!uses(kOneDnn)) {
      p.onednn = Tensor();
    } else if (!p.onednn.defined()) {
      p.onednn = onednn_reorder(p.weight);
    }
  }

  // Set every matmul's kernel directly (tests and the eager comparison): the same kernel for all rows.
  void force(int64_t kernel) {
    for (Linear* p : matmuls()) {
      p->small = p->large = (quantized(kernel) && !p->int8) || (kernel == kVnni && !p->vnni) ? kLinear : kernel;
      prepare(*p);
    }
  }

  std::vector<std::string> kernels() {
    std::vector<std::string> names;
    for (Linear* p : matmuls()) names.push_back(std::string(kernel_name(p->small)) + "/" + kernel_name(p->large));
    return names;
  }

  // One step for N rows. ids (N,) the last token of each row; level >= 0: every row is at that position (its K/V
  // written with one slice), else `positions` (N,) gives each row's own; self_key/self_value per layer
  // (R, h, capacity, d_k) with rows 0..N-1 in use, attended up to `width` positions under `self_mask`
  // ((N, 1, 1, width) additive, or undefined); cross_key/cross_value per layer (N, h, S, d_k) and `source_mask`
  // ((N, 1, 1, S) additive or undefined). Returns logits (N, V) and, when asked, each layer's cross-attention
  // weights (N, h, S).
  // One step of the static search's cache: every row at `position` (its K/V written there), attending to
  // positions 0…position.
  std::pair<Tensor, std::vector<Tensor>> step_at(const Tensor& ids, int64_t position,
                                                 const std::vector<Tensor>& self_key,
                                                 const std::vector<Tensor>& self_value,
                                                 const std::vector<Tensor>& cross_key,
                                                 const std::vector<Tensor>& cross_value,
                                                 const c10::optional<Tensor>& source_mask, bool need_weights) {
    return step(ids, position, ids, self_key, self_value, position + 1, c10::nullopt, cross_key, cross_value,
                source_mask, need_weights);
  }

  // One step of the continuous scheduler's ragged rows: row r's K/V written at positions[r], attending to the
  // first `width` positions through `self_mask` (rows, 1, 1, width), or, without one, every row at width - 1.
  std::pair<Tensor, std::vector<Tensor>> step_rows(const Tensor& ids, const Tensor& positions,
                                                   const std::vector<Tensor>& self_key,
                                                   const std::vector<Tensor>& self_value, int64_t width,
                                                   const c10::optional<Tensor>& self_mask,
                                                   const std::vector<Tensor>& cross_key,
                                                   const std::vector<Tensor>& cross_value,
                                                   const c10::optional<Tensor>& source_mask, bool need_weights) {
    const int64_t level = self_mask.has_value() ? -1 : width - 1;
    return step(ids, level, positions, self_key, self_value, width, self_mask, cross_key, cross_value, source_mask,
                need_weights);
  }

  // `level` >= 0: every row at that position; -1: row r at positions[r] (step_at and step_rows say which).
  std::pair<Tensor, std::vector<Tensor>> step(const Tensor& ids, int64_t level, const Tensor& positions,
                                              const std::vector<Tensor>& self_key,
                                              const std::vector<Tensor>& self_value, int64_t width,
                                              const c10::optional<Tensor>& self_mask,
                                              const std::vector<Tensor>& cross_key,
                                              const std::vector<Tensor>& cross_value,
                                              const c10::optional<Tensor>& source_mask, bool need_weights) {
    at::InferenceMode guard;
    auto [x, cross_weights] = layers(ids, level, positions, self_key, self_value, width, self_mask, cross_key,
                                     cross_value, source_mask, need_weights);
    return {logits(x), cross_weights};
  }

  // `step` up to the output projection: the last layer's states (N, d_model) and the cross-attention weights.
  std::pair<Tensor, std::vector<Tensor>> layers(const Tensor& ids, int64_t level, const Tensor& positions,
                                                const std::vector<Tensor>& self_key,
                                                const std::vector<Tensor>& self_value, int64_t width,
                                                const c10::optional<Tensor>& self_mask,
                                                const std::vector<Tensor>& cross_key,
                                                const std::vector<Tensor>& cross_value,
                                                const c10::optional<Tensor>& source_mask, bool need_weights,
                                                const Tensor& cross_rows = Tensor()) const {
    const int64_t rows = ids.size(0), d_model = embed_.size(1), d_k = d_model / heads_;
    Tensor x = embed(ids, level, positions);  // (N, d)
    Tensor own_mask = self_mask.has_value() ? *self_mask : Tensor();
    Tensor cross_mask = source_mask.has_value() ? *source_mask : Tensor();
    Tensor row_index = level >= 0 ? Tensor() : at::arange(rows, ids.options());
    std::vector<Tensor> cross_weights;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      Tensor qkv = layer.qkv(x).view({rows, 3, heads_, d_k});  // (N, 3, h, d_k)
      Tensor query = qkv.select(1, 0), key = qkv.select(1, 1), value = qkv.select(1, 2);  // (N, h, d_k)
      if (plain_cpu(key) && self_key[i].is_contiguous() && self_value[i].is_contiguous() && ids.is_cpu()) {
        write_cache(self_key[i], key, level, positions);
        write_cache(self_value[i], value, level, positions);
      } else if (level >= 0) {
        self_key[i].narrow(0, 0, rows).select(2, level).copy_(key);
        self_value[i].narrow(0, 0, rows).select(2, level).copy_(value);
      } else {
        using at::indexing::Slice;
        Tensor keys_out = self_key[i], values_out = self_value[i];  // handles to the same storage
        keys_out.index_put_({row_index, Slice(), positions}, key);
        values_out.index_put_({row_index, Slice(), positions}, value);
      }
      Tensor keys = self_key[i].narrow(0, 0, rows).narrow(2, 0, width);
      Tensor values = self_value[i].narrow(0, 0, rows).narrow(2, 0, width);
      Tensor context = attend(query, keys, values, own_mask, heads_, Tensor(), lanes_).first;
      x = add_norm(x, layer.self_out(context), layer.norm1_w, layer.norm1_b, eps_);
      auto [cross_context, weights] = attend(layer.cross_q(x), cross_key[i], cross_value[i], cross_mask, heads_,
                                             cross_rows, lanes_);
      if (need_weights) cross_weights.push_back(weights.view({rows, heads_, -1}));
      x = add_norm(x, layer.cross_out(cross_context), layer.norm2_w, layer.norm2_b, eps_);
      Tensor hidden = layer.fc1(x, activation_);
      x = add_norm(x, layer.fc2(hidden), layer.norm3_w, layer.norm3_b, eps_);
    }
    return {x, cross_weights};
  }

  // Token embedding × scale + the position's sinusoid, each row at `level` or at its own `positions[r]`.
  Tensor embed(const Tensor& ids, int64_t level, const Tensor& positions) const {
    if (!(plain_cpu(embed_) && ids.is_cpu() && ids.scalar_type() == at::kLong)) {
      Tensor position = level >= 0 ? positions_[level] : positions_.index_select(0, positions);
      return at::embedding(embed_, ids).mul_(embed_scale_).add_(position);
    }
    const int64_t rows = ids.size(0), d = embed_.size(1);
    Tensor x = at::empty({rows, d}, embed_.options());
    const int64_t* id = ids.data_ptr<int64_t>();
    const int64_t* at = level >= 0 ? nullptr : positions.data_ptr<int64_t>();
    const float *table = embed_.data_ptr<float>(), *sinusoids = positions_.data_ptr<float>();
    float* out = x.data_ptr<float>();
    const float scale = static_cast<float>(embed_scale_);
    for (int64_t r = 0; r < rows; ++r) {
      const float* e = table + id[r] * d;
      const float* p = sinusoids + (at ? at[r] : level) * d;
      for (int64_t c = 0; c < d; ++c) out[r * d + c] = e[c] * scale + p[c];
    }
    return x;
  }

  // K or V of this step (N, h, d_k) written into a cache buffer (R, h, capacity, d_k) at each row's position.
  static void write_cache(const Tensor& buffer, const Tensor& rows_kv, int64_t level, const Tensor& positions) {
    const int64_t rows = rows_kv.size(0), heads = rows_kv.size(1), d_k = rows_kv.size(2);
    const int64_t capacity = buffer.size(2);
    const int64_t* at = level >= 0 ? nullptr : positions.data_ptr<int64_t>();
    const float* in = rows_kv.data_ptr<float>();
    float* out = buffer.data_ptr<float>();
    const int64_t s_row = rows_kv.stride(0), s_head = rows_kv.stride(1);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t position = at ? at[r] : level;
      for (int64_t h = 0; h < heads; ++h) {
        std::memcpy(out + ((r * heads + h) * capacity + position) * d_k, in + r * s_row + h * s_head,
                    sizeof(float) * d_k);
      }
    }
  }

  // Output projection + final_logits_bias; under int8 each row's `rescore_` best candidates recomputed exactly.
  Tensor logits(const Tensor& x) const {
    int64_t kernel = x.size(0) <= output_.rows_cut ? output_.small : output_.large;
    Tensor out = output_.run(x, kernel);
    if (!quantized(kernel) || rescore_ <= 0) return out;
    const int64_t count = std::min<int64_t>(rescore_, out.size(1));
    Tensor candidates = std::get<1>(row_topk(out, count)).contiguous();
    if (plain_cpu(x) && x.is_contiguous() && plain_cpu(output_.weight) && output_.weight.is_contiguous() &&
        out.is_contiguous() && output_.bias.defined()) {
      // each candidate's logit recomputed in place: its fp32 weight row · the row's state + its bias
      const int64_t rows = x.size(0), d = x.size(1), width = out.size(1);
      const float *xs = x.data_ptr<float>(), *w = output_.weight.data_ptr<float>();
      const float* b = output_.bias.data_ptr<float>();
      const int64_t* picked = candidates.data_ptr<int64_t>();
      float* o = out.data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r) {
        const float* state = xs + r * d;
        for (int64_t j = 0; j < count; ++j) {
          const int64_t column = picked[r * count + j];
          o[r * width + column] = dot_loop(w + column * d, state, d) + b[column];
        }
      }
      return out;
    }
    Tensor exact = at::bmm(output_.weight.index_select(0, candidates.reshape(-1)).view({x.size(0), -1, x.size(1)}),
                           x.unsqueeze(-1)).squeeze(-1);
    return out.scatter_(-1, candidates, exact + output_.bias.index_select(0, candidates.reshape(-1)).view_as(exact));
  }

  // Whether the beam may take its candidates straight from the output projection (`candidates`): fp32 on the CPU.
  bool fused_candidates() const {
    return plain_cpu(output_.weight) && output_.weight.is_contiguous() && output_.bias.defined() &&
           plain_cpu(output_.bias);
  }

  // model.search.next_logprobs followed by row_topk(·, m) for the states x (N, d_model) of the last layer,
  // without the (N, V) log-probabilities: per row one pass picks the largest logits (under int8 the `rescore_`
  // best recomputed from the fp32 weight, as `logits` does), one more sums e^(logit - max), and only the picked
  // ones get their log-probability (logit - max) - log Σ, then ordered as at::topk orders log-probabilities (of
  // equal values the lower column first). Banned tokens (pad; eos before min_new_tokens) are left out; a row at
  // its budget (`ending[r]`) gets eos at 0 and -inf after it, as next_logprobs forces.
  std::tuple<Tensor, Tensor> candidates(const Tensor& x, int64_t m, bool banned, const std::vector<char>& ending,
                                        int64_t eos, int64_t pad) const {
    const int64_t rows = x.size(0), d = x.size(1);
    const int64_t kernel = rows <= output_.rows_cut ? output_.small : output_.large;
    // (N, V) logits, int8 ones not yet rescored; from the VNNI tiles with each row's 64-column maxima beside
    const bool tiles = kernel == kVnni && output_.vnni && x.is_contiguous();
    std::vector<float> block_maxes(tiles ? rows * ((output_.vnni.out + kBlock - 1) / kBlock) : 0);
    Tensor out = tiles ? vnni_linear(x, output_.vnni, output_.bias, false, block_maxes.data())
                       : output_.run(x, kernel).contiguous();
    Tensor state = x.contiguous();
    const int64_t width = out.size(1);
    const int64_t rescored = quantized(kernel) && rescore_ > 0 ? std::min(rescore_, width) : 0;
    const int64_t pool = std::min(width, rescored + m + 4);  // slack for ties and bans
    Tensor values = at::empty({rows, m}, out.options());
    Tensor tokens = at::empty({rows, m}, out.options().dtype(at::kLong));
    float* value_out = values.data_ptr<float>();
    int64_t* token_out = tokens.data_ptr<int64_t>();
    const float *w = output_.weight.data_ptr<float>(), *b = output_.bias.data_ptr<float>();
    const float* states = state.data_ptr<float>();
    float* logits = out.data_ptr<float>();
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> v(pool);
    std::vector<int64_t> column(pool);
    std::vector<std::pair<float, int64_t>> picked;
    std::vector<int64_t> left_out;
    for (int64_t r = 0; r < rows; ++r) {
      float* vs = value_out + r * m;
      int64_t* ts = token_out + r * m;
      if (ending[r]) {  // every token -inf but eos at 0: eos, then the lowest other columns
        vs[0] = 0.0f;
        ts[0] = eos;
        for (int64_t j = 1, c = 0; j < m; ++c) {
          if (c == eos) continue;
          vs[j] = -inf;
          ts[j++] = c;
        }
        continue;
      }
      float* row = logits + r * width;
      top_of_row(row, width, pool, v.data(), column.data(),
                 tiles ? block_maxes.data() + r * ((width + kBlock - 1) / kBlock) : nullptr);
      for (int64_t j = 0; j < rescored; ++j) {  // int8: the best candidates' logits recomputed exactly, in place
        v[j] = dot_loop(w + column[j] * d, states + r * d, d) + b[column[j]];
        row[column[j]] = v[j];
      }
      // every logit outside the pool is at most the pool's smallest, so the pool holds the row's largest
      const float top = *std::max_element(v.begin(), v.end());
      const float log_sum = std::log(sum_exp_loop(row, width, top));
      picked.clear();
      left_out.clear();
      for (int64_t j = 0; j < pool; ++j) {
        if (column[j] == pad || (banned && column[j] == eos)) {
          left_out.push_back(column[j]);
        } else {
          picked.emplace_back((v[j] - top) - log_sum, column[j]);
        }
      }
      std::sort(left_out.begin(), left_out.end());
      std::sort(picked.begin(), picked.end(), [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      });
      for (int64_t j = 0; j < m; ++j) {
        if (j < static_cast<int64_t>(picked.size())) {
          vs[j] = picked[j].first;
          ts[j] = picked[j].second;
        } else {  // a vocabulary of at most m + 1 tokens: the banned ones at -inf, lower column first
          vs[j] = -inf;
          ts[j] = left_out[j - picked.size()];
        }
      }
    }
    return {values, tokens};
  }

  // ---- the search loops (model/search.py's _greedy and _beam on the CPU, line for line) ----------------------
  // capture: a Capture (every layer's and head's cross-attention per step (N, L, h, S), or one head's rows (N, S),
  // capture_head < 0: the layer's head average).
  Tensor keep(const std::vector<Tensor>& cross, int64_t capture, int64_t layer, int64_t head) const {
    if (capture == kCaptureEveryHead) return at::stack(cross, 1);
    if (capture == kCaptureOneHead) return head < 0 ? cross[layer].mean(1) : cross[layer].select(1, head);
    return Tensor();
  }

  // Greedy search over cross K/V (per layer (B, h, S, d_k)) and `source_mask` ((B, 1, 1, S) additive or None):
  // returns tokens (B, W), their log-probabilities (B, W), lengths (B,), and per step the captured attention and
  // the inputs its rows belong to.
  std::tuple<Tensor, Tensor, Tensor, std::vector<Tensor>, std::vector<std::vector<int64_t>>> greedy(
      std::vector<Tensor> cross_key, std::vector<Tensor> cross_value, c10::optional<Tensor> source_mask,
      std::vector<int64_t> budgets, int64_t min_new_tokens, int64_t eos, int64_t pad, int64_t start,
      int64_t capture, int64_t capture_layer, int64_t capture_head) {
    at::InferenceMode guard;
    const int64_t batch = budgets.size();
    const int64_t width = *std::max_element(budgets.begin(), budgets.end());
    auto longs = cross_key[0].options().dtype(at::kLong);
    Cache cache = start_cache(cross_key, cross_value, source_mask, width);
    std::vector<int64_t> active(batch);
    for (int64_t i = 0; i < batch; ++i) active[i] = i;
    Tensor rows_of = at::arange(batch, longs);
    Tensor out_tokens = at::full({batch, width}, pad, longs);
    Tensor out_logprobs = at::zeros({batch, width}, cross_key[0].options());
    Tensor out_length = at::full({batch}, width, longs);
    Tensor alive = at::ones({batch}, longs.dtype(at::kBool));
    std::vector<Tensor> attention_steps;
    std::vector<std::vector<int64_t>> actives;
    Tensor last_tokens = at::full({batch}, start, longs);
    for (int64_t step = 0; step < width; ++step) {
      auto [logits, cross] = run_step(last_tokens, step, cache, capture != kCaptureNothing);
      std::vector<int64_t> ending;
      for (size_t row = 0; row < active.size(); ++row)
        if (budgets[active[row]] <= step + 1) ending.push_back(row);
      Tensor logprobs = next_logprobs(logits, step + 1 < min_new_tokens, ending, eos, pad);
      auto [best_logprob, best] = logprobs.max(-1);
      using at::indexing::TensorIndex;
      out_tokens.index_put_({rows_of, step}, best);
      out_logprobs.index_put_({rows_of, step}, best_logprob);
      Tensor ended = alive & best.eq(eos);
      out_length.index_put_({rows_of}, at::where(ended, at::scalar_tensor(step + 1, longs), out_length.index({rows_of})));
      alive = alive & ~ended;
      if (capture != kCaptureNothing) {
        attention_steps.push_back(keep(cross, capture, capture_layer, capture_head));
        actives.push_back(active);
      }
      last_tokens = best;
      std::vector<int64_t> kept;
      auto alive_flags = alive.accessor<bool, 1>();
      for (int64_t row = 0; row < alive.size(0); ++row)
        if (alive_flags[row]) kept.push_back(row);
      if (kept.empty()) break;
      if (kept.size() < active.size()) {
        Tensor rows = at::tensor(kept, longs);
        cache.reorder(rows, false);
        keep_rows({&last_tokens, &alive, &rows_of}, rows);
        active = picked(active, kept);
      }
    }
    return {out_tokens, out_logprobs, out_length, attention_steps, actives};
  }

  // Beam search of beam size k over cross K/V (and source mask) with one row per source, which its k rows share.
  // Returns, per step, the records
  // model.search.StepRecord holds (run_source_row, run_token, run_logprob, candidate_row, candidate_token,
  // candidate_logprob, attention), and per input its final (finished, finished_done, finished_ref).
  std::pair<std::vector<std::vector<Tensor>>, std::vector<std::vector<Tensor>>> beam(
      std::vector<Tensor> cross_key, std::vector<Tensor> cross_value, c10::optional<Tensor> source_mask,
      std::vector<int64_t> budgets, int64_t k, double length_penalty, int64_t min_new_tokens, int64_t eos,
      int64_t pad, int64_t start, int64_t capture, int64_t capture_layer, int64_t capture_head) {
    at::InferenceMode guard;
    const int64_t batch = budgets.size();
    const int64_t width = *std::max_element(budgets.begin(), budgets.end());
    auto floats = cross_key[0].options();
    auto longs = floats.dtype(at::kLong);
    Cache cache = start_cache(cross_key, cross_value, source_mask, width, k);
    std::vector<int64_t> active(batch);
    for (int64_t i = 0; i < batch; ++i) active[i] = i;
    // The search state of each active input lives on the host, its k slots side by side: at a text's four rows a
    // step's bookkeeping is a few dozen numbers, where one ATen call per operation (about forty a step) and their
    // allocations cost more than the decoding step's own small operations (perf at B=1).
    const float neg = static_cast<float>(kNegInf);
    std::vector<float> running(batch * k, neg), finished(batch * k, neg);
    std::vector<char> finished_done(batch * k, 0), improvable(batch, 1), frozen(batch, 0);
    std::vector<int64_t> finished_ref(batch * k, -1);
    for (int64_t a = 0; a < batch; ++a) running[a * k] = 0.0f;
    Tensor last_tokens = at::full({batch * k}, start, longs);
    std::vector<std::vector<Tensor>> results(batch);
    std::vector<std::vector<Tensor>> steps;
    Tensor run_source_row, run_token, run_logprob;
    const int64_t ref_stride = 2 * k * batch, wide = 2 * k * k;
    const bool fused = fused_candidates() && plain_cpu(cross_key[0]);
    const auto host_longs = at::TensorOptions().dtype(at::kLong), host_floats = at::TensorOptions().dtype(at::kFloat);
    std::vector<std::pair<float, int64_t>> order(wide), merged(3 * k);
    std::vector<float> top_scores(2 * k), candidate(2 * k), kept_scores(k);
    std::vector<char> hits(2 * k), taking(2 * k), kept_done(k);
    std::vector<int64_t> kept_ref(k);
    const auto before = [](const std::pair<float, int64_t>& x, const std::pair<float, int64_t>& y) {
      // at::topk's order: larger first (NaN largest), of equal values the lower index first
      const bool x_nan = std::isnan(x.first), y_nan = std::isnan(y.first);
      if (x_nan != y_nan) return x_nan;
      return x.first > y.first || (x.first == y.first && x.second < y.second);
    };
    for (int64_t step = 0; step < width; ++step) {
      const int64_t items = active.size();
      // The first step runs one row per input, then its answers are copied to the input's k rows (as
      // CTranslate2 does on a CPU): every beam starts from the same start token, and only beam 0's scores count.
      const bool first = step == 0 && k > 1;
      const bool banned = step + 1 < min_new_tokens;
      auto [out, cross] = first ? first_step(last_tokens, k, cache, capture != kCaptureNothing, fused)
                                : run_step(last_tokens, step, cache, capture != kCaptureNothing, fused);
      Tensor row_logprob, row_token;  // (rows, 2k): each row's 2k best next tokens, rows = G·k (G at the first step)
      if (fused) {  // `out`: the last layer's states, of one row per input at the first step
        std::vector<char> ending;
        for (int64_t a = 0; a < items; ++a)
          for (int64_t b = 0; b < (first ? 1 : k); ++b) ending.push_back(budgets[active[a]] <= step + 1);
        std::tie(row_logprob, row_token) = candidates(out, 2 * k, banned, ending, eos, pad);
      } else {  // `out`: the logits, of every row
        std::vector<int64_t> ending;
        for (int64_t a = 0; a < items; ++a)
          if (budgets[active[a]] <= step + 1)
            for (int64_t b = 0; b < k; ++b) ending.push_back(a * k + b);
        std::tie(row_logprob, row_token) = row_topk(next_logprobs(out, banned, ending, eos, pad), 2 * k);
      }
      const Tensor host_logprob = row_logprob.to(at::kCPU).contiguous(), host_token = row_token.to(at::kCPU).contiguous();
      const float* lp = host_logprob.data_ptr<float>();
      const int64_t* tk = host_token.data_ptr<int64_t>();
      const bool one_row = first && fused;  // then each input's one row stands for its k rows
      const int64_t row_stride = one_row ? 0 : 2 * k;
      const float divisor = static_cast<float>(std::pow(static_cast<double>(step + 1), length_penalty));

      // model.search.beam_step, one input at a time
      Tensor row_t = at::empty({items, 2 * k}, host_longs), token_t = at::empty({items, 2 * k}, host_longs);
      Tensor token_logprob_t = at::empty({items, 2 * k}, host_floats);
      Tensor new_rows_t = at::empty({items * k}, host_longs), new_tokens_t = at::empty({items * k}, host_longs);
      Tensor new_logprobs_t = at::empty({items * k}, host_floats);
      int64_t *rows_out = row_t.data_ptr<int64_t>(), *tokens_out = token_t.data_ptr<int64_t>();
      float* logprobs_out = token_logprob_t.data_ptr<float>();
      int64_t *new_rows = new_rows_t.data_ptr<int64_t>(), *new_tokens = new_tokens_t.data_ptr<int64_t>();
      float* new_logprobs = new_logprobs_t.data_ptr<float>();
      std::vector<char> done(items);
      for (int64_t a = 0; a < items; ++a) {
        float* run = running.data() + a * k;
        const int64_t base = one_row ? a * 2 * k : a * k * 2 * k;
        for (int64_t b = 0; b < k; ++b)
          for (int64_t j = 0; j < 2 * k; ++j) order[b * 2 * k + j] = {lp[base + b * row_stride + j] + run[b], b * 2 * k + j};
        std::partial_sort(order.begin(), order.begin() + 2 * k, order.begin() + wide, before);
        const bool ending = budgets[active[a]] <= step + 1;
        for (int64_t j = 0; j < 2 * k; ++j) {
          top_scores[j] = order[j].first;
          const int64_t beam = order[j].second / (2 * k), at_flat = base + beam * row_stride + order[j].second % (2 * k);
          rows_out[a * 2 * k + j] = a * k + beam;
          tokens_out[a * 2 * k + j] = tk[at_flat];
          logprobs_out[a * 2 * k + j] = lp[at_flat];
          hits[j] = tk[at_flat] == eos || ending;
        }
        // the k best that do not end here continue: order[0 … k-1] from here on (their scores and candidates)
        for (int64_t j = 0; j < 2 * k; ++j) order[j] = {top_scores[j] + (hits[j] ? neg : -0.0f), j};
        std::partial_sort(order.begin(), order.begin() + k, order.begin() + 2 * k, before);
        bool all_done = true;
        for (int64_t j = 0; j < k; ++j) all_done = all_done && finished_done[a * k + j];
        for (int64_t j = 0; j < 2 * k; ++j) {
          taking[j] = hits[j] && j < k && !frozen[a];
          const bool eligible = taking[j] && improvable[a] && !all_done;
          candidate[j] = eligible ? top_scores[j] / divisor : top_scores[j] + 2.0f * neg;
        }
        // merge the finished slots with this step's candidates and keep the k best
        for (int64_t j = 0; j < k; ++j) merged[j] = {finished[a * k + j], j};
        for (int64_t j = 0; j < 2 * k; ++j) merged[k + j] = {candidate[j], k + j};
        std::partial_sort(merged.begin(), merged.begin() + k, merged.end(), before);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t slot = merged[j].second;
          kept_scores[j] = merged[j].first;
          kept_done[j] = slot < k ? finished_done[a * k + slot] : taking[slot - k];
          kept_ref[j] = slot < k ? finished_ref[a * k + slot] : a * 2 * k + (slot - k) + step * ref_stride;
        }
        float worst = kept_scores[0];
        bool every_done = true, every_hit = true, can_improve = false;
        for (int64_t j = 0; j < k; ++j) {
          finished[a * k + j] = kept_scores[j];
          finished_done[a * k + j] = kept_done[j];
          finished_ref[a * k + j] = kept_ref[j];
          worst = std::min(worst, kept_scores[j]);
          every_done = every_done && kept_done[j];
        }
        for (int64_t j = 0; j < 2 * k; ++j) every_hit = every_hit && hits[j];
        const float best_possible = order[0].first / divisor;
        for (int64_t j = 0; j < k; ++j) can_improve = can_improve || best_possible > (kept_done[j] ? worst : neg);
        improvable[a] = improvable[a] && can_improve;
        done[a] = !improvable[a] || every_done || every_hit || frozen[a];
        frozen[a] = done[a];
        for (int64_t j = 0; j < k; ++j) {
          const int64_t c = order[j].second;
          run[j] = order[j].first;
          new_rows[a * k + j] = rows_out[a * 2 * k + c];
          new_tokens[a * k + j] = tokens_out[a * 2 * k + c];
          new_logprobs[a * k + j] = logprobs_out[a * 2 * k + c];
        }
      }
      const auto device = cross_key[0].device();
      steps.push_back({run_source_row, run_token, run_logprob, row_t.to(device), token_t.to(device),
                       token_logprob_t.to(device), keep(cross, capture, capture_layer, capture_head)});
      std::vector<int64_t> kept;
      for (int64_t a = 0; a < items; ++a) {
        if (done[a]) {
          results[active[a]] = {
              at::tensor(std::vector<float>(finished.begin() + a * k, finished.begin() + a * k + k), host_floats).to(device),
              at::tensor(std::vector<int64_t>(finished_done.begin() + a * k, finished_done.begin() + a * k + k), host_longs)
                  .to(at::kBool).to(device),
              at::tensor(std::vector<int64_t>(finished_ref.begin() + a * k, finished_ref.begin() + a * k + k), host_longs).to(device)};
        } else {
          kept.push_back(a);
        }
      }
      if (kept.empty()) break;
      const int64_t left = kept.size();
      if (left < items) {  // the inputs still running, in order, their slots moved down
        Tensor rows_left = at::empty({left * k}, host_longs), tokens_left = at::empty({left * k}, host_longs);
        Tensor logprobs_left = at::empty({left * k}, host_floats);
        for (int64_t i = 0; i < left; ++i) {
          const int64_t a = kept[i];
          for (int64_t j = 0; j < k; ++j) {
            rows_left.data_ptr<int64_t>()[i * k + j] = new_rows[a * k + j];
            tokens_left.data_ptr<int64_t>()[i * k + j] = new_tokens[a * k + j];
            logprobs_left.data_ptr<float>()[i * k + j] = new_logprobs[a * k + j];
            running[i * k + j] = running[a * k + j];
            finished[i * k + j] = finished[a * k + j];
            finished_done[i * k + j] = finished_done[a * k + j];
            finished_ref[i * k + j] = finished_ref[a * k + j];
          }
          improvable[i] = improvable[a];
          frozen[i] = frozen[a];
        }
        new_rows_t = rows_left;
        new_tokens_t = tokens_left;
        new_logprobs_t = logprobs_left;
        active = picked(active, kept);
      }
      run_source_row = new_rows_t.to(device);
      last_tokens = new_tokens_t.to(device);
      run_token = last_tokens;
      run_logprob = new_logprobs_t.to(device);
      // after the first step, input a's self-attention keys and values are in row a, not in rows a·k…a·k+k-1
      cache.reorder(run_source_row, true, step == 0 && k > 1 ? at::div(run_source_row, k, "floor") : Tensor());
    }
    return {steps, results};
  }

 private:
  static constexpr double kNegInf = -1.0e9;

  // The static search's cache (model.transformer.DecoderCache): self-attention K/V preallocated per layer
  // (rows, h, capacity, d_k) with spares that a reorder copies into, cross K/V computed once per source.
  struct Cache {
    std::vector<Tensor> self_key, self_value, spare_key, spare_value, cross_key, cross_value;
    std::shared_ptr<Tensor> workspace;  // the block the self-attention buffers lie in (CPU), while this cache lives
    Tensor source_mask;
    Tensor cross_rows;  // on the CPU: the row of cross_key, cross_value and source_mask each row reads
    int64_t length = 0;

    // out[r, :, :length] = in[index[r], :, :length] for buffers (R, h, capacity, d_k): one copy per row and head
    // of the positions written so far (index_select over the narrowed buffer walks them element by element).
    void copy_rows(const Tensor& in, Tensor& out, const Tensor& index) const {
      const int64_t heads = in.size(1), capacity = in.size(2), d_k = in.size(3), rows = index.numel();
      const Tensor picked = index.to(at::kLong).contiguous();
      const int64_t* from = picked.data_ptr<int64_t>();
      const float* source = in.data_ptr<float>();
      float* target = out.data_ptr<float>();
      const int64_t block = capacity * d_k;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < heads; ++h)
          std::memcpy(target + (r * heads + h) * block, source + (from[r] * heads + h) * block,
                      sizeof(float) * length * d_k);
    }

    // Rows `index` of every cache (the self-attention caches' rows `self_index` instead, where given).
    void reorder(const Tensor& index, bool same_sources, const Tensor& self_index = Tensor()) {
      const int64_t rows = index.numel();
      const Tensor& own = self_index.defined() ? self_index : index;
      for (auto* pair : {&self_key, &self_value}) {
        auto& spares = pair == &self_key ? spare_key : spare_value;
        for (size_t i = 0; i < pair->size(); ++i) {
          if (plain_cpu((*pair)[i]) && (*pair)[i].is_contiguous() && spares[i].is_contiguous() && own.is_cpu()) {
            copy_rows((*pair)[i], spares[i], own);
          } else {
            Tensor out = spares[i].narrow(0, 0, rows).narrow(2, 0, length);
            at::index_select_out(out, (*pair)[i].narrow(2, 0, length), 0, own);
          }
          std::swap((*pair)[i], spares[i]);
        }
      }
      if (same_sources && rows == (cross_rows.defined() ? cross_rows.numel() : cross_key[0].size(0))) return;
      if (cross_rows.defined()) {  // rows that left are no longer read: nothing of the sources' K/V is copied
        cross_rows = cross_rows.index_select(0, index);
        return;
      }
      for (auto& t : cross_key) t = t.index_select(0, index);
      for (auto& t : cross_value) t = t.index_select(0, index);
      if (source_mask.defined()) source_mask = source_mask.index_select(0, index);
    }
  };

  // A search's cache for `beams` rows per source. The sources' K/V come one row per source (`beams` > 1: read
  // through cross_rows by each of its rows on the CPU, repeated elsewhere) or already on every row (`beams` 1).
  Cache start_cache(const std::vector<Tensor>& cross_key, const std::vector<Tensor>& cross_value,
                    const c10::optional<Tensor>& source_mask, int64_t capacity, int64_t beams = 1) const {
    Cache cache;
    const int64_t sources = cross_key[0].size(0), rows = sources * beams, d_k = cross_key[0].size(3);
    const int64_t each = rows * heads_ * capacity * d_k;
    const bool cpu = plain_cpu(cross_key[0]);
    if (cpu) cache.workspace = workspace_->take(4 * static_cast<int64_t>(layers_.size()) * each, cross_key[0].options());
    int64_t offset = 0;
    for (size_t i = 0; i < layers_.size(); ++i) {
      for (auto* list : {&cache.self_key, &cache.self_value, &cache.spare_key, &cache.spare_value}) {
        list->push_back(cpu ? cache.workspace->narrow(0, offset, each).view({rows, heads_, capacity, d_k})
                            : at::empty({rows, heads_, capacity, d_k}, cross_key[0].options()));
        offset += each;
      }
    }
    cache.cross_key = cross_key;
    cache.cross_value = cross_value;
    if (source_mask.has_value()) cache.source_mask = *source_mask;
    const auto longs = cross_key[0].options().dtype(at::kLong);
    if (cpu) {
      cache.cross_rows = beams > 1 ? at::arange(sources, longs).repeat_interleave(beams) : at::arange(rows, longs);
    } else if (beams > 1) {
      for (auto& t : cache.cross_key) t = t.repeat_interleave(beams, 0);
      for (auto& t : cache.cross_value) t = t.repeat_interleave(beams, 0);
      if (cache.source_mask.defined()) cache.source_mask = cache.source_mask.repeat_interleave(beams, 0);
    }
    return cache;
  }

  // One step over the cache: the logits, or with `hidden` the last layer's states; and the cross-attention.
  std::pair<Tensor, std::vector<Tensor>> run_step(const Tensor& ids, int64_t position, Cache& cache,
                                                  bool need_weights, bool hidden = false) {
    const auto source_mask = cache.source_mask.defined() ? c10::optional<Tensor>(cache.source_mask) : c10::nullopt;
    auto [x, cross] = layers(ids, position, ids, cache.self_key, cache.self_value, position + 1, c10::nullopt,
                             cache.cross_key, cache.cross_value, source_mask, need_weights, cache.cross_rows);
    cache.length = position + 1;
    return {hidden ? x : logits(x), cross};
  }

  // The beam's first step on row 0 of each input's k rows (its self-attention keys and values written to row a of
  // the caches for input a), its logits and cross-attention weights then repeated to all k rows (with `hidden`,
  // the last layer's states of the one row per input, not repeated).
  std::pair<Tensor, std::vector<Tensor>> first_step(const Tensor& ids, int64_t k, Cache& cache, bool need_weights,
                                                    bool hidden = false) {
    const int64_t inputs = ids.size(0) / k;
    Tensor first = at::arange(inputs, ids.options()).mul_(k);
    Cache single = cache;  // the same self-attention buffers; the cross-attention inputs' first rows
    if (single.cross_rows.defined()) {
      single.cross_rows = single.cross_rows.index_select(0, first);
    } else {
      for (auto& t : single.cross_key) t = t.index_select(0, first);
      for (auto& t : single.cross_value) t = t.index_select(0, first);
      if (single.source_mask.defined()) single.source_mask = single.source_mask.index_select(0, first);
    }
    auto [out, cross] = run_step(ids.index_select(0, first), 0, single, need_weights, hidden);
    cache.length = single.length;
    Tensor every = at::arange(inputs, ids.options()).repeat_interleave(k);
    for (auto& weights : cross) weights = weights.index_select(0, every);
    return {hidden ? out : out.index_select(0, every), cross};
  }

  // Rows `index` of each tensor, in that order (inputs or rows leaving the search).
  static void keep_rows(std::initializer_list<Tensor*> tensors, const Tensor& index) {
    for (Tensor* tensor : tensors) *tensor = tensor->index_select(0, index);
  }

  static std::vector<int64_t> picked(const std::vector<int64_t>& values, const std::vector<int64_t>& index) {
    std::vector<int64_t> out;
    for (int64_t i : index) out.push_back(values[i]);
    return out;
  }

  // model.search.next_logprobs: log-softmax, pad banned, eos banned before min_new_tokens, rows at their
  // budget forced to eos.
  static Tensor next_logprobs(const Tensor& logits, bool banned, const std::vector<int64_t>& ending, int64_t eos,
                              int64_t pad) {
    Tensor logprobs = at::log_softmax(logits.to(at::kFloat), -1);
    const double inf = std::numeric_limits<double>::infinity();
    logprobs.select(1, pad).fill_(-inf);
    if (banned) logprobs.select(1, eos).fill_(-inf);
    if (!ending.empty()) {
      if (static_cast<int64_t>(ending.size()) == logprobs.size(0)) {
        logprobs.fill_(-inf);
        logprobs.select(1, eos).fill_(0.0);
      } else {
        Tensor rows = at::tensor(ending, logits.options().dtype(at::kLong));
        logprobs.index_fill_(0, rows, -inf);
        logprobs.index_put_({rows, eos}, at::scalar_tensor(0.0, logprobs.options()));
      }
    }
    return logprobs;
  }

  // The m largest of each row of a float matrix and their columns, largest first (of equal values the lower
  // column first), in one pass per row keeping the m best so far: at a few rows of a vocabulary, at::topk's
  // fixed cost is most of its time.
  static std::tuple<Tensor, Tensor> few_rows_topk(const Tensor& scores, int64_t m) {
    if (!plain_cpu(scores) || !scores.is_contiguous() || scores.dim() != 2 || scores.size(1) < m)
      return at::topk(scores, m, 1);
    const int64_t rows = scores.size(0), width = scores.size(1);
    Tensor values = at::empty({rows, m}, scores.options());
    Tensor index = at::empty({rows, m}, scores.options().dtype(at::kLong));
    const float* in = scores.data_ptr<float>();
    float* best = values.data_ptr<float>();
    int64_t* where = index.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) top_of_row(in + r * width, width, m, best + r * m, where + r * m);
    return {values, index};
  }

  // model.topk.row_topk: the m largest of each wide row by way of chunk maxima (16 rows and more; fewer rows
  // one pass each).
  static std::tuple<Tensor, Tensor> row_topk(const Tensor& scores, int64_t m) {
    constexpr int64_t chunk = 64, min_rows = 16;
    const int64_t rows = scores.size(0), width = scores.size(1), chunks = width / chunk;
    if (rows < min_rows) return few_rows_topk(scores, m);
    if (chunks <= m || !scores.is_contiguous()) return at::topk(scores, m, 1);
    Tensor whole = scores.as_strided({rows, chunks, chunk}, {width, chunk, 1});
    Tensor best_chunks = std::get<1>(whole.amax(2).topk(m, 1));
    const int64_t picked_width = m * chunk, tail_start = chunks * chunk;
    Tensor picked = whole.index({at::arange(rows, best_chunks.options()).unsqueeze(1), best_chunks}).view({rows, picked_width});
    auto [values, index] = at::cat({picked, scores.narrow(1, tail_start, width - tail_start)}, 1).topk(m, 1);
    Tensor in_chunks = best_chunks.gather(1, at::div(index, chunk, "floor").clamp_max_(m - 1)) * chunk + index.remainder(chunk);
    Tensor column = at::where(index.lt(picked_width), in_chunks, index - picked_width + tail_start);
    return {values, column};
  }

  Tensor embed_, positions_, encoder_embed_;
  std::vector<EncoderLayer> encoder_;
  double embed_scale_;
  int64_t heads_, activation_;
  double eps_;
  std::vector<Layer> layers_;
  Linear output_;
  int64_t rescore_ = 0;
  bool lanes_ = false;
  std::unique_ptr<Workspace> workspace_ = std::make_unique<Workspace>();
};

}  // namespace

// Prepack an int8 per-channel quantized weight (a quantized tensor made in Python) for fbgemm's dynamic linear.
Packed prepack(const Tensor& quantized) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("quantized::linear_prepack", "")
                       .typed<Packed(Tensor, std::optional<Tensor>)>();
  return op.call(quantized, std::nullopt);
}

// x Wᵀ + b through the int8 kernel alone (tests): activations scaled per row first (`per_row`), or quantized with
// one scale for the whole call as fbgemm does by itself; then `activation` (an Activation, -1 none) as a layer's
// fc1 runs it (SiLU fused into the per-row scale pass). `vnni`: through the VNNI tiles instead of fbgemm (rows
// quantized per row either way).
Tensor int8_linear(const Tensor& x, const Packed& weight, const Tensor& bias, bool per_row, bool reduce_range,
                   int64_t activation, bool vnni) {
  at::InferenceMode guard;
  if (!per_row && !vnni) return weight->apply_dynamic(x, reduce_range).add_(bias);
  Linear linear;
  linear.attach_int8(weight);
  linear.bias = bias;
  linear.reduce_range = reduce_range;
  TORCH_CHECK(!vnni || linear.vnni, "this CPU has no AVX-512 VNNI");
  return linear.run(x, vnni ? kVnni : kInt8, activation);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The codes Python passes (model/runtime/step.py's KERNELS and ACTIVATIONS are checked against these at load).
  pybind11::enum_<Kernel>(m, "Kernel")
      .value("linear", kLinear)
      .value("transposed", kTransposed)
      .value("int8", kInt8)
      .value("onednn", kOneDnn)
      .value("vnni", kVnni);
  pybind11::enum_<Activation>(m, "Activation")
      .value("silu", kSilu)
      .value("relu", kRelu)
      .value("gelu", kGelu)
      .value("gelu_tanh", kGeluTanh);
  pybind11::enum_<Capture>(m, "Capture")
      .value("nothing", kCaptureNothing)
      .value("every_head", kCaptureEveryHead)
      .value("one_head", kCaptureOneHead);
  pybind11::class_<LinearPackedParamsBase, Packed>(m, "Int8Weight");
  m.def("prepack", &prepack);
  m.def("int8_linear", &int8_linear, pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"),
        pybind11::arg("per_row"), pybind11::arg("reduce_range"), pybind11::arg("activation") = -1,
        pybind11::arg("vnni") = false);
  m.def("has_vnni", &cpu_has_vnni);
  pybind11::class_<Runtime>(m, "Runtime")
      .def(pybind11::init<Tensor, Tensor, double, int64_t, int64_t, double>())
      .def("add_layer", &Runtime::add_layer)
      .def("add_encoder_layer", &Runtime::add_encoder_layer)
      .def("set_encoder_embedding", &Runtime::set_encoder_embedding)
      .def("encode", &Runtime::encode, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("cross_key_values", &Runtime::cross_key_values, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("set_output", &Runtime::set_output)
      .def("choose", &Runtime::choose)
      .def("force", &Runtime::force)
      .def("kernels", &Runtime::kernels)
      .def("logits", [](const Runtime& runtime, const Tensor& x) {
        at::InferenceMode guard;
        return runtime.logits(x);
      })
      .def("output", [](Runtime& runtime, const Tensor& x, int64_t kernel) {
        at::InferenceMode guard;
        return runtime.matmuls().back()->run(x, kernel);
      })
      .def("step_at", &Runtime::step_at, pybind11::arg("ids"), pybind11::arg("position"), pybind11::arg("self_key"),
           pybind11::arg("self_value"), pybind11::arg("cross_key"), pybind11::arg("cross_value"),
           pybind11::arg("source_mask"), pybind11::arg("need_weights"),
           pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("step_rows", &Runtime::step_rows, pybind11::arg("ids"), pybind11::arg("positions"),
           pybind11::arg("self_key"), pybind11::arg("self_value"), pybind11::arg("width"), pybind11::arg("self_mask"),
           pybind11::arg("cross_key"), pybind11::arg("cross_value"), pybind11::arg("source_mask"),
           pybind11::arg("need_weights"), pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("greedy", &Runtime::greedy, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("beam", &Runtime::beam, pybind11::call_guard<pybind11::gil_scoped_release>());
}
