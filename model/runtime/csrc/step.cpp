// The decoding runtime's step: every decoder layer, the output projection and the fast modes' rescoring of the
// best candidates, for one new position per row, in one call from Python. The arithmetic is model/transformer.py's
// DecoderLayer.step (the reference it is tested against), on ATen ops, so it runs on any device ATen does; only the
// int8 kernels (fbgemm's dynamic quantized linear) are CPU-only.
#include <torch/extension.h>
#include <ATen/native/quantized/PackedParams.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <chrono>
#include <string>
#include <vector>

namespace {

using at::Tensor;
using Packed = c10::intrusive_ptr<LinearPackedParamsBase>;

// How one matmul multiplies: the candidates the runtime times on the real weights when a model loads.
enum Kernel : int64_t { kLinear = 0, kTransposed = 1, kInt8 = 2 };

const char* kernel_name(int64_t kernel) {
  switch (kernel) {
    case kLinear: return "linear";
    case kTransposed: return "transposed";
    case kInt8: return "int8";
  }
  return "?";
}

struct Linear {
  Tensor weight;      // (out, in): at::linear
  Tensor transposed;  // (in, out) contiguous: at::addmm, made when a kernel needs it
  Tensor bias;        // (out,) or undefined
  Packed int8;        // per-channel int8 weight prepacked by fbgemm (no bias: added after the per-row scale)
  bool reduce_range = false;
  int64_t small = kLinear;  // the kernel for a step of at most `rows_cut` rows
  int64_t large = kLinear;  // and above it
  int64_t rows_cut = 8;

