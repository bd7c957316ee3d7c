// The layers' arithmetic over the model's weights (model.h): the encoder, the cross-attention keys and values, one
// decoder step for rows each at its own position in a cache, the output projection (under int8 its best candidates
// rescored) and the beam's candidates, all on the CPU. The search over these steps is decoding.h's.
#pragma once

#include "attention.h"
#include "model.h"
#include "search.h"

namespace {

class CompiledLoop;

class Runtime : public Model {
 public:
  using Model::Model;

  // The encoder (model.transformer.Transformer.encode) over right-padded ids (B, S) and their mask (B, S), True at
  // real tokens: hidden states (B, S, d_model).
  Tensor encode(const Tensor& ids, const Tensor& mask) {
    at::InferenceMode guard;
    TORCH_CHECK(ids.is_cpu() && mask.is_cpu(), "the compiled step runs on the CPU");
    const int64_t batch = ids.size(0), length = ids.size(1), d = encoder_embed_.size(1), d_k = d / heads_;
    Tensor additive = at::zeros({batch, 1, 1, length}, encoder_embed_.options())
                          .masked_fill_(mask.logical_not().view({batch, 1, 1, length}),
                                        std::numeric_limits<float>::lowest());
    // Only the real tokens' rows are computed (padding is 40 % of a 16-text batch) and each query attends over its
    // own text; padding positions come back as zeros, which nothing reads.
    const Tensor flat = mask.reshape({-1});
    const bool padded = flat.sum().item<int64_t>() < batch * length;
    const Tensor real = padded ? flat.nonzero().squeeze(1) : Tensor();  // (N,) positions in B·S order
    Tensor x, text_of;
    if (padded) {
      x = at::embedding(encoder_embed_, ids.reshape({-1}).index_select(0, real)).mul_(embed_scale_);
      x.add_(positions_.index_select(0, real.remainder(length)));
      text_of = real.div(length, "floor");
    } else {
      x = at::embedding(encoder_embed_, ids.reshape({-1})).mul_(embed_scale_).view({batch, length, d});
      x = (x + positions_.narrow(0, 0, length)).view({batch * length, d});
      text_of = at::arange(batch, ids.options().dtype(at::kLong)).repeat_interleave(length);
    }
    Tensor key_values = padded ? at::zeros({batch * length, 2 * d}, x.options()) : Tensor();
    for (const EncoderLayer& layer : encoder_) {
      Tensor qkv = layer.qkv(x);  // (N, 3d)
      Tensor parts = padded ? key_values.index_copy_(0, real, qkv.narrow(1, d, 2 * d)).view({batch, length, 2, heads_, d_k})
                            : qkv.view({batch, length, 3, heads_, d_k}).narrow(2, 1, 2);
      Tensor context = attend(qkv.narrow(1, 0, d), parts.select(2, 0).permute({0, 2, 1, 3}),
                              parts.select(2, 1).permute({0, 2, 1, 3}), additive, heads_, text_of, lanes_).first;
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

  // One decoder step for N rows, each at its own position, over the decode loop's per-layer caches (R, h,
  // capacity, d_k): the last layer's states (N, d_model) and, when asked, each layer's cross-attention (N, h, S).
  // Row r attends to its first self_lengths[r] positions and to source slot cross_rows[r]'s first cross_lengths[r].
  std::pair<Tensor, std::vector<Tensor>> layers(const Tensor& ids, const Tensor& positions,
                                                const std::vector<Tensor>& self_key,
                                                const std::vector<Tensor>& self_value, int64_t width,
                                                const std::vector<Tensor>& cross_key,
                                                const std::vector<Tensor>& cross_value, bool need_weights,
                                                const Tensor& cross_rows, const Tensor& self_lengths,
                                                const Tensor& cross_lengths) const {
    const int64_t rows = ids.size(0), d_k = embed_.size(1) / heads_;
    Tensor x = embed(ids, positions);  // (N, d)
    std::vector<Tensor> cross_weights;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      Tensor qkv = layer.qkv(x).view({rows, 3, heads_, d_k});  // (N, 3, h, d_k)
      write_cache(self_key[i], qkv.select(1, 1), positions);
      write_cache(self_value[i], qkv.select(1, 2), positions);
      Tensor keys = self_key[i].narrow(0, 0, rows).narrow(2, 0, width);
      Tensor values = self_value[i].narrow(0, 0, rows).narrow(2, 0, width);
      Tensor context = attend(qkv.select(1, 0), keys, values, Tensor(), heads_, Tensor(), lanes_, self_lengths).first;
      x = add_norm(x, layer.self_out(context), layer.norm1_w, layer.norm1_b, eps_);
      auto [cross_context, weights] = attend(layer.cross_q(x), cross_key[i], cross_value[i], Tensor(), heads_,
                                             cross_rows, lanes_, cross_lengths);
      if (need_weights) cross_weights.push_back(weights.view({rows, heads_, -1}));
      x = add_norm(x, layer.cross_out(cross_context), layer.norm2_w, layer.norm2_b, eps_);
      Tensor hidden = layer.fc1(x, activation_);
      x = add_norm(x, layer.fc2(hidden), layer.norm3_w, layer.norm3_b, eps_);
    }
    return {x, cross_weights};
  }

  // Token embedding × scale + the position's sinusoid, each row at its own `positions[r]`.
  Tensor embed(const Tensor& ids, const Tensor& positions) const {
    const int64_t rows = ids.size(0), d = embed_.size(1);
    Tensor x = at::empty({rows, d}, embed_.options());
    const int64_t *id = ids.data_ptr<int64_t>(), *at = positions.data_ptr<int64_t>();
    const float *table = embed_.data_ptr<float>(), *sinusoids = positions_.data_ptr<float>();
    float* out = x.data_ptr<float>();
    const float scale = static_cast<float>(embed_scale_);
    for (int64_t r = 0; r < rows; ++r) {
      const float *e = table + id[r] * d, *p = sinusoids + at[r] * d;
      for (int64_t c = 0; c < d; ++c) out[r * d + c] = e[c] * scale + p[c];
    }
    return x;
  }

  // K or V of this step (N, h, d_k) written into a cache buffer (R, h, capacity, d_k) at each row's position.
  static void write_cache(const Tensor& buffer, const Tensor& rows_kv, const Tensor& positions) {
    const int64_t rows = rows_kv.size(0), heads = rows_kv.size(1), d_k = rows_kv.size(2);
    const int64_t capacity = buffer.size(2);
    const int64_t* at = positions.data_ptr<int64_t>();
    const float* in = rows_kv.data_ptr<float>();
    float* out = buffer.data_ptr<float>();
    const int64_t s_row = rows_kv.stride(0), s_head = rows_kv.stride(1);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(out + ((r * heads + h) * capacity + at[r]) * d_k, in + r * s_row + h * s_head, sizeof(float) * d_k);
  }

  // Output projection + final_logits_bias; under int8 each row's `rescore_` best candidates recomputed exactly.
  Tensor logits(const Tensor& x) const {
    const int64_t kernel = x.size(0) <= output_.rows_cut ? output_.small : output_.large;
    Tensor out = output_.run(x, kernel).contiguous();
    if (!quantized(kernel) || rescore_ <= 0) return out;
    const Tensor state = x.contiguous();
    const int64_t rows = x.size(0), d = x.size(1), width = out.size(1), count = std::min(rescore_, width);
    std::vector<float> v(count);
    std::vector<int64_t> column(count);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = out.data_ptr<float>() + r * width;
      top_of_row(row, width, count, v.data(), column.data());
      rescore(row, state.data_ptr<float>() + r * d, column.data(), count, v.data());
    }
    return out;
  }

