// One matmul of the model and the kernels it may run on (chosen by Runtime::choose).
#pragma once

#include "kernels/onednn.h"
#include "kernels/cpu_loops.h"
#include "kernels/avx2_int8.h"

namespace {

struct Linear {
  Tensor weight;      // (out, in): at::linear
  Tensor transposed;  // (in, out) contiguous: at::addmm, made when a kernel needs it
  Tensor onednn;      // oneDNN's blocked copy, made when a kernel needs it
  Tensor bias;        // (out,) or undefined
  Packed int8;        // per-channel int8 weight prepacked by fbgemm (no bias: added after the per-row scale)
  VnniWeight tiled;   // the same int8 weight laid out for the int8 tiles, on CPUs that have them
  int tiles = kTilesNone;  // which tiles multiply by `tiled` (an Int8Tiles)
  bool reduce_range = false;
  int64_t small = kLinear;  // the kernel for a step of at most `rows_cut` rows
  int64_t large = kLinear;  // and above it
  int64_t rows_cut = 8;

  // The int8 copy fbgemm multiplies by, and on a CPU with AVX2 or VNNI the same integers laid out for the int8
  // tiles (`with`: which tiles; by default this CPU's at the level in force).
  void attach_int8(const Packed& packed, int with = int8_tiles()) {
    int8 = packed;
    tiles = with;
    if (tiles != kTilesNone) {
      const Tensor q = std::get<0>(packed->unpack());
      tiled = vnni_weight(q.int_repr(), q.q_per_channel_scales().to(at::kFloat));
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
      case kTiles:
        if (tiled && plain_cpu(x) && x.is_contiguous()) return tile_linear(x, tiled, bias, silu, tiles);
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

}  // namespace
