// The search loops (model/search.py's _greedy and _beam on the CPU, line for line) and their cache.
#pragma once

#include "runtime.h"

namespace {

// The static search's cache (model.runtime.eager.DecoderCache): self-attention K/V preallocated per layer
// (rows, h, capacity, d_k) with spares that a reorder copies into, cross K/V computed once per source.
struct Runtime::Cache {
  std::vector<Tensor> self_key, self_value, spare_key, spare_value, cross_key, cross_value;
  std::shared_ptr<Tensor> workspace;  // the block the self-attention buffers lie in (CPU), while this cache lives
  Tensor source_mask;
  Tensor cross_rows;  // on the CPU: the row of cross_key, cross_value and source_mask each row reads
  int64_t length = 0;

  // out[r, :, :length] = in[index[r], :, :length] for buffers (R, h, capacity, d_k): one copy per row and head
  // of the positions written so far (index_select over the narrowed buffer walks them element by element).
  void copy_rows(const Tensor& in, Tensor& out, const Tensor& index) const {
    const int64_t heads = in.size(1), capacity = in.size(2), d_k = in.size(3), rows = index.numel();
    const Tensor picked = index.to(at::kLong).contiguous();
    const int64_t* from = picked.data_ptr<int64_t>();
    const float* source = in.data_ptr<float>();
    float* target = out.data_ptr<float>();
    const int64_t block = capacity * d_k;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(target + (r * heads + h) * block, source + (from[r] * heads + h) * block,
                    sizeof(float) * length * d_k);
  }