  // The int8 logits of a row's `count` columns recomputed from the fp32 weight, in the row and in `values`.
  void rescore(float* row, const float* state, const int64_t* columns, int64_t count, float* values) const {
    const int64_t d = output_.weight.size(1);
    const float *w = output_.weight.data_ptr<float>(), *b = output_.bias.data_ptr<float>();
    for (int64_t j = 0; j < count; ++j) {
      values[j] = dot_loop(w + columns[j] * d, state, d) + b[columns[j]];
      row[columns[j]] = values[j];
    }
  }

  // Each row's m candidates (search.h's row_candidates) for the last layer's states x (N, d_model), without the
  // (N, V) log-probabilities: one pass picks a row's largest logits (under int8 the `rescore_` best recomputed from
  // the fp32 weight), one more sums e^(logit - max), and only the picked ones get a log-probability. `wanted`:
  // `wanted_width` tokens a row (-1: none) whose log-probabilities (exact under int8) come back beside, (N, width).
  std::tuple<Tensor, Tensor, std::vector<float>> candidates(const Tensor& x, int64_t m, const std::vector<char>& banned,
                                                            const std::vector<char>& ending, int64_t eos, int64_t pad,
                                                            const std::vector<int64_t>& wanted = {},
                                                            int64_t wanted_width = 0) const {
    const int64_t rows = x.size(0), d = x.size(1);
    const int64_t kernel = rows <= output_.rows_cut ? output_.small : output_.large;
    // (N, V) logits, int8 ones not yet rescored; from the int8 tiles with each row's 64-column maxima beside
    const bool tiles = kernel == kTiles && output_.tiled && x.is_contiguous();
    std::vector<float> block_maxes(tiles ? rows * ((output_.tiled.out + kBlock - 1) / kBlock) : 0);
    Tensor out = tiles ? tile_linear(x, output_.tiled, output_.bias, false, output_.tiles, block_maxes.data())
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
    std::vector<float> v(pool), wanted_lp(rows * wanted_width, -std::numeric_limits<float>::infinity());
    std::vector<int64_t> column(pool);
    for (int64_t r = 0; r < rows; ++r) {
      if (ending[r]) {
        row_candidates(nullptr, nullptr, 0, 0.0f, 0.0f, m, false, true, eos, pad, value_out + r * m, token_out + r * m);
        continue;
      }
      float* row = logits + r * width;
      top_of_row(row, width, pool, v.data(), column.data(),
                 tiles ? block_maxes.data() + r * ((width + kBlock - 1) / kBlock) : nullptr);
      rescore(row, states + r * d, column.data(), rescored, v.data());
      // every logit outside the pool is at most the pool's smallest, so the pool holds the row's largest
      const float top = *std::max_element(v.begin(), v.end());
      const float log_sum = std::log(sum_exp_loop(row, width, top));
      row_candidates(v.data(), column.data(), pool, top, log_sum, m, banned[r], false, eos, pad, value_out + r * m,
                     token_out + r * m);
      for (int64_t j = 0; j < wanted_width; ++j) {
        const int64_t token = wanted[r * wanted_width + j];
        if (token < 0) continue;
        const float logit = rescored > 0 ? dot_loop(w + token * d, states + r * d, d) + b[token] : row[token];
        wanted_lp[r * wanted_width + j] = (logit - top) - log_sum;
      }
    }
    return {values, tokens, wanted_lp};
  }

 private:
  friend class CompiledLoop;  // decoding.h's decode loop: the layers, the candidates and the workspace

  std::unique_ptr<Workspace> workspace_ = std::make_unique<Workspace>();
};

}  // namespace
