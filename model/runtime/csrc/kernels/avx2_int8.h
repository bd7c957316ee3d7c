// int8 matmuls in AVX2 tiles, for CPUs without AVX-512 VNNI, and the choice between these and the VNNI tiles.
#pragma once

#include "vnni.h"

namespace {

// ---- int8 matmul on AVX2 ----------------------------------------------------------------------------------------
// The VNNI tiles' arithmetic with `vpdpbusd` as `vpmaddubsw` then `vpmaddwd` by ones. Two products of 255 · 128
// overflow int16, so rows are quantized to 7 bits (as fbgemm's `reduce_range`): the int32 sums stay exact.
#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_AVX2_INT8_KERNEL 1
#define AVX2_TARGET __attribute__((target("avx2,fma")))
#else
#define HAVE_AVX2_INT8_KERNEL 0
#define AVX2_TARGET
#endif

// Which int8 tiles this process multiplies with: the VNNI tiles where the CPU (at the level in force) has them,
// else the AVX2 tiles on an AVX2 CPU, else none (fbgemm alone).
enum Int8Tiles : int { kTilesNone = 0, kTilesAvx2 = 1, kTilesVnni = 2 };

int int8_tiles() {
  if (cpu_has_vnni()) return kTilesVnni;
#if HAVE_AVX2_INT8_KERNEL
  if (cpu_isa() >= kIsaAvx2) return kTilesAvx2;
#endif
  return kTilesNone;
}

const char* int8_tiles_name(int tiles) { return tiles == kTilesVnni ? "vnni" : tiles == kTilesAvx2 ? "avx2" : ""; }

#if HAVE_AVX2_INT8_KERNEL
AVX2_TARGET inline float lanes_min(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_min_ss(m, _mm_movehdup_ps(m)));
}

AVX2_TARGET inline float lanes_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// e^y in 8 lanes for y in [-87, 88]: exp_lanes of kernels/vnni.h in AVX2.
AVX2_TARGET inline __m256 exp_lanes8(__m256 y) {
  const __m256 k = _mm256_sub_ps(_mm256_fmadd_ps(y, _mm256_set1_ps(kLog2E), _mm256_set1_ps(kRound)),
                                 _mm256_set1_ps(kRound));
  const __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(kLn2Low), _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2High), y));
  __m256 p = _mm256_set1_ps(kExp[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExp[i]));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

// 8 values' codes: round(x · times) + shift, held to 0..127.
AVX2_TARGET inline __m256i codes_of(const float* x, __m256 times, __m256i shift) {
  const __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), times)), shift);
  return _mm256_min_epi32(_mm256_max_epi32(q, _mm256_setzero_si256()), _mm256_set1_epi32(127));
}

// Each row of x to u8 codes 0..127 over its own range [lo, hi] (lo = min(x, 0), hi = max(x, 0)): quantize_rows_vnni
// with 127 steps in place of 255 (s = (hi - lo) / 127, z = round(-lo / s), q = round(x / s) + z); padding z.
AVX2_TARGET void quantize_rows_avx2(const float* x, int64_t rows, int64_t in, int64_t groups, uint8_t* a,
                                    float* steps, int32_t* zeros) {
  const int64_t width = groups * 4;
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * in;
    uint8_t* target = a + r * width;
    __m256 low = _mm256_setzero_ps(), high = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= in; i += 8) {
      const __m256 v = _mm256_loadu_ps(row + i);
      low = _mm256_min_ps(low, v);
      high = _mm256_max_ps(high, v);
    }
    const float inverse = row_grid(row, i, in, lanes_min(low), lanes_max(high), 127, steps + r, zeros + r);
    const int32_t zero = zeros[r];
    const __m256 times = _mm256_set1_ps(inverse);
    const __m256i shift = _mm256_set1_epi32(zero);
    for (i = 0; i + 32 <= in; i += 32) {  // 32 codes: int32 → int16 → u8 (in-lane packs), then lanes in order
      const __m256i low_half = _mm256_packs_epi32(codes_of(row + i, times, shift), codes_of(row + i + 8, times, shift));
      const __m256i high_half =
          _mm256_packs_epi32(codes_of(row + i + 16, times, shift), codes_of(row + i + 24, times, shift));
      const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(low_half, high_half), order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(target + i), bytes);
    }
    codes_tail(row, i, in, width, inverse, zero, 127, target);
  }
}

