// Scaled dot-product attention over a cache: one query per row, fp32 loops on the CPU.
#pragma once

#include "kernels/cpu_loops.h"

namespace {

// One query's attention over `length` positions: w = softmax(q·k_j · scale + mask_j), out = Σ_j w_j v_j. Each q·k
// sum and each Σ_j stays one chain of multiply-adds in index order, as the reference sums them (in vector lanes
// they move log-probabilities past the 1e-5 the runtime keeps to it). Several chains run side by side instead,
// which leaves each result the same to the bit: eight keys' q·k as scalars and 64 output columns of Σ_j w_j v_j in
// four vectors. `lanes` (the int8 mode, which keeps no bit to the reference): each q·k summed in vector lanes,
// four keys at a time.
constexpr int64_t kKeys = 8;

#define ISA_VARIANTS_OF "attend_one.inc"
#include "kernels/isa_variants.h"
#undef ISA_VARIANTS_OF

inline void attend_one(const float* query, const float* k, int64_t k_pos, const float* v, int64_t v_pos,
                       const float* mask, int64_t m_pos, int64_t length, int64_t d_k, float scale, float* w,
                       float* out, bool lanes) {
  CPU_ISA_DISPATCH(attend_one)(query, k, k_pos, v, v_pos, mask, m_pos, length, d_k, scale, w, out, lanes);
}

// softmax(q Kᵀ/√d_k + mask) V for one query per row: q (N, h·d_k), key/value (N, h, t, d_k); `kv_rows`: the row
// each query reads, `lengths`: how many positions (so a row never depends on the others' lengths). Returns the
// contexts (N, h·d_k) and weights (N·h, 1, t).
std::pair<Tensor, Tensor> attend_cpu(const Tensor& q, const Tensor& key, const Tensor& value, const Tensor& mask,
                                     int64_t heads, const Tensor& kv_rows, bool lanes, const Tensor& lengths) {
  const int64_t rows = q.size(0), length = key.size(2), d_k = key.size(3);
  const Tensor at_rows = kv_rows.defined() ? kv_rows.contiguous() : Tensor();
  const int64_t* row_of = at_rows.defined() ? at_rows.data_ptr<int64_t>() : nullptr;
  const Tensor own_lengths = lengths.defined() ? lengths.contiguous() : Tensor();
  const int64_t* reads = own_lengths.defined() ? own_lengths.data_ptr<int64_t>() : nullptr;
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
      const int64_t own = reads ? reads[r] : length;
      float* w = ws + index * length;
      attend_one(qs + r * q_row + h * d_k, ks + kv * k_row + h * k_head, k_pos, vs + kv * v_row + h * v_head, v_pos,
                 ms ? ms + kv * m_row : nullptr, m_pos, own, d_k, scale, w, cs + r * heads * d_k + h * d_k, lanes);
      for (int64_t j = own; j < length; ++j) w[j] = 0.0f;
    }
  });
  return {context, weights};
}

std::pair<Tensor, Tensor> attend(const Tensor& q, const Tensor& key, const Tensor& value, const Tensor& mask,
                                 int64_t heads, const Tensor& kv_rows = Tensor(), bool lanes = false,
                                 const Tensor& lengths = Tensor()) {
  const int64_t head_width = key.size(3);
  TORCH_CHECK(plain_cpu(q) && plain_cpu(key) && plain_cpu(value) && key.stride(3) == 1 && value.stride(3) == 1 &&
                  q.stride(-1) == 1 && (q.dim() == 2 || q.stride(1) == head_width) &&
                  (!mask.defined() || plain_cpu(mask)) && (!kv_rows.defined() || kv_rows.is_cpu()),
              "attention runs over float32 CPU tensors, each head's vectors contiguous");
  return attend_cpu(q, key, value, mask, heads, kv_rows, lanes, lengths);
}

}  // namespace