  Tensor run(const Tensor& x, int64_t kernel) const {  // x (N, in) → (N, out)
    switch (kernel) {
      case kTransposed:
        return bias.defined() ? at::addmm(bias, x, transposed) : at::mm(x, transposed);
      case kInt8: {
        // Each row divided by its largest magnitude before fbgemm quantizes the call's activations to 8 bits:
        // a row's quantization step is then a fraction of its own range whatever else shares the batch.
        Tensor scale = x.abs().amax({-1}, true).clamp_min_(std::numeric_limits<float>::min());
        Tensor out = int8->apply_dynamic(x / scale, reduce_range);
        return bias.defined() ? at::addcmul(bias, out, scale) : out.mul_(scale);
      }
      default:
        return at::linear(x, weight, bias.defined() ? c10::optional<Tensor>(bias) : c10::nullopt);
    }
  }
  Tensor operator()(const Tensor& x) const { return run(x, x.size(0) <= rows_cut ? small : large); }
};

struct Layer {
  Linear qkv, self_out, cross_q, cross_out, fc1, fc2;
  Tensor norm1_w, norm1_b, norm2_w, norm2_b, norm3_w, norm3_b;
};

enum Activation : int64_t { kSilu = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3 };

Tensor activate(const Tensor& x, int64_t activation) {
  switch (activation) {
    case kRelu: return at::relu(x);
    case kGelu: return at::gelu(x);
    case kGeluTanh: return at::gelu(x, "tanh");
  }
  return at::silu(x);
}

// softmax(q Kᵀ/√d_k + mask) V for one query per row: q (N, h·d_k); key/value (N, h, t, d_k) whose first two
// dimensions merge (a slice of a cache); mask additive (N, 1, 1, t) or undefined. Returns the heads' contexts side
// by side (N, h·d_k) and the weights (N·h, 1, t).
std::pair<Tensor, Tensor> attend(const Tensor& q, const Tensor& key, const Tensor& value, const Tensor& mask,
                                 int64_t heads) {
  const int64_t rows = key.size(0), length = key.size(2), d_k = key.size(3);
  Tensor scores = at::bmm(q.reshape({rows * heads, 1, d_k}), key.view({rows * heads, length, d_k}).transpose(1, 2));
  scores.mul_(1.0 / std::sqrt(static_cast<double>(d_k)));
  if (mask.defined()) scores.view({rows, heads, 1, length}).add_(mask);
  Tensor weights = scores.softmax(-1);
  Tensor context = at::bmm(weights, value.view({rows * heads, length, d_k}));
  return {context.view({rows, heads * d_k}), weights};
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Runtime {
 public:
  Runtime(Tensor embed, Tensor positions, double embed_scale, int64_t heads, int64_t activation, double eps)
      : embed_(std::move(embed)), positions_(std::move(positions)), embed_scale_(embed_scale), heads_(heads),
        activation_(activation), eps_(eps) {}

  // One decoder layer's weights as transformers names them; `int8` holds prepacked per-channel weights for the
  // six matmuls (qkv, self out, cross q, cross out, fc1, fc2) or is empty.
  void add_layer(std::vector<Tensor> weights, std::vector<Tensor> biases, std::vector<Tensor> norms,
                 std::vector<Packed> int8, bool reduce_range) {
    Layer layer;
    Linear* parts[6] = {&layer.qkv, &layer.self_out, &layer.cross_q, &layer.cross_out, &layer.fc1, &layer.fc2};
    for (int i = 0; i < 6; ++i) {
      parts[i]->weight = weights[i];
      parts[i]->bias = biases[i];
      parts[i]->reduce_range = reduce_range;
      if (!int8.empty()) parts[i]->int8 = int8[i];
    }
    layer.norm1_w = norms[0]; layer.norm1_b = norms[1];
    layer.norm2_w = norms[2]; layer.norm2_b = norms[3];
    layer.norm3_w = norms[4]; layer.norm3_b = norms[5];
    layers_.push_back(std::move(layer));
  }

  // The output projection (V, d) with final_logits_bias; `int8` (optional) its prepacked copy, whose logits are
  // then corrected: each row's `rescore` best candidates recomputed from the fp32 weight.
  void set_output(Tensor weight, Tensor bias, std::vector<Packed> int8, bool reduce_range, int64_t rescore) {
    output_.weight = weight;
    output_.bias = bias;
    output_.reduce_range = reduce_range;
    if (!int8.empty()) output_.int8 = int8[0];
    rescore_ = rescore;
  }

  std::vector<Linear*> matmuls() {
    std::vector<Linear*> all;
    for (auto& l : layers_) {
      for (Linear* p : {&l.qkv, &l.self_out, &l.cross_q, &l.cross_out, &l.fc1, &l.fc2}) all.push_back(p);
    }
    all.push_back(&output_);
    return all;
  }

  // Time every allowed kernel of every matmul at `small_rows` and `large_rows` rows on the real weights (the
  // fastest of `repeats` interleaved runs each) and keep the fastest per matmul and row range. Returns, per
  // matmul, [small kernel, large kernel] and the microseconds of every candidate.
  std::vector<std::vector<double>> choose(std::vector<int64_t> allowed, int64_t small_rows, int64_t large_rows,
                                          int64_t repeats) {
    std::vector<std::vector<double>> report;
    at::NoGradGuard no_grad;
    for (Linear* p : matmuls()) {
      std::vector<int64_t> candidates;
      for (int64_t kernel : allowed) {
        if (kernel == kInt8 && !p->int8) continue;
        if (kernel == kTransposed && !p->transposed.defined()) p->transposed = p->weight.t().contiguous();
        candidates.push_back(kernel);
      }
      std::vector<double> row{0, 0};
      int64_t rows_list[2] = {small_rows, large_rows};
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
        size_t pick = std::min_element(best.begin(), best.end()) - best.begin();
        (which == 0 ? p->small : p->large) = candidates[pick];
        row[which] = static_cast<double>(candidates[pick]);
        for (size_t c = 0; c < candidates.size(); ++c) {
          row.push_back(static_cast<double>(candidates[c]));
          row.push_back(best[c] * 1e6);
        }
      }
      p->rows_cut = small_rows + (large_rows - small_rows) / 2;
      bool keeps_transposed = p->small == kTransposed || p->large == kTransposed;
      if (!keeps_transposed) p->transposed = Tensor();  // no second copy of a weight nothing multiplies by
      report.push_back(row);
    }
    return report;
  }

  // Set every matmul's kernel directly (tests and the eager comparison): the same kernel for all rows.
  void force(int64_t kernel) {
    for (Linear* p : matmuls()) {
      int64_t k = (kernel == kInt8 && !p->int8) ? kLinear : kernel;
      if (k == kTransposed && !p->transposed.defined()) p->transposed = p->weight.t().contiguous();
      p->small = p->large = k;
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
  std::pair<Tensor, std::vector<Tensor>> step(const Tensor& ids, int64_t level, const Tensor& positions,
                                              const std::vector<Tensor>& self_key,
                                              const std::vector<Tensor>& self_value, int64_t width,
                                              const c10::optional<Tensor>& self_mask,
                                              const std::vector<Tensor>& cross_key,
                                              const std::vector<Tensor>& cross_value,
                                              const c10::optional<Tensor>& source_mask, bool need_weights) {
    at::InferenceMode guard;
    const int64_t rows = ids.size(0), d_model = embed_.size(1), d_k = d_model / heads_;
    Tensor position = level >= 0 ? positions_[level] : positions_.index_select(0, positions);
    Tensor x = at::embedding(embed_, ids).mul_(embed_scale_).add_(position);  // (N, d)
    Tensor own_mask = self_mask.has_value() ? *self_mask : Tensor();
    Tensor cross_mask = source_mask.has_value() ? *source_mask : Tensor();
    Tensor row_index = level >= 0 ? Tensor() : at::arange(rows, ids.options());
    std::vector<Tensor> cross_weights;
    const std::vector<int64_t> norm_shape{d_model};
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      Tensor qkv = layer.qkv(x).view({rows, 3, heads_, d_k});  // (N, 3, h, d_k)
      Tensor query = qkv.select(1, 0), key = qkv.select(1, 1), value = qkv.select(1, 2);  // (N, h, d_k)
      if (level >= 0) {
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
      Tensor context = attend(query, keys, values, own_mask, heads_).first;
      x = at::layer_norm(x + layer.self_out(context), norm_shape, layer.norm1_w, layer.norm1_b, eps_);
      auto [cross_context, weights] = attend(layer.cross_q(x), cross_key[i], cross_value[i], cross_mask, heads_);
      if (need_weights) cross_weights.push_back(weights.view({rows, heads_, -1}));
      x = at::layer_norm(x + layer.cross_out(cross_context), norm_shape, layer.norm2_w, layer.norm2_b, eps_);
      Tensor hidden = activate(layer.fc1(x), activation_);
      x = at::layer_norm(x + layer.fc2(hidden), norm_shape, layer.norm3_w, layer.norm3_b, eps_);
    }
    return {logits(x), cross_weights};
  }

  // Output projection + final_logits_bias; under int8 each row's `rescore_` best candidates recomputed exactly.
  Tensor logits(const Tensor& x) const {
    int64_t kernel = x.size(0) <= output_.rows_cut ? output_.small : output_.large;
    Tensor out = output_.run(x, kernel);
    if (kernel != kInt8 || rescore_ <= 0) return out;
    Tensor candidates = std::get<1>(at::topk(out, std::min<int64_t>(rescore_, out.size(1)), -1, true, false));
    Tensor exact = at::bmm(output_.weight.index_select(0, candidates.reshape(-1)).view({x.size(0), -1, x.size(1)}),
                           x.unsqueeze(-1)).squeeze(-1);
    return out.scatter_(-1, candidates, exact + output_.bias.index_select(0, candidates.reshape(-1)).view_as(exact));
  }

 private:
  Tensor embed_, positions_;
  double embed_scale_;
  int64_t heads_, activation_;
  double eps_;
  std::vector<Layer> layers_;
  Linear output_;
  int64_t rescore_ = 0;
};

}  // namespace

// Prepack an int8 per-channel quantized weight (a quantized tensor made in Python) for fbgemm's dynamic linear.
Packed prepack(const Tensor& quantized) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("quantized::linear_prepack", "")
                       .typed<Packed(Tensor, std::optional<Tensor>)>();
  return op.call(quantized, std::nullopt);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<LinearPackedParamsBase, Packed>(m, "Int8Weight");
  m.def("prepack", &prepack);
  pybind11::class_<Runtime>(m, "Runtime")
      .def(pybind11::init<Tensor, Tensor, double, int64_t, int64_t, double>())
      .def("add_layer", &Runtime::add_layer)
      .def("set_output", &Runtime::set_output)
      .def("choose", &Runtime::choose)
      .def("force", &Runtime::force)
      .def("kernels", &Runtime::kernels)
      .def("step", &Runtime::step, pybind11::call_guard<pybind11::gil_scoped_release>());
}