  // Rows `index` of every cache (the self-attention caches' rows `self_index` instead, where given).
  void reorder(const Tensor& index, bool same_sources, const Tensor& self_index = Tensor()) {
    const int64_t rows = index.numel();
    const Tensor& own = self_index.defined() ? self_index : index;
    for (auto* pair : {&self_key, &self_value}) {
      auto& spares = pair == &self_key ? spare_key : spare_value;
      for (size_t i = 0; i < pair->size(); ++i) {
        if (plain_cpu((*pair)[i]) && (*pair)[i].is_contiguous() && spares[i].is_contiguous() && own.is_cpu()) {
          copy_rows((*pair)[i], spares[i], own);
        } else {
          Tensor out = spares[i].narrow(0, 0, rows).narrow(2, 0, length);
          at::index_select_out(out, (*pair)[i].narrow(2, 0, length), 0, own);
        }
        std::swap((*pair)[i], spares[i]);
      }
    }
    if (same_sources && rows == (cross_rows.defined() ? cross_rows.numel() : cross_key[0].size(0))) return;
    if (cross_rows.defined()) {  // rows that left are no longer read: nothing of the sources' K/V is copied
      cross_rows = cross_rows.index_select(0, index);
      return;
    }
    for (auto& t : cross_key) t = t.index_select(0, index);
    for (auto& t : cross_value) t = t.index_select(0, index);
    if (source_mask.defined()) source_mask = source_mask.index_select(0, index);
  }
};

// capture: a Capture (every layer's and head's cross-attention per step (N, L, h, S), or one head's rows (N, S),
// capture_head < 0: the layer's head average).
Tensor Runtime::keep(const std::vector<Tensor>& cross, int64_t capture, int64_t layer, int64_t head) const {
  if (capture == kCaptureEveryHead) return at::stack(cross, 1);
  if (capture == kCaptureOneHead) return head < 0 ? cross[layer].mean(1) : cross[layer].select(1, head);
  return Tensor();
}

// Greedy search over cross K/V (per layer (B, h, S, d_k)) and `source_mask` ((B, 1, 1, S) additive or None):
// returns tokens (B, W), their log-probabilities (B, W), lengths (B,), and per step the captured attention and
// the inputs its rows belong to.
std::tuple<Tensor, Tensor, Tensor, std::vector<Tensor>, std::vector<std::vector<int64_t>>> Runtime::greedy(
    std::vector<Tensor> cross_key, std::vector<Tensor> cross_value, c10::optional<Tensor> source_mask,
    std::vector<int64_t> budgets, int64_t min_new_tokens, int64_t eos, int64_t pad, int64_t start,
    int64_t capture, int64_t capture_layer, int64_t capture_head) {
  at::InferenceMode guard;
  const int64_t batch = budgets.size();
  const int64_t width = *std::max_element(budgets.begin(), budgets.end());
  auto longs = cross_key[0].options().dtype(at::kLong);
  Cache cache = start_cache(cross_key, cross_value, source_mask, width);
  std::vector<int64_t> active(batch);
  for (int64_t i = 0; i < batch; ++i) active[i] = i;
  Tensor rows_of = at::arange(batch, longs);
  Tensor out_tokens = at::full({batch, width}, pad, longs);
  Tensor out_logprobs = at::zeros({batch, width}, cross_key[0].options());
  Tensor out_length = at::full({batch}, width, longs);
  Tensor alive = at::ones({batch}, longs.dtype(at::kBool));
  std::vector<Tensor> attention_steps;
  std::vector<std::vector<int64_t>> actives;
  Tensor last_tokens = at::full({batch}, start, longs);
  for (int64_t step = 0; step < width; ++step) {
    auto [logits, cross] = run_step(last_tokens, step, cache, capture != kCaptureNothing);
    std::vector<int64_t> ending;
    for (size_t row = 0; row < active.size(); ++row)
      if (budgets[active[row]] <= step + 1) ending.push_back(row);
    Tensor logprobs = next_logprobs(logits, step + 1 < min_new_tokens, ending, eos, pad);
    auto [best_logprob, best] = logprobs.max(-1);
    using at::indexing::TensorIndex;
    out_tokens.index_put_({rows_of, step}, best);
    out_logprobs.index_put_({rows_of, step}, best_logprob);
    Tensor ended = alive & best.eq(eos);
    out_length.index_put_({rows_of}, at::where(ended, at::scalar_tensor(step + 1, longs), out_length.index({rows_of})));
    alive = alive & ~ended;
    if (capture != kCaptureNothing) {
      attention_steps.push_back(keep(cross, capture, capture_layer, capture_head));
      actives.push_back(active);
    }
    last_tokens = best;
    std::vector<int64_t> kept;
    auto alive_flags = alive.accessor<bool, 1>();
    for (int64_t row = 0; row < alive.size(0); ++row)
      if (alive_flags[row]) kept.push_back(row);
    if (kept.empty()) break;
    if (kept.size() < active.size()) {
      Tensor rows = at::tensor(kept, longs);
      cache.reorder(rows, false);
      keep_rows({&last_tokens, &alive, &rows_of}, rows);
      active = picked(active, kept);
    }
  }
  return {out_tokens, out_logprobs, out_length, attention_steps, actives};
}

// Beam search of beam size k over cross K/V (and source mask) with one row per source, which its k rows share.
// Returns, per step, the records
// model.search.StepRecord holds (run_source_row, run_token, run_logprob, candidate_row, candidate_token,
// candidate_logprob, attention), and per input its final (finished, finished_done, finished_ref).
std::pair<std::vector<std::vector<Tensor>>, std::vector<std::vector<Tensor>>> Runtime::beam(
    std::vector<Tensor> cross_key, std::vector<Tensor> cross_value, c10::optional<Tensor> source_mask,
    std::vector<int64_t> budgets, int64_t k, double length_penalty, int64_t min_new_tokens, int64_t eos,
    int64_t pad, int64_t start, int64_t capture, int64_t capture_layer, int64_t capture_head) {
  at::InferenceMode guard;
  const int64_t batch = budgets.size();
  const int64_t width = *std::max_element(budgets.begin(), budgets.end());
  auto floats = cross_key[0].options();
  auto longs = floats.dtype(at::kLong);
  Cache cache = start_cache(cross_key, cross_value, source_mask, width, k);
  std::vector<int64_t> active(batch);
  for (int64_t i = 0; i < batch; ++i) active[i] = i;
  // The search state of each active input lives on the host, its k slots side by side: at a text's four rows a
  // step's bookkeeping is a few dozen numbers, where one ATen call per operation (about forty a step) and their
  // allocations cost more than the decoding step's own small operations (perf at B=1).
  const float neg = static_cast<float>(kNegInf);
  std::vector<float> running(batch * k, neg), finished(batch * k, neg);
  std::vector<char> finished_done(batch * k, 0), improvable(batch, 1), frozen(batch, 0);
  std::vector<int64_t> finished_ref(batch * k, -1);
  for (int64_t a = 0; a < batch; ++a) running[a * k] = 0.0f;
  Tensor last_tokens = at::full({batch * k}, start, longs);
  std::vector<std::vector<Tensor>> results(batch);
  std::vector<std::vector<Tensor>> steps;
  Tensor run_source_row, run_token, run_logprob;
  const int64_t ref_stride = 2 * k * batch, wide = 2 * k * k;
  const bool fused = fused_candidates() && plain_cpu(cross_key[0]);
  const auto host_longs = at::TensorOptions().dtype(at::kLong), host_floats = at::TensorOptions().dtype(at::kFloat);
  std::vector<std::pair<float, int64_t>> order(wide), merged(3 * k);
  std::vector<float> top_scores(2 * k), candidate(2 * k), kept_scores(k);
  std::vector<char> hits(2 * k), taking(2 * k), kept_done(k);
  std::vector<int64_t> kept_ref(k);
  const auto before = [](const std::pair<float, int64_t>& x, const std::pair<float, int64_t>& y) {
    // at::topk's order: larger first (NaN largest), of equal values the lower index first
    const bool x_nan = std::isnan(x.first), y_nan = std::isnan(y.first);
    if (x_nan != y_nan) return x_nan;
    return x.first > y.first || (x.first == y.first && x.second < y.second);
  };
  for (int64_t step = 0; step < width; ++step) {
    const int64_t items = active.size();
    // The first step runs one row per input, then its answers are copied to the input's k rows (as
    // CTranslate2 does on a CPU): every beam starts from the same start token, and only beam 0's scores count.
    const bool first = step == 0 && k > 1;
    const bool banned = step + 1 < min_new_tokens;
    auto [out, cross] = first ? first_step(last_tokens, k, cache, capture != kCaptureNothing, fused)
                              : run_step(last_tokens, step, cache, capture != kCaptureNothing, fused);
    Tensor row_logprob, row_token;  // (rows, 2k): each row's 2k best next tokens, rows = G·k (G at the first step)
    if (fused) {  // `out`: the last layer's states, of one row per input at the first step
      std::vector<char> ending;
      for (int64_t a = 0; a < items; ++a)
        for (int64_t b = 0; b < (first ? 1 : k); ++b) ending.push_back(budgets[active[a]] <= step + 1);
      std::tie(row_logprob, row_token) = candidates(out, 2 * k, banned, ending, eos, pad);
    } else {  // `out`: the logits, of every row
      std::vector<int64_t> ending;
      for (int64_t a = 0; a < items; ++a)
        if (budgets[active[a]] <= step + 1)
          for (int64_t b = 0; b < k; ++b) ending.push_back(a * k + b);
      std::tie(row_logprob, row_token) = row_topk(next_logprobs(out, banned, ending, eos, pad), 2 * k);
    }
    const Tensor host_logprob = row_logprob.to(at::kCPU).contiguous(), host_token = row_token.to(at::kCPU).contiguous();
    const float* lp = host_logprob.data_ptr<float>();
    const int64_t* tk = host_token.data_ptr<int64_t>();
    const bool one_row = first && fused;  // then each input's one row stands for its k rows
    const int64_t row_stride = one_row ? 0 : 2 * k;
    const float divisor = static_cast<float>(std::pow(static_cast<double>(step + 1), length_penalty));

    // model.search.beam_step, one input at a time
    Tensor row_t = at::empty({items, 2 * k}, host_longs), token_t = at::empty({items, 2 * k}, host_longs);
    Tensor token_logprob_t = at::empty({items, 2 * k}, host_floats);
    Tensor new_rows_t = at::empty({items * k}, host_longs), new_tokens_t = at::empty({items * k}, host_longs);
    Tensor new_logprobs_t = at::empty({items * k}, host_floats);
    int64_t *rows_out = row_t.data_ptr<int64_t>(), *tokens_out = token_t.data_ptr<int64_t>();
    float* logprobs_out = token_logprob_t.data_ptr<float>();
    int64_t *new_rows = new_rows_t.data_ptr<int64_t>(), *new_tokens = new_tokens_t.data_ptr<int64_t>();
    float* new_logprobs = new_logprobs_t.data_ptr<float>();
    std::vector<char> done(items);
    for (int64_t a = 0; a < items; ++a) {
      float* run = running.data() + a * k;
      const int64_t base = one_row ? a * 2 * k : a * k * 2 * k;
      for (int64_t b = 0; b < k; ++b)
        for (int64_t j = 0; j < 2 * k; ++j) order[b * 2 * k + j] = {lp[base + b * row_stride + j] + run[b], b * 2 * k + j};
      std::partial_sort(order.begin(), order.begin() + 2 * k, order.begin() + wide, before);
      const bool ending = budgets[active[a]] <= step + 1;
      for (int64_t j = 0; j < 2 * k; ++j) {
        top_scores[j] = order[j].first;
        const int64_t beam = order[j].second / (2 * k), at_flat = base + beam * row_stride + order[j].second % (2 * k);
        rows_out[a * 2 * k + j] = a * k + beam;
        tokens_out[a * 2 * k + j] = tk[at_flat];
        logprobs_out[a * 2 * k + j] = lp[at_flat];
        hits[j] = tk[at_flat] == eos || ending;
      }
      // the k best that do not end here continue: order[0 … k-1] from here on (their scores and candidates)
      for (int64_t j = 0; j < 2 * k; ++j) order[j] = {top_scores[j] + (hits[j] ? neg : -0.0f), j};
      std::partial_sort(order.begin(), order.begin() + k, order.begin() + 2 * k, before);
      bool all_done = true;
      for (int64_t j = 0; j < k; ++j) all_done = all_done && finished_done[a * k + j];
      for (int64_t j = 0; j < 2 * k; ++j) {
        taking[j] = hits[j] && j < k && !frozen[a];
        const bool eligible = taking[j] && improvable[a] && !all_done;
        candidate[j] = eligible ? top_scores[j] / divisor : top_scores[j] + 2.0f * neg;
      }
      // merge the finished slots with this step's candidates and keep the k best
      for (int64_t j = 0; j < k; ++j) merged[j] = {finished[a * k + j], j};
      for (int64_t j = 0; j < 2 * k; ++j) merged[k + j] = {candidate[j], k + j};
      std::partial_sort(merged.begin(), merged.begin() + k, merged.end(), before);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t slot = merged[j].second;
        kept_scores[j] = merged[j].first;
        kept_done[j] = slot < k ? finished_done[a * k + slot] : taking[slot - k];
        kept_ref[j] = slot < k ? finished_ref[a * k + slot] : a * 2 * k + (slot - k) + step * ref_stride;
      }
      float worst = kept_scores[0];
      bool every_done = true, every_hit = true, can_improve = false;
      for (int64_t j = 0; j < k; ++j) {
        finished[a * k + j] = kept_scores[j];
        finished_done[a * k + j] = kept_done[j];
        finished_ref[a * k + j] = kept_ref[j];
        worst = std::min(worst, kept_scores[j]);
        every_done = every_done && kept_done[j];
      }
      for (int64_t j = 0; j < 2 * k; ++j) every_hit = every_hit && hits[j];
      const float best_possible = order[0].first / divisor;
      for (int64_t j = 0; j < k; ++j) can_improve = can_improve || best_possible > (kept_done[j] ? worst : neg);
      improvable[a] = improvable[a] && can_improve;
      done[a] = !improvable[a] || every_done || every_hit || frozen[a];
      frozen[a] = done[a];
      for (int64_t j = 0; j < k; ++j) {
        const int64_t c = order[j].second;
        run[j] = order[j].first;
        new_rows[a * k + j] = rows_out[a * 2 * k + c];
        new_tokens[a * k + j] = tokens_out[a * 2 * k + c];
        new_logprobs[a * k + j] = logprobs_out[a * 2 * k + c];
      }
    }
    const auto device = cross_key[0].device();
    steps.push_back({run_source_row, run_token, run_logprob, row_t.to(device), token_t.to(device),
                     token_logprob_t.to(device), keep(cross, capture, capture_layer, capture_head)});
    std::vector<int64_t> kept;
    for (int64_t a = 0; a < items; ++a) {
      if (done[a]) {
        results[active[a]] = {
            at::tensor(std::vector<float>(finished.begin() + a * k, finished.begin() + a * k + k), host_floats).to(device),
            at::tensor(std::vector<int64_t>(finished_done.begin() + a * k, finished_done.begin() + a * k + k), host_longs)
                .to(at::kBool).to(device),
            at::tensor(std::vector<int64_t>(finished_ref.begin() + a * k, finished_ref.begin() + a * k + k), host_longs).to(device)};
      } else {
        kept.push_back(a);
      }
    }
    if (kept.empty()) break;
    const int64_t left = kept.size();
    if (left < items) {  // the inputs still running, in order, their slots moved down
      Tensor rows_left = at::empty({left * k}, host_longs), tokens_left = at::empty({left * k}, host_longs);
      Tensor logprobs_left = at::empty({left * k}, host_floats);
      for (int64_t i = 0; i < left; ++i) {
        const int64_t a = kept[i];
        for (int64_t j = 0; j < k; ++j) {
          rows_left.data_ptr<int64_t>()[i * k + j] = new_rows[a * k + j];
          tokens_left.data_ptr<int64_t>()[i * k + j] = new_tokens[a * k + j];
          logprobs_left.data_ptr<float>()[i * k + j] = new_logprobs[a * k + j];
          running[i * k + j] = running[a * k + j];
          finished[i * k + j] = finished[a * k + j];
          finished_done[i * k + j] = finished_done[a * k + j];
          finished_ref[i * k + j] = finished_ref[a * k + j];
        }
        improvable[i] = improvable[a];
        frozen[i] = frozen[a];
      }
      new_rows_t = rows_left;
      new_tokens_t = tokens_left;
      new_logprobs_t = logprobs_left;
      active = picked(active, kept);
    }
    run_source_row = new_rows_t.to(device);
    last_tokens = new_tokens_t.to(device);
    run_token = last_tokens;
    run_logprob = new_logprobs_t.to(device);
    // after the first step, input a's self-attention keys and values are in row a, not in rows a·k…a·k+k-1
    cache.reorder(run_source_row, true, step == 0 && k > 1 ? at::div(run_source_row, k, "floor") : Tensor());
  }
  return {steps, results};
}



