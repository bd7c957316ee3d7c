// fp32 loops for the small operations of a step, compiled for several CPU levels in one build.
#pragma once

#include "../common.h"

namespace {

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

#define ISA_VARIANTS_OF "cpu_loops.inc"
#include "isa_variants.h"
#undef ISA_VARIANTS_OF

// ---- fp32 CPU loops for the small operations of a step ------------------------------------------------------
// At a few rows per step each of these is a few thousand multiply-adds, where an ATen call's dispatch and
// allocation would cost more than the arithmetic; elsewhere (another device or dtype) the ATen ops below run.
inline void divide_rows_loop(const float* in, float* out, float* scales, int64_t rows, int64_t cols) {
  CPU_ISA_DISPATCH(divide_rows_loop)(in, out, scales, rows, cols);
}

void divide_rows(const Tensor& x, Tensor& y, Tensor& scale) {
  divide_rows_loop(x.data_ptr<float>(), y.data_ptr<float>(), scale.data_ptr<float>(), x.size(0), x.size(1));
}

// y = y * scale[row] (+ bias): the per-row scale put back after the int8 matmul.
inline void scale_rows_loop(float* out, const float* scales, const float* b, int64_t rows, int64_t cols) {
  CPU_ISA_DISPATCH(scale_rows_loop)(out, scales, b, rows, cols);
}

void scale_rows(Tensor& y, const Tensor& scale, const Tensor& bias) {
  scale_rows_loop(y.data_ptr<float>(), scale.data_ptr<float>(), bias.defined() ? bias.data_ptr<float>() : nullptr,
                  y.size(0), y.size(1));
}

// Σ a[i]·b[i] in vector lanes.
inline float dot_loop(const float* a, const float* b, int64_t n) {
  return CPU_ISA_DISPATCH(dot_loop)(a, b, n);
}


Tensor activate(const Tensor& x, int64_t activation) {
  switch (activation) {
    case kRelu: return at::relu(x);
    case kGelu: return at::gelu(x);
    case kGeluTanh: return at::gelu(x, "tanh");
  }
  return at::silu(x);
}


// y = silu(b + y · scale[row]): the int8 matmul's per-row scale, the bias and SiLU (x / (1 + e^-x)) in one pass
// over its output instead of three; e^-x by EXP_IN_LANES, its argument held to [-87, 88] where float's exponent
// ends. The int8 mode only (the fp32 kernels keep at::silu, exact).
inline void scale_rows_silu_loop(float* out, const float* scales, const float* b, int64_t rows, int64_t cols) {
  CPU_ISA_DISPATCH(scale_rows_silu_loop)(out, scales, b, rows, cols);
}


// Σ e^(x[i] - shift) over a row whose largest value is `shift`: a log-softmax's denominator, in one read (e^y by
// EXP_IN_LANES; below e^-87, 1.6e-38, it counts as that, which a sum with e^0 in it cannot see).
inline float sum_exp_loop(const float* x, int64_t n, float shift) {
  return CPU_ISA_DISPATCH(sum_exp_loop)(x, n, shift);
}

// Each block's largest value: maxes[b] = max(x[b·block … b·block + block - 1]), the last block possibly shorter.
inline void block_max_loop(const float* x, int64_t n, int64_t block, float* maxes) {
  CPU_ISA_DISPATCH(block_max_loop)(x, n, block, maxes);
}

// The m largest values of a row and their columns, largest first and of equal values the lower column first (as
// at::topk orders them). One vectorised pass takes each block of 64's largest value; the m-th largest of those is
// a floor for the row's m-th largest value (m blocks reach it), so only the values at or above it, in the blocks
// that reach it, are gathered and sorted.
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

// at::topk(scores, m, 1) of a (rows, width) matrix; a float CPU one row by row through top_of_row.
std::tuple<Tensor, Tensor> row_topk(const Tensor& scores, int64_t m) {
  if (!plain_cpu(scores) || scores.dim() != 2 || scores.size(1) < m) return at::topk(scores, m, 1);
  const Tensor in = scores.contiguous();
  const int64_t rows = in.size(0), width = in.size(1);
  Tensor values = at::empty({rows, m}, in.options());
  Tensor columns = at::empty({rows, m}, in.options().dtype(at::kLong));
  for (int64_t r = 0; r < rows; ++r)
    top_of_row(in.data_ptr<float>() + r * width, width, m, values.data_ptr<float>() + r * m,
               columns.data_ptr<int64_t>() + r * m);
  return {values, columns};
}


inline void add_norm_loop(const float* xs, const float* ys, const float* ws, const float* bs, float* os, int64_t
                          rows, int64_t d, double eps) {
  CPU_ISA_DISPATCH(add_norm_loop)(xs, ys, ws, bs, os, rows, d, eps);
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

}  // namespace