// R rows (at most 5) from `row` × the 16 columns of block `block` (two ymm halves of 8): Σ over the input in
// registers, then scale, bias, SiLU and a store of the columns that exist; `top` takes each row's largest value.
template <int R>
AVX2_TARGET inline void avx2_tile(const TileCall& t, int64_t row, int64_t block, __m256* top) {
  const int64_t groups = t.groups, a_stride = groups * 4, columns = t.columns;
  const uint8_t* a = t.a + row * a_stride;
  const int8_t* w = t.packed + block * groups * 64;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  for (int64_t g = 0; g < groups; ++g) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64 + 32));
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, a + r * a_stride + g * 4, 4);
      const __m256i x = _mm256_set1_epi32(four);
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(x, w0), ones));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(x, w1), ones));
    }
  }
  const __m256 minus_infinity = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {  // unrolled, so that every acc[r][h] index is a constant: acc lives in registers
    const int64_t c = 16 * block + 8 * h, count = std::min<int64_t>(8, columns - c);
    if (count <= 0) break;
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(count)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 scale = _mm256_loadu_ps(t.scales + c);  // scales and sums are padded to whole blocks
    const __m256i sum = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.sums + c));
    const __m256 add = t.bias ? _mm256_maskload_ps(t.bias + c, lanes) : _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256i real = _mm256_sub_epi32(acc[r][h], _mm256_mullo_epi32(sum, _mm256_set1_epi32(t.zeros[row + r])));
      const __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(real), _mm256_mul_ps(scale, _mm256_set1_ps(t.steps[row + r])),
                                       add);
      __m256 result = y;
      if (t.silu) {  // y / (1 + e^-y), e^-y's argument held to [-87, 88]
        const __m256 e = exp_lanes8(_mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), y),
                                                                _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f)));
        result = _mm256_div_ps(y, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
      }
      float* out = t.out + (row + r) * columns + c;
      if (count == 8) {
        _mm256_storeu_ps(out, result);
        top[r] = _mm256_max_ps(top[r], result);
      } else {
        _mm256_maskstore_ps(out, lanes, result);
        top[r] = _mm256_max_ps(top[r], _mm256_blendv_ps(minus_infinity, result, _mm256_castsi256_ps(lanes)));
      }
    }
  }
}

// R rows × the blocks of one 64-column panel, and each row's largest value of the panel where `maxes` is given.
template <int R>
AVX2_TARGET void avx2_panel(const TileCall& t, int64_t row, int64_t panel, int64_t blocks) {
  __m256 top[R];
  for (int r = 0; r < R; ++r) top[r] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t b = 0; b < blocks; ++b) avx2_tile<R>(t, row, 4 * panel + b, top);
  if (t.maxes)
    for (int r = 0; r < R; ++r) t.maxes[(row + r) * t.panels + panel] = lanes_max(top[r]);
}

// The AVX2 tiles, as tile_panels calls them.
struct Avx2Tiles {
  // 5 rows × 16 columns: 10 ymm accumulators, the two weight halves, the ones, a row's codes and a product fill 15
  // of the 16 registers; 6 rows need 17, and GCC spills an accumulator to the stack.
  static constexpr int kRows = 5;
  template <int R>
  static void rows(const TileCall& t, int64_t row, int64_t panel, int64_t blocks) {
    avx2_panel<R>(t, row, panel, blocks);
  }
};
#endif

// x (rows, in) contiguous fp32 → x Wᵀ + b (then SiLU if `silu`) through the int8 tiles `tiles` (an Int8Tiles the
// CPU has); `maxes` (when given, rows × ⌈out / 64⌉ floats): each row's largest output of every 64 columns, taken in
// the tiles' registers.
Tensor tile_linear(const Tensor& x, const VnniWeight& w, const Tensor& bias, bool silu, int tiles,
                   float* maxes = nullptr) {
  const int64_t rows = x.size(0);
  Tensor out = at::empty({rows, w.out}, x.options());
  Tensor a = at::empty({rows, w.groups * 4}, x.options().dtype(at::kByte));
  Tensor steps = at::empty({rows}, x.options());
  Tensor zeros = at::empty({rows}, x.options().dtype(at::kInt));
  const TileCall t{a.data_ptr<uint8_t>(), steps.data_ptr<float>(), zeros.data_ptr<int32_t>(),
                   w.packed.data_ptr<int8_t>(), w.scales.data_ptr<float>(), w.sums.data_ptr<int32_t>(),
                   bias.defined() ? bias.data_ptr<float>() : nullptr, silu, out.data_ptr<float>(), maxes,
                   w.groups, w.out, (w.blocks + 3) / 4};
  uint8_t* codes = a.data_ptr<uint8_t>();
  float* step = steps.data_ptr<float>();
  int32_t* zero = zeros.data_ptr<int32_t>();
#if HAVE_VNNI_KERNEL
  if (tiles == kTilesVnni) {
    quantize_rows_vnni(x.data_ptr<float>(), rows, w.in, w.groups, codes, step, zero);
    tile_panels<VnniTiles>(t, rows, w.blocks);
  }
#endif
#if HAVE_AVX2_INT8_KERNEL
  if (tiles == kTilesAvx2) {
    quantize_rows_avx2(x.data_ptr<float>(), rows, w.in, w.groups, codes, step, zero);
    tile_panels<Avx2Tiles>(t, rows, w.blocks);
  }
#endif
  return out;
}

}  // namespace
