// The decode loop: every running request's rows decode one token per step together, and requests join and leave
// between any two steps. A static batch is the case where every request joins before the first step; the
// continuous scheduler (model/decoding/scheduler.py) joins them as they arrive. Each request runs the beam step of
// model/decoding/search.py (beam_step; greedy is one beam) on its own rows, at its own step, with its own length
// budget, minimum length, length penalty and capture, so that its ids, scores and attention are what it gets
// decoded alone: attention reads each row's own positions and its own source's (attend's per-row lengths), and
// every matmul's kernel is row-invariant (Runtime::choose).
#pragma once

#include "runtime.h"

namespace {

class Loop {
 public:
  // A streamed token: (request, its position in the output, token, its log-probability, the attention row the
  // request captures: every layer's and head's (L, h, S), one head's (S,), or None).
  using Token = std::tuple<int64_t, int64_t, int64_t, double, c10::optional<Tensor>>;
  // A finished hypothesis: (tokens, their log-probabilities, length-normalised score, its attention: every
  // layer's and head's (T, L, h, S), one head's rows (T, S), or None).
  using Hypothesis = std::tuple<std::vector<int64_t>, std::vector<double>, double, c10::optional<Tensor>>;
  using Done = std::tuple<int64_t, std::vector<Hypothesis>>;  // a request and its finished hypotheses, best first

  // eos, pad and start: the model's tokens; capture_layer and capture_head (< 0: the layer's head average): the
  // head a request with Capture one_head keeps.
  Loop(Runtime& runtime, int64_t eos, int64_t pad, int64_t start, int64_t capture_layer, int64_t capture_head)
      : runtime_(runtime), eos_(eos), pad_(pad), start_(start), capture_layer_(capture_layer),
        capture_head_(capture_head) {}

  // Requests whose encoder pass is done join: their hidden states (n, S, d_model) right-padded, source lengths, and
  // per request its beam size, length budget, minimum new tokens, length penalty, Capture and whether its tokens
  // are streamed (under beam search, those every beam shares: `settled`). They decode from the next step; returns
  // their ids.
  std::vector<int64_t> join(const Tensor& hidden, const std::vector<int64_t>& lengths, const std::vector<int64_t>& beams,
                            const std::vector<int64_t>& budgets, const std::vector<int64_t>& min_new_tokens,
                            const std::vector<double>& length_penalties, const std::vector<int64_t>& captures,
                            const std::vector<bool>& streams) {
    at::InferenceMode guard;
    TORCH_CHECK(plain_cpu(hidden), "the decode loop runs on the CPU");
    const int64_t count = hidden.size(0);
    TORCH_CHECK(static_cast<int64_t>(lengths.size()) == count && beams.size() == lengths.size() &&
                    budgets.size() == lengths.size() && min_new_tokens.size() == lengths.size() &&
                    length_penalties.size() == lengths.size() && captures.size() == lengths.size() &&
                    streams.size() == lengths.size(),
                "one length, beam size, budget, minimum, penalty, capture and stream flag per source");
    const int64_t width = hidden.size(1);
    for (int64_t i = 0; i < count; ++i) {
      TORCH_CHECK(beams[i] >= 1 && budgets[i] >= 1 && lengths[i] >= 1 && lengths[i] <= width, "a bad request");
      TORCH_CHECK(budgets[i] <= runtime_.positions_.size(0), "a budget past the model's positions");
    }
    // the slots this join takes: the free ones first, then new ones past the last
    grow_sources(slots_ + std::max<int64_t>(0, count - static_cast<int64_t>(free_slots_.size())), width);
    auto [keys, values] = runtime_.cross_key_values(hidden, at::ones({count}, hidden.options().dtype(at::kLong)));
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < count; ++i) {
      Request request;
      request.id = next_id_++;
      request.k = beams[i];
      request.budget = budgets[i];
      request.min_new_tokens = min_new_tokens[i];
      request.length_penalty = length_penalties[i];
      request.capture = captures[i];
      request.stream = streams[i];
      request.length = lengths[i];
      request.slot = take_slot();
      for (size_t layer = 0; layer < keys.size(); ++layer) {
        cross_key_[layer].select(0, request.slot).narrow(1, 0, width).copy_(keys[layer][i]);
        cross_value_[layer].select(0, request.slot).narrow(1, 0, width).copy_(values[layer][i]);
      }
      const float neg = static_cast<float>(kNegInf);
      request.running.assign(request.k, neg);
      request.running[0] = 0.0f;  // the k beams start as one: only the first may be extended at step 0
      request.finished.assign(request.k, neg);
      request.finished_done.assign(request.k, 0);
      request.paths.resize(request.k);
      request.finished_paths.resize(request.k);
      request.next_tokens = {start_};
      ids.push_back(request.id);
      requests_.push_back(std::move(request));
    }
    return ids;
  }

