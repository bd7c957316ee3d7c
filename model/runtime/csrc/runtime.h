// The runtime: the model's weights as the kernels read them, the encoder, one decoder step over a cache,
// the output projection and the beam's candidates, and the kernel choice at load. The search loops are
// decoding.h's.
#pragma once

#include "attention.h"
#include "layers.h"

namespace {

class Loop;

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

  // `level` >= 0: every row at that position; -1: row r at positions[r] (the decode loop's rows).
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
                                                const Tensor& cross_rows = Tensor(),
                                                const Tensor& self_lengths = Tensor(),
                                                const Tensor& cross_lengths = Tensor()) const {
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
      Tensor context = attend(query, keys, values, own_mask, heads_, Tensor(), lanes_, self_lengths).first;
      x = add_norm(x, layer.self_out(context), layer.norm1_w, layer.norm1_b, eps_);
      auto [cross_context, weights] = attend(layer.cross_q(x), cross_key[i], cross_value[i], cross_mask, heads_,
                                             cross_rows, lanes_, cross_lengths);
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
  // its budget (`ending[r]`) gets eos at 0 and -inf after it, as next_logprobs forces; `banned[r]`: row r may not
  // end yet.
  std::tuple<Tensor, Tensor> candidates(const Tensor& x, int64_t m, const std::vector<char>& banned,
                                        const std::vector<char>& ending, int64_t eos, int64_t pad) const {
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
        if (column[j] == pad || (banned[r] && column[j] == eos)) {
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

 private:
  friend class Loop;  // decoding.h's decode loop: the layers, the candidates and the workspace

  // The m largest of each row of a float matrix and their columns, largest first (of equal values the lower
  // column first), in one pass per row keeping the m best so far: at a few rows of a vocabulary, at::topk's
  // fixed cost is most of its time.
  static std::tuple<Tensor, Tensor> few_rows_topk(const Tensor& scores, int64_t m);

  // model.topk.row_topk: the m largest of each wide row by way of chunk maxima (16 rows and more; fewer rows
  // one pass each).
  static std::tuple<Tensor, Tensor> row_topk(const Tensor& scores, int64_t m);

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