// A search's cache for `beams` rows per source. The sources' K/V come one row per source (`beams` > 1: read
// through cross_rows by each of its rows on the CPU, repeated elsewhere) or already on every row (`beams` 1).
Runtime::Cache Runtime::start_cache(const std::vector<Tensor>& cross_key, const std::vector<Tensor>& cross_value,
                  const c10::optional<Tensor>& source_mask, int64_t capacity, int64_t beams) const {
  Cache cache;
  const int64_t sources = cross_key[0].size(0), rows = sources * beams, d_k = cross_key[0].size(3);
  const int64_t each = rows * heads_ * capacity * d_k;
  const bool cpu = plain_cpu(cross_key[0]);
  if (cpu) cache.workspace = workspace_->take(4 * static_cast<int64_t>(layers_.size()) * each, cross_key[0].options());
  int64_t offset = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (auto* list : {&cache.self_key, &cache.self_value, &cache.spare_key, &cache.spare_value}) {
      list->push_back(cpu ? cache.workspace->narrow(0, offset, each).view({rows, heads_, capacity, d_k})
                          : at::empty({rows, heads_, capacity, d_k}, cross_key[0].options()));
      offset += each;
    }
  }
  cache.cross_key = cross_key;
  cache.cross_value = cross_value;
  if (source_mask.has_value()) cache.source_mask = *source_mask;
  const auto longs = cross_key[0].options().dtype(at::kLong);
  if (cpu) {
    cache.cross_rows = beams > 1 ? at::arange(sources, longs).repeat_interleave(beams) : at::arange(rows, longs);
  } else if (beams > 1) {
    for (auto& t : cache.cross_key) t = t.repeat_interleave(beams, 0);
    for (auto& t : cache.cross_value) t = t.repeat_interleave(beams, 0);
    if (cache.source_mask.defined()) cache.source_mask = cache.source_mask.repeat_interleave(beams, 0);
  }
  return cache;
}