  // Stop decoding a request: its rows leave at the next step.
  void cancel(int64_t id) {
    for (Request& request : requests_)
      if (request.id == id) request.cancelled = true;
  }

  // Rows the next step decodes (a request's first step takes one row, then k), and requests held.
  int64_t rows() const {
    int64_t rows = 0;
    for (const Request& request : requests_)
      if (!request.cancelled) rows += request.step == 0 ? 1 : request.k;
    return rows;
  }
  int64_t size() const { return static_cast<int64_t>(requests_.size()); }

  // One token for every row: the streamed tokens of this step, and the requests that are done, with their
  // hypotheses (in the order of their finished slots: best first).
  std::pair<std::vector<Token>, std::vector<Done>> step() {
    at::InferenceMode guard;
    std::vector<Token> tokens;
    std::vector<Done> finished;
    drop_cancelled();
    if (requests_.empty()) return {tokens, finished};
    place_rows();
    const int64_t rows = rows_now_;
    auto longs = at::TensorOptions().dtype(at::kLong);
    Tensor ids = at::empty({rows}, longs), positions = at::empty({rows}, longs), cross_rows = at::empty({rows}, longs);
    Tensor self_lengths = at::empty({rows}, longs), cross_lengths = at::empty({rows}, longs);
    int64_t *id = ids.data_ptr<int64_t>(), *position = positions.data_ptr<int64_t>();
    int64_t *slot = cross_rows.data_ptr<int64_t>(), *own = self_lengths.data_ptr<int64_t>();
    int64_t* source = cross_lengths.data_ptr<int64_t>();
    std::vector<char> banned(rows), ending(rows);
    int64_t width = 0, source_width = 0, widest_beam = 1;
    bool every_head = false, one_head = false;
    for (const Request& request : requests_) {
      for (int64_t j = 0; j < request.rows(); ++j) {
        const int64_t r = request.first_row + j;
        id[r] = request.next_tokens[j];
        position[r] = request.step;
        slot[r] = request.slot;
        own[r] = request.step + 1;
        source[r] = request.length;
        banned[r] = request.step + 1 < request.min_new_tokens;
        ending[r] = request.budget <= request.step + 1;
      }
      width = std::max(width, request.step + 1);
      source_width = std::max(source_width, request.length);
      widest_beam = std::max(widest_beam, request.k);
      every_head = every_head || request.capture == kCaptureEveryHead;
      one_head = one_head || request.capture == kCaptureOneHead;
    }
    std::vector<Tensor> cross_key, cross_value;
    for (size_t i = 0; i < cross_key_.size(); ++i) {
      cross_key.push_back(cross_key_[i].narrow(2, 0, source_width));
      cross_value.push_back(cross_value_[i].narrow(2, 0, source_width));
    }
    auto [x, cross] = runtime_.layers(ids, -1, positions, self_key_, self_value_, width, c10::nullopt, cross_key,
                                      cross_value, c10::nullopt, every_head || one_head, cross_rows, self_lengths,
                                      cross_lengths);
    // each row's 2K best next tokens, K the widest beam: a request of beam k reads the first 2k (the same ones)
    const int64_t m = 2 * widest_beam;
    auto [best_logprob, best_token] = runtime_.candidates(x, m, banned, ending, eos_, pad_);
    const float* lp = best_logprob.data_ptr<float>();
    const int64_t* tk = best_token.data_ptr<int64_t>();
    Tensor all_heads = every_head ? at::stack(cross, 1) : Tensor();  // (N, L, h, S)
    Tensor head_rows;                                                 // (N, S)
    if (one_head)
      head_rows = capture_head_ < 0 ? cross[capture_layer_].mean(1) : cross[capture_layer_].select(1, capture_head_);

    std::vector<Request> kept;
    for (Request& request : requests_) {
      Tensor attention;  // this step's rows of the request, cut to its source: (n, L, h, S) or (n, S)
      if (request.capture == kCaptureEveryHead || request.capture == kCaptureOneHead) {
        const Tensor& from = request.capture == kCaptureEveryHead ? all_heads : head_rows;
        attention = from.narrow(0, request.first_row, request.rows()).narrow(-1, 0, request.length).clone();
      }
      const bool done = advance(request, lp + request.first_row * m, tk + request.first_row * m, m, attention);
      if (request.stream) settled(request, done, tokens);
      if (done) {
        finished.emplace_back(request.id, hypotheses(request));
        free_slots_.push_back(request.slot);
      } else {
        kept.push_back(std::move(request));
      }
    }
    requests_ = std::move(kept);
    return {tokens, finished};
  }

