// int8 matmuls in AVX-512 VNNI tiles, built for CPUs that have them.
#pragma once

#include "cpu_loops.h"

namespace {

// ---- int8 matmul on AVX-512 VNNI --------------------------------------------------------------------------------
// x Wᵀ (· scales) + b, W per-channel int8, x per row to 8 bits, vpdpbusd into int32 in register tiles of up to
// 4 rows × 64 columns, scales, bias and SiLU applied before the one store: one pass over x where fbgemm makes three.
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
  // the AVX-512 level in force (x86-64-v4: F, BW, CD, DQ, VL; common.h) and VNNI on top of it
  return cpu_isa() >= kIsaAvx512 && __builtin_cpu_supports("avx512vnni");
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

// A row's grid of `levels` steps over [lo, hi] (lo = min(x, 0), hi = max(x, 0); the values from `i` on not yet
// seen by the caller's vector lanes are taken in here): step s = (hi - lo) / levels and zero point z = round(-lo / s)
// into `step` and `zero` (0 and 0 for a row of zeros); returns 1 / s (0 for a row of zeros).
inline float row_grid(const float* row, int64_t i, int64_t in, float lo, float hi, int32_t levels, float* step,
                      int32_t* zero) {
  for (; i < in; ++i) {
    lo = std::min(lo, row[i]);
    hi = std::max(hi, row[i]);
  }
  const float range = hi - lo;
  const float inverse = range > 0.0f ? static_cast<float>(levels) / range : 0.0f;
  *zero = static_cast<int32_t>(std::nearbyint(-lo * inverse));
  *step = range > 0.0f ? range / static_cast<float>(levels) : 0.0f;
  return inverse;
}

// The codes of row[i..in) that the vector lanes left, then the padding to `width` (z: a zero).
inline void codes_tail(const float* row, int64_t i, int64_t in, int64_t width, float inverse, int32_t zero,
                       int32_t levels, uint8_t* target) {
  for (; i < in; ++i) {
    const int32_t q = static_cast<int32_t>(std::nearbyint(row[i] * inverse)) + zero;
    target[i] = static_cast<uint8_t>(std::min(levels, std::max(0, q)));
  }
  for (; i < width; ++i) target[i] = static_cast<uint8_t>(zero);
}

// What every tile of one call of the int8 tiles (VNNI or AVX2) reads and writes.
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

// Each row of x to u8 codes over its own range [min(x, 0), max(x, 0)]: x ≈ s (q - z), s and z per row in `steps`
// and `zeros`, padding to `groups` · 4 inputs at z. Not symmetric: after SiLU a row is nearly all positive.
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
    const float inverse = row_grid(row, i, in, _mm512_reduce_min_ps(low), _mm512_reduce_max_ps(high), 255,
                                   steps + r, zeros + r);
    const int32_t zero = zeros[r];
    const __m512 times = _mm512_set1_ps(inverse);
    const __m512i shift = _mm512_set1_epi32(zero), floor = _mm512_setzero_si512();
    for (i = 0; i + 16 <= in; i += 16) {
      const __m512i q = _mm512_max_epi32(
          _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + i), times)), shift), floor);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(target + i), _mm512_cvtusepi32_epi8(q));
    }
    codes_tail(row, i, in, width, inverse, zero, 255, target);
  }
}

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

// The VNNI tiles, as tile_panels calls them.
struct VnniTiles {
  static constexpr int kRows = 4;  // 4 rows × 64 columns: 16 zmm accumulators
  template <int R>
  static void rows(const TileCall& t, int64_t row, int64_t panel, int64_t blocks) {
    vnni_rows<R>(t, row, panel, blocks);
  }
};
#endif

// The last `left` (< Tiles::kRows) rows of a panel as one tile of that many rows.
template <typename Tiles, int N>
void last_rows(const TileCall& t, int64_t row, int64_t panel, int64_t blocks, int64_t left) {
  if constexpr (N > 0) {
    if (left == N) return Tiles::template rows<N>(t, row, panel, blocks);
    last_rows<Tiles, N - 1>(t, row, panel, blocks, left);
  }
}

// out = the quantized rows times W through `Tiles` (VnniTiles or Avx2Tiles): panels of 64 columns, each panel's
// weights (16 KB at 256 inputs) kept in L1 while every tile of Tiles::kRows rows passes over them.
template <typename Tiles>
void tile_panels(const TileCall& t, int64_t rows, int64_t blocks) {
  at::parallel_for(0, t.panels, 8, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t here = std::min<int64_t>(4, blocks - 4 * p);
      int64_t r = 0;
      for (; r + Tiles::kRows <= rows; r += Tiles::kRows) Tiles::template rows<Tiles::kRows>(t, r, p, here);
      last_rows<Tiles, Tiles::kRows - 1>(t, r, p, here, rows - r);
    }
  });
}

}  // namespace
