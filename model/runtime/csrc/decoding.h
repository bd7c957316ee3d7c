// The compiled CPU decode loop: the one search over the runtime's layers, rows' K/V in buffers of its own. Each
// row reads its own positions and source slot and every kernel is row-invariant, so a request decodes as alone.
#pragma once

#include "runtime.h"

namespace {

class CompiledLoop {
 public:
  using Token = BeamSearch::Token;
  using Done = BeamSearch::Done;

  // eos, pad and start: the model's tokens; capture_layer and capture_head (< 0: the layer's head average): the
  // head a request with Capture one_head keeps.
  CompiledLoop(Runtime& runtime, int64_t eos, int64_t pad, int64_t start, int64_t capture_layer, int64_t capture_head)
      : runtime_(runtime), search_(eos, pad, start, runtime.positions_.size(0)), eos_(eos), pad_(pad),
        capture_layer_(capture_layer), capture_head_(capture_head) {}

  // Requests whose encoder pass is done join: their hidden states (n, S, d_model) right-padded, then per request
  // as BeamSearch::join takes them. Returns their ids.
  std::vector<int64_t> join(const Tensor& hidden, const std::vector<int64_t>& lengths, const std::vector<int64_t>& beams,
                            const std::vector<int64_t>& budgets, const std::vector<int64_t>& min_new_tokens,
                            const std::vector<double>& length_penalties, const std::vector<int64_t>& captures,
                            const std::vector<bool>& streams,
                            const std::vector<std::vector<std::vector<int64_t>>>& constraints,
                            const std::vector<std::vector<int64_t>>& forced) {
    at::InferenceMode guard;
    TORCH_CHECK(plain_cpu(hidden), "the decode loop runs on the CPU");
    const int64_t count = hidden.size(0), width = hidden.size(1);
    TORCH_CHECK(static_cast<int64_t>(lengths.size()) == count, "one length per source");
    for (int64_t length : lengths) TORCH_CHECK(length >= 1 && length <= width, "a bad request");
    for (int64_t slot : search_.take_freed()) free_slots_.push_back(slot);
    std::vector<int64_t> slots;
    for (int64_t i = 0; i < count; ++i) slots.push_back(take_slot());
    grow_sources(slots_, width);
    std::vector<int64_t> ids = search_.join(lengths, beams, budgets, min_new_tokens, length_penalties, captures,
                                            streams, slots, constraints, forced);
    auto [keys, values] = runtime_.cross_key_values(hidden, at::ones({count}, hidden.options().dtype(at::kLong)));
    for (int64_t i = 0; i < count; ++i) {
      for (size_t layer = 0; layer < keys.size(); ++layer) {
        cross_key_[layer].select(0, slots[i]).narrow(1, 0, width).copy_(keys[layer][i]);
        cross_value_[layer].select(0, slots[i]).narrow(1, 0, width).copy_(values[layer][i]);
      }
    }
    return ids;
  }

  void cancel(int64_t id) { search_.cancel(id); }
  void set_word_continuations(const std::vector<int64_t>& tokens) { search_.set_word_continuations(tokens); }
  int64_t rows() const { return search_.rows(); }
  int64_t size() const { return search_.size(); }

  // One token for every row: the streamed tokens of this step, and the requests that are done, with their
  // hypotheses (best first).
  std::pair<std::vector<Token>, std::vector<Done>> step() {
    at::InferenceMode guard;
    const BeamSearch::Layout& layout = search_.plan();
    if (layout.rows == 0) return {};
    place_rows(layout);
    const int64_t rows = layout.rows;
    auto longs = at::TensorOptions().dtype(at::kLong);
    const auto as_tensor = [&](const std::vector<int64_t>& values) {
      return at::from_blob(const_cast<int64_t*>(values.data()), {rows}, longs);
    };
    std::vector<int64_t> own(rows);
    for (int64_t r = 0; r < rows; ++r) own[r] = layout.positions[r] + 1;
    std::vector<Tensor> cross_key, cross_value;
    for (size_t i = 0; i < cross_key_.size(); ++i) {
      cross_key.push_back(cross_key_[i].narrow(2, 0, layout.source_width));
      cross_value.push_back(cross_value_[i].narrow(2, 0, layout.source_width));
    }
    const bool weights = layout.every_head || layout.one_head;
    auto [x, cross] = runtime_.layers(as_tensor(layout.ids), as_tensor(layout.positions), self_key_, self_value_,
                                      layout.width, cross_key, cross_value, weights, as_tensor(layout.slots),
                                      as_tensor(own), as_tensor(layout.source_lengths));
    // each row's 2K best next tokens, K the widest beam: a request of beam k reads the first 2k (the same ones)
    const int64_t m = 2 * layout.widest_beam;
    auto [best_logprob, best_token, wanted] =
        runtime_.candidates(x, m, layout.banned, layout.ending, eos_, pad_, layout.wanted, layout.wanted_width);
    Tensor all_heads = layout.every_head ? at::stack(cross, 1) : Tensor();  // (N, L, h, S)
    Tensor head_rows;                                                         // (N, S)
    if (layout.one_head)
      head_rows = capture_head_ < 0 ? cross[capture_layer_].mean(1) : cross[capture_layer_].select(1, capture_head_);
    rows_now_ = rows;
    return search_.advance(best_logprob.data_ptr<float>(), best_token.data_ptr<int64_t>(), m, all_heads, head_rows,
                           wanted.data());
  }

 private:
  int64_t take_slot() {
    if (!free_slots_.empty()) {
      const int64_t slot = free_slots_.back();
      free_slots_.pop_back();
      return slot;
    }
    return slots_++;
  }