// One step over the cache: the logits, or with `hidden` the last layer's states; and the cross-attention.
std::pair<Tensor, std::vector<Tensor>> Runtime::run_step(const Tensor& ids, int64_t position, Cache& cache,
                                                bool need_weights, bool hidden) {
  const auto source_mask = cache.source_mask.defined() ? c10::optional<Tensor>(cache.source_mask) : c10::nullopt;
  auto [x, cross] = layers(ids, position, ids, cache.self_key, cache.self_value, position + 1, c10::nullopt,
                           cache.cross_key, cache.cross_value, source_mask, need_weights, cache.cross_rows);
  cache.length = position + 1;
  return {hidden ? x : logits(x), cross};
}

// The beam's first step on row 0 of each input's k rows (its self-attention keys and values written to row a of
// the caches for input a), its logits and cross-attention weights then repeated to all k rows (with `hidden`,
// the last layer's states of the one row per input, not repeated).
std::pair<Tensor, std::vector<Tensor>> Runtime::first_step(const Tensor& ids, int64_t k, Cache& cache, bool need_weights,
                                                  bool hidden) {
  const int64_t inputs = ids.size(0) / k;
  Tensor first = at::arange(inputs, ids.options()).mul_(k);
  Cache single = cache;  // the same self-attention buffers; the cross-attention inputs' first rows
  if (single.cross_rows.defined()) {
    single.cross_rows = single.cross_rows.index_select(0, first);
  } else {
    for (auto& t : single.cross_key) t = t.index_select(0, first);
    for (auto& t : single.cross_value) t = t.index_select(0, first);
    if (single.source_mask.defined()) single.source_mask = single.source_mask.index_select(0, first);
  }
  auto [out, cross] = run_step(ids.index_select(0, first), 0, single, need_weights, hidden);
  cache.length = single.length;
  Tensor every = at::arange(inputs, ids.options()).repeat_interleave(k);
  for (auto& weights : cross) weights = weights.index_select(0, every);
  return {hidden ? out : out.index_select(0, every), cross};
}

