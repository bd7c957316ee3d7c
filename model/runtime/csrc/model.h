// The model as the runtime holds it: each matmul's weight in the forms its kernels read, and the kernel chosen at
// load on this CPU (the fastest of those whose rows do not depend on the rows beside them).
#pragma once

#include "layers.h"

namespace {

class Model {
 public:
  Model(Tensor embed, Tensor positions, double embed_scale, int64_t heads, int64_t activation, double eps)
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
  // `rows` - 1 rows against `rows`): oneDNN's and the int8 tiles' do; BLAS's small-matrix paths may not.
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
        if (kernel == kTiles && !p->tiled) continue;
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
      p->small = p->large = (quantized(kernel) && !p->int8) || (kernel == kTiles && !p->tiled) ? kLinear : kernel;
      prepare(*p);
    }
  }

  std::vector<std::string> kernels() {
    std::vector<std::string> names;
    for (Linear* p : matmuls()) names.push_back(std::string(kernel_name(p->small)) + "/" + kernel_name(p->large));
    return names;
  }

 protected:
  Tensor embed_, positions_, encoder_embed_;
  std::vector<EncoderLayer> encoder_;
  double embed_scale_;
  int64_t heads_, activation_;
  double eps_;
  std::vector<Layer> layers_;
  Linear output_;
  int64_t rescore_ = 0;
  bool lanes_ = false;
};

}  // namespace