  // Rows that continue another row of the last step take its self-attention K/V (its positions so far), through
  // the scratch buffers where a move overwrites a row another move still reads.
  void place_rows(const BeamSearch::Layout& layout) {
    const int64_t rows = layout.rows;
    grow_rows(rows, layout.longest_budget);
    std::vector<std::tuple<int64_t, int64_t, int64_t>> moves;  // (to, from, positions)
    for (int64_t r = 0; r < rows; ++r)
      if (layout.positions[r] > 0 && layout.previous[r] != r) moves.emplace_back(r, layout.previous[r], layout.positions[r]);
    if (moves.empty()) return;
    const int64_t heads = self_key_[0].size(1), capacity = self_key_[0].size(2), d_k = self_key_[0].size(3);
    const int64_t block = capacity * d_k;
    // a destination is never the source of an unsaved move: only rows another move overwrites are saved first
    std::vector<bool> overwritten(rows, false);
    for (auto [to, from, length] : moves) overwritten[to] = true;
    const auto copy = [&](float* into, int64_t to, const float* out_of, int64_t from, int64_t length) {
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(into + (to * heads + h) * block, out_of + (from * heads + h) * block, sizeof(float) * length * d_k);
    };
    for (size_t i = 0; i < self_key_.size(); ++i) {
      for (auto [buffer, scratch] : {std::pair<Tensor*, Tensor*>{&self_key_[i], &scratch_key_[i]},
                                     std::pair<Tensor*, Tensor*>{&self_value_[i], &scratch_value_[i]}}) {
        float* main = buffer->data_ptr<float>();
        float* spare = scratch->data_ptr<float>();
        for (auto [to, from, length] : moves)
          if (from < rows && overwritten[from]) copy(spare, to, main, from, length);
        for (auto [to, from, length] : moves)
          if (!(from < rows && overwritten[from])) copy(main, to, main, from, length);
        for (auto [to, from, length] : moves)
          if (from < rows && overwritten[from]) copy(main, to, spare, to, length);
      }
    }
  }

  // Self-attention buffers for `rows` rows of `positions` positions (each dimension at least doubling when it
  // grows), the rows held so far copied over.
  void grow_rows(int64_t rows, int64_t positions) {
    const int64_t have_rows = self_key_.empty() ? 0 : self_key_[0].size(0);
    const int64_t have_positions = self_key_.empty() ? 0 : self_key_[0].size(2);
    if (rows <= have_rows && positions <= have_positions) return;
    const int64_t new_rows = grown(rows, have_rows, 4), new_positions = grown(positions, have_positions, 16);
    const int64_t layers = runtime_.layers_.size(), heads = runtime_.heads_;
    const int64_t d_k = runtime_.embed_.size(1) / heads, each = new_rows * heads * new_positions * d_k;
    std::shared_ptr<Tensor> block = runtime_.workspace_->take(4 * layers * each, runtime_.embed_.options());
    std::vector<Tensor> key, value, spare_key, spare_value;
    int64_t offset = 0;
    for (int64_t i = 0; i < layers; ++i) {
      for (auto* list : {&key, &value, &spare_key, &spare_value}) {
        list->push_back(block->narrow(0, offset, each).view({new_rows, heads, new_positions, d_k}));
        offset += each;
      }
      if (have_rows > 0) {
        const int64_t held = std::min(rows_now_, have_rows);
        key[i].narrow(0, 0, held).narrow(2, 0, have_positions).copy_(self_key_[i].narrow(0, 0, held));
        value[i].narrow(0, 0, held).narrow(2, 0, have_positions).copy_(self_value_[i].narrow(0, 0, held));
      }
    }
    self_key_ = std::move(key);
    self_value_ = std::move(value);
    scratch_key_ = std::move(spare_key);
    scratch_value_ = std::move(spare_value);
    block_ = std::move(block);
  }

  // Source slots' cross-attention K/V for `slots` slots of `length` positions, those held so far copied over.
  void grow_sources(int64_t slots, int64_t length) {
    const int64_t have_slots = cross_key_.empty() ? 0 : cross_key_[0].size(0);
    const int64_t have_length = cross_key_.empty() ? 0 : cross_key_[0].size(2);
    if (slots <= have_slots && length <= have_length) return;
    const int64_t new_slots = grown(slots, have_slots, 4), new_length = grown(length, have_length, 16);
    const int64_t heads = runtime_.heads_, d_k = runtime_.embed_.size(1) / heads;
    for (size_t i = 0; i < runtime_.layers_.size(); ++i) {
      for (auto* list : {&cross_key_, &cross_value_}) {
        Tensor fresh = at::empty({new_slots, heads, new_length, d_k}, runtime_.embed_.options());
        if (have_slots > 0) fresh.narrow(0, 0, have_slots).narrow(2, 0, have_length).copy_((*list)[i]);
        if (static_cast<size_t>(list->size()) > i) {
          (*list)[i] = fresh;
        } else {
          list->push_back(fresh);
        }
      }
    }
  }

  static int64_t grown(int64_t needed, int64_t have, int64_t least) {
    return needed <= have ? have : std::max({needed, 2 * have, least});
  }

  Runtime& runtime_;
  BeamSearch search_;
  int64_t eos_, pad_, capture_layer_, capture_head_;
  int64_t rows_now_ = 0, slots_ = 0;
  std::vector<int64_t> free_slots_;
  std::vector<Tensor> self_key_, self_value_, scratch_key_, scratch_value_;  // (rows, h, positions, d_k) per layer
  std::shared_ptr<Tensor> block_;                                            // the workspace block they lie in
  std::vector<Tensor> cross_key_, cross_value_;                              // (slots, h, S, d_k) per layer
};

}  // namespace