// Rows `index` of each tensor, in that order (inputs or rows leaving the search).
void Runtime::keep_rows(std::initializer_list<Tensor*> tensors, const Tensor& index) {
  for (Tensor* tensor : tensors) *tensor = tensor->index_select(0, index);
}

std::vector<int64_t> Runtime::picked(const std::vector<int64_t>& values, const std::vector<int64_t>& index) {
  std::vector<int64_t> out;
  for (int64_t i : index) out.push_back(values[i]);
  return out;
}

// model.search.next_logprobs: log-softmax, pad banned, eos banned before min_new_tokens, rows at their
// budget forced to eos.
Tensor Runtime::next_logprobs(const Tensor& logits, bool banned, const std::vector<int64_t>& ending, int64_t eos,
                            int64_t pad) {
  Tensor logprobs = at::log_softmax(logits.to(at::kFloat), -1);
  const double inf = std::numeric_limits<double>::infinity();
  logprobs.select(1, pad).fill_(-inf);
  if (banned) logprobs.select(1, eos).fill_(-inf);
  if (!ending.empty()) {
    if (static_cast<int64_t>(ending.size()) == logprobs.size(0)) {
      logprobs.fill_(-inf);
      logprobs.select(1, eos).fill_(0.0);
    } else {
      Tensor rows = at::tensor(ending, logits.options().dtype(at::kLong));
      logprobs.index_fill_(0, rows, -inf);
      logprobs.index_put_({rows, eos}, at::scalar_tensor(0.0, logprobs.options()));
    }
  }
  return logprobs;
}