 private:
  static constexpr double kNegInf = -1.0e9;

  // One beam's tokens so far, their log-probabilities and the attention rows that produced them.
  struct Path {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
    std::vector<Tensor> attention;
  };

  struct Request {
    int64_t id = 0, k = 1, budget = 1, min_new_tokens = 0, capture = kCaptureNothing, length = 1, slot = 0;
    double length_penalty = 1.0;
    bool stream = false, cancelled = false;
    int64_t step = 0;       // tokens decoded so far: its rows' next position
    size_t emitted = 0;     // tokens streamed so far
    int64_t first_row = 0;  // where its rows are at this step
    // model.decoding.search.BeamState for this one request, on the host
    std::vector<float> running, finished;
    std::vector<char> finished_done;
    bool improvable = true;
    std::vector<Path> paths, finished_paths;  // the running beams', the finished slots'
    std::vector<int64_t> next_tokens;         // each row's input at its next step
    std::vector<int64_t> from;                // the row (at the last step) each of its rows continues
    // this step's 2k candidates, best first: the beam each extends, its token and log-probability
    std::vector<int64_t> candidate_beam, candidate_token;
    std::vector<float> candidate_logprob;

    int64_t rows() const { return step == 0 ? 1 : k; }
  };

  // model.decoding.search.beam_step for one request on its rows' candidates (lp, tk: `stride` per row, the first
  // 2k read); returns whether it is done. Its first step has one row, which stands for its k beams.
  bool advance(Request& request, const float* lp, const int64_t* tk, int64_t stride, const Tensor& attention) {
    const int64_t k = request.k, wide = 2 * k * k;
    const bool one_row = request.step == 0 && k > 1;
    const int64_t row_stride = one_row ? 0 : stride;
    const float neg = static_cast<float>(kNegInf);
    const float divisor =
        static_cast<float>(std::pow(static_cast<double>(request.step + 1), request.length_penalty));
    const auto before = [](const std::pair<float, int64_t>& x, const std::pair<float, int64_t>& y) {
      // at::topk's order: larger first (NaN largest), of equal values the lower index first
      const bool x_nan = std::isnan(x.first), y_nan = std::isnan(y.first);
      if (x_nan != y_nan) return x_nan;
      return x.first > y.first || (x.first == y.first && x.second < y.second);
    };
    std::vector<std::pair<float, int64_t>> order(wide), merged(3 * k);
    std::vector<float> top_scores(2 * k), candidate(2 * k), kept_scores(k);
    std::vector<char> hits(2 * k), taking(2 * k), kept_done(k);
    float* run = request.running.data();
    for (int64_t b = 0; b < k; ++b)
      for (int64_t j = 0; j < 2 * k; ++j) order[b * 2 * k + j] = {lp[b * row_stride + j] + run[b], b * 2 * k + j};
    std::partial_sort(order.begin(), order.begin() + 2 * k, order.begin() + wide, before);
    const bool ending = request.budget <= request.step + 1;
    request.candidate_beam.resize(2 * k);
    request.candidate_token.resize(2 * k);
    request.candidate_logprob.resize(2 * k);
    for (int64_t j = 0; j < 2 * k; ++j) {
      top_scores[j] = order[j].first;
      const int64_t beam = order[j].second / (2 * k), at = beam * row_stride + order[j].second % (2 * k);
      request.candidate_beam[j] = beam;
      request.candidate_token[j] = tk[at];
      request.candidate_logprob[j] = lp[at];
      hits[j] = tk[at] == eos_ || ending;
    }
    // the k best that do not end here continue: order[0 … k-1] from here on (their scores and candidates)
    for (int64_t j = 0; j < 2 * k; ++j) order[j] = {top_scores[j] + (hits[j] ? neg : -0.0f), j};
    std::partial_sort(order.begin(), order.begin() + k, order.begin() + 2 * k, before);
    bool all_done = true;
    for (int64_t j = 0; j < k; ++j) all_done = all_done && request.finished_done[j];
    for (int64_t j = 0; j < 2 * k; ++j) {
      taking[j] = hits[j] && j < k;
      const bool eligible = taking[j] && request.improvable && !all_done;
      candidate[j] = eligible ? top_scores[j] / divisor : top_scores[j] + 2.0f * neg;
    }
    // merge the finished slots with this step's candidates and keep the k best
    for (int64_t j = 0; j < k; ++j) merged[j] = {request.finished[j], j};
    for (int64_t j = 0; j < 2 * k; ++j) merged[k + j] = {candidate[j], k + j};
    std::partial_sort(merged.begin(), merged.begin() + k, merged.end(), before);
    std::vector<Path> finished_paths(k);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = merged[j].second;
      kept_scores[j] = merged[j].first;
      kept_done[j] = slot < k ? request.finished_done[slot] : taking[slot - k];
      finished_paths[j] = slot < k ? request.finished_paths[slot] : extended(request, slot - k, one_row, attention);
    }
    float worst = kept_scores[0];
    bool every_done = true, every_hit = true, can_improve = false;
    for (int64_t j = 0; j < k; ++j) {
      request.finished[j] = kept_scores[j];
      request.finished_done[j] = kept_done[j];
      worst = std::min(worst, kept_scores[j]);
      every_done = every_done && kept_done[j];
    }
    request.finished_paths = std::move(finished_paths);
    for (int64_t j = 0; j < 2 * k; ++j) every_hit = every_hit && hits[j];
    const float best_possible = order[0].first / divisor;
    for (int64_t j = 0; j < k; ++j) can_improve = can_improve || best_possible > (kept_done[j] ? worst : neg);
    request.improvable = request.improvable && can_improve;
    const bool done = !request.improvable || every_done || every_hit;
    if (done) return true;
    std::vector<Path> paths(k);
    request.from.resize(k);
    request.next_tokens.resize(k);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t c = order[j].second;
      run[j] = order[j].first;
      paths[j] = extended(request, c, one_row, attention);
      request.from[j] = request.first_row + (one_row ? 0 : request.candidate_beam[c]);
      request.next_tokens[j] = request.candidate_token[c];
    }
    request.paths = std::move(paths);
    ++request.step;
    return false;
  }

  // Hand out the tokens of a streamed request that no later step can take back, from the first not handed out
  // yet: the prefix its running beams and its finished hypotheses all share (greedy: each token as it comes), and,
  // once it is done, the rest of its best hypothesis. So a stream is always a prefix of the final answer.
  static void settled(Request& request, bool done, std::vector<Token>& tokens) {
    std::vector<const Path*> open;
    for (int64_t j = 0; j < request.k; ++j)
      if (request.finished_done[j]) open.push_back(&request.finished_paths[j]);  // best first
    if (done) {
      if (open.empty()) return;
      open.resize(1);  // the answer
    } else {
      for (const Path& path : request.paths) open.push_back(&path);
    }
    const Path& first = *open[0];
    size_t shared = first.tokens.size();
    for (const Path* path : open) {
      size_t same = 0;
      const size_t limit = std::min(shared, path->tokens.size());
      while (same < limit && path->tokens[same] == first.tokens[same]) ++same;
      shared = same;
    }
    for (size_t t = request.emitted; t < shared; ++t) {
      tokens.emplace_back(request.id, static_cast<int64_t>(t), first.tokens[t], static_cast<double>(first.logprobs[t]),
                          t < first.attention.size() ? c10::optional<Tensor>(first.attention[t]) : c10::nullopt);
    }
    request.emitted = std::max(request.emitted, shared);
  }

  // The path of candidate c: its beam's path and its token (with its row's attention).
  static Path extended(const Request& request, int64_t c, bool one_row, const Tensor& attention) {
    const int64_t beam = request.candidate_beam[c];
    Path path = request.paths[beam];
    path.tokens.push_back(request.candidate_token[c]);
    path.logprobs.push_back(request.candidate_logprob[c]);
    if (attention.defined()) path.attention.push_back(attention[one_row ? 0 : beam]);
    return path;
  }

  std::vector<Hypothesis> hypotheses(const Request& request) const {
    std::vector<Hypothesis> out;
    for (int64_t j = 0; j < request.k; ++j) {
      if (!request.finished_done[j]) continue;
      const Path& path = request.finished_paths[j];
      std::vector<double> logprobs(path.logprobs.begin(), path.logprobs.end());
      c10::optional<Tensor> attention;
      if (!path.attention.empty()) attention = at::stack(path.attention, 0);
      out.emplace_back(path.tokens, logprobs, static_cast<double>(request.finished[j]), attention);
    }
    return out;
  }

  void drop_cancelled() {
    std::vector<Request> kept;
    for (Request& request : requests_) {
      if (request.cancelled) {
        free_slots_.push_back(request.slot);
      } else {
        kept.push_back(std::move(request));
      }
    }
    requests_ = std::move(kept);
  }

  int64_t take_slot() {
    if (!free_slots_.empty()) {
      const int64_t slot = free_slots_.back();
      free_slots_.pop_back();
      return slot;
    }
    return slots_++;
  }

  // Lay this step's rows out: each request's rows side by side in request order, a request that ran before on the
  // rows it continues (copied where they moved: its positions so far, through the scratch buffers, so that no row
  // is overwritten before it is read), a new one on a fresh row.
  void place_rows() {
    int64_t rows = 0, positions = 0;
    for (Request& request : requests_) {
      request.first_row = rows;
      rows += request.rows();
      positions = std::max(positions, request.budget);
    }
    grow_rows(rows, positions);
    std::vector<std::tuple<int64_t, int64_t, int64_t>> moves;  // (to, from, positions)
    for (const Request& request : requests_) {
      if (request.step == 0) continue;
      for (int64_t j = 0; j < request.k; ++j)
        if (request.from[j] != request.first_row + j) moves.emplace_back(request.first_row + j, request.from[j], request.step);
    }
    if (!moves.empty()) {
      const int64_t heads = self_key_[0].size(1), capacity = self_key_[0].size(2), d_k = self_key_[0].size(3);
      const int64_t block = capacity * d_k;
      // Only a row that another move overwrites goes through the scratch buffer; the others are copied once, after
      // those are saved and before they are put back (a destination is never the source of an unsaved move).
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
    rows_now_ = rows;
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
  int64_t eos_, pad_, start_, capture_layer_, capture_head_;
  std::vector<Request> requests_;  // in row order
  int64_t next_id_ = 0, rows_now_ = 0, slots_ = 0;
  std::vector<int64_t> free_slots_;
  std::vector<Tensor> self_key_, self_value_, scratch_key_, scratch_value_;  // (rows, h, positions, d_k) per layer
  std::shared_ptr<Tensor> block_;                                            // the workspace block they lie in
  std::vector<Tensor> cross_key_, cross_value_;                              // (slots, h, S, d_k) per layer
};

}  // namespace
