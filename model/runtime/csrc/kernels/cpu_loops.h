// fp32 loops for the small operations of a step, compiled for several CPU levels in one build.
#pragma once

#include "../common.h"

namespace {

// ---- fp32 CPU loops for the small operations of a step ------------------------------------------------------
// At a few rows per step each of these is a few thousand multiply-adds, where an ATen call's dispatch and
// allocation would cost more than the arithmetic; elsewhere (another device or dtype) the ATen ops below run.
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

}  // namespace