// The m largest of each row of a float matrix and their columns, largest first (of equal values the lower
// column first), in one pass per row keeping the m best so far: at a few rows of a vocabulary, at::topk's
// fixed cost is most of its time.
std::tuple<Tensor, Tensor> Runtime::few_rows_topk(const Tensor& scores, int64_t m) {
  if (!plain_cpu(scores) || !scores.is_contiguous() || scores.dim() != 2 || scores.size(1) < m)
    return at::topk(scores, m, 1);
  const int64_t rows = scores.size(0), width = scores.size(1);
  Tensor values = at::empty({rows, m}, scores.options());
  Tensor index = at::empty({rows, m}, scores.options().dtype(at::kLong));
  const float* in = scores.data_ptr<float>();
  float* best = values.data_ptr<float>();
  int64_t* where = index.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) top_of_row(in + r * width, width, m, best + r * m, where + r * m);
  return {values, index};
}

// model.topk.row_topk: the m largest of each wide row by way of chunk maxima (16 rows and more; fewer rows
// one pass each).
std::tuple<Tensor, Tensor> Runtime::row_topk(const Tensor& scores, int64_t m) {
  constexpr int64_t chunk = 64, min_rows = 16;
  const int64_t rows = scores.size(0), width = scores.size(1), chunks = width / chunk;
  if (rows < min_rows) return few_rows_topk(scores, m);
  if (chunks <= m || !scores.is_contiguous()) return at::topk(scores, m, 1);
  Tensor whole = scores.as_strided({rows, chunks, chunk}, {width, chunk, 1});
  Tensor best_chunks = std::get<1>(whole.amax(2).topk(m, 1));
  const int64_t picked_width = m * chunk, tail_start = chunks * chunk;
  Tensor picked = whole.index({at::arange(rows, best_chunks.options()).unsqueeze(1), best_chunks}).view({rows, picked_width});
  auto [values, index] = at::cat({picked, scores.narrow(1, tail_start, width - tail_start)}, 1).topk(m, 1);
  Tensor in_chunks = best_chunks.gather(1, at::div(index, chunk, "floor").clamp_max_(m - 1)) * chunk + index.remainder(chunk);
  Tensor column = at::where(index.lt(picked_width), in_chunks, index - picked_width + tail_start);
  return {values, column};
}


}  // namespace
