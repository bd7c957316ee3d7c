// The one search: beam search for requests that join and leave between steps, each on its own rows with its own
// budget, minimum, length penalty and capture, as transformers' generate(num_beams=k, early_stopping=True).
#pragma once

#include "common.h"

namespace {

// One row's m candidates from its `pool` best columns, best first (of equal values the lower column first), with
// the constraints: pad never, eos not while `banned`, eos alone (log-probability 0) when `ending`. Each value is
// (v - top) - log_sum: a log-probability from a logit (the compiled step), or v itself (top = log_sum = 0).
void row_candidates(const float* v, const int64_t* column, int64_t pool, float top, float log_sum, int64_t m,
                    bool banned, bool ending, int64_t eos, int64_t pad, float* values, int64_t* tokens) {
  const float inf = std::numeric_limits<float>::infinity();
  if (ending) {  // eos at 0, then the lowest other columns at -inf
    values[0] = 0.0f;
    tokens[0] = eos;
    for (int64_t j = 1, c = 0; j < m; ++c) {
      if (c == eos) continue;
      values[j] = -inf;
      tokens[j++] = c;
    }
    return;
  }
  std::vector<std::pair<float, int64_t>> picked;
  std::vector<int64_t> left_out;
  for (int64_t j = 0; j < pool; ++j) {
    if (column[j] == pad || (banned && column[j] == eos)) {
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
      values[j] = picked[j].first;
      tokens[j] = picked[j].second;
    } else {  // a vocabulary of at most m + 1 tokens: the banned ones at -inf, lower column first
      values[j] = -inf;
      tokens[j] = left_out[j - picked.size()];
    }
  }
}

class BeamSearch {
 public:
  // A streamed token: (request, its position in the output, token, its log-probability, the attention row the
  // request captures: every layer's and head's (L, h, S), one head's (S,), or None).
  using Token = std::tuple<int64_t, int64_t, int64_t, double, c10::optional<Tensor>>;
  // A finished hypothesis: (tokens, their log-probabilities, length-normalised score, its attention: (T, L, h, S),
  // (T, S), or None).
  // The last: which tokens a constraint set (empty without constraints).
  using Hypothesis =
      std::tuple<std::vector<int64_t>, std::vector<double>, double, c10::optional<Tensor>, std::vector<bool>>;
  using Done = std::tuple<int64_t, std::vector<Hypothesis>>;  // a request and its hypotheses, best first

  // A step's rows: each request's side by side in request order, a new request on one row (it stands for its k
  // beams), the others on k.
  struct Layout {
    std::vector<int64_t> ids, positions, slots, source_lengths;
    std::vector<int64_t> previous;                         // the row each continues at the last step
    std::vector<char> banned, ending;                      // may not end yet; must end now
    int64_t rows = 0, width = 0, source_width = 0, widest_beam = 1, longest_budget = 0;
    bool every_head = false, one_head = false;
    bool same_sources = false;  // every row continues a row of its own request: only self-attention K/V move
    bool unchanged = false;     // every row is where it was (rows joined since come after): nothing moves
    // per row the tokens whose log-probabilities a constrained request needs beside its candidates: `wanted_width`
    // a row, -1 where none
    std::vector<int64_t> wanted;
    int64_t wanted_width = 0;
  };

  BeamSearch(int64_t eos, int64_t pad, int64_t start, int64_t positions)
      : eos_(eos), pad_(pad), start_(start), positions_(positions) {}

  // Requests join: per request its source length, beam size, length budget, minimum new tokens, length penalty,
  // Capture, whether its tokens are streamed, and the source slot its cross-attention K/V sit in. They decode
  // from the next step; returns their ids.
  std::vector<int64_t> join(const std::vector<int64_t>& lengths, const std::vector<int64_t>& beams,
                            const std::vector<int64_t>& budgets, const std::vector<int64_t>& min_new_tokens,
                            const std::vector<double>& length_penalties, const std::vector<int64_t>& captures,
                            const std::vector<bool>& streams, const std::vector<int64_t>& slots,
                            const std::vector<std::vector<std::vector<int64_t>>>& constraints = {},
                            const std::vector<std::vector<int64_t>>& forced = {}) {
    const size_t count = lengths.size();
    TORCH_CHECK(constraints.empty() || constraints.size() == count, "one list of constraints per source");
    TORCH_CHECK(forced.empty() || forced.size() == count, "one forced target (or none) per source");
    TORCH_CHECK(beams.size() == count && budgets.size() == count && min_new_tokens.size() == count &&
                    length_penalties.size() == count && captures.size() == count && streams.size() == count &&
                    slots.size() == count,
                "one length, beam size, budget, minimum, penalty, capture and stream flag per source");
    for (size_t i = 0; i < count; ++i) {
      TORCH_CHECK(beams[i] >= 1 && budgets[i] >= 1 && lengths[i] >= 1, "a bad request");
      TORCH_CHECK(budgets[i] <= positions_, "a budget past the model's positions");
      TORCH_CHECK(forced.empty() || forced[i].empty() || (beams[i] == 1 && budgets[i] == int64_t(forced[i].size())),
                  "a forced target decodes on one beam, its length its budget");
    }
    std::vector<int64_t> ids;
    for (size_t i = 0; i < count; ++i) {
      Request request;
      request.id = next_id_++;
      request.k = beams[i];
      request.budget = budgets[i];
      request.min_new_tokens = min_new_tokens[i];
      request.length_penalty = length_penalties[i];
      request.capture = captures[i];
      request.stream = streams[i];
      request.length = lengths[i];
      request.slot = slots[i];
      request.running.assign(request.k, kNeg);
      request.running[0] = 0.0f;  // the k beams start as one: only the first may be extended at step 0
      request.finished.assign(request.k, kNeg);
      request.finished_done.assign(request.k, 0);
      request.paths.resize(request.k);
      request.finished_paths.resize(request.k);
      request.next_tokens = {start_};
      request.fresh_row = pending_fresh_++;
      if (!forced.empty()) request.target = forced[i];
      if (!constraints.empty()) {
        for (const auto& phrase : constraints[i])
          if (!phrase.empty()) request.constraints.push_back(phrase);
        for (Path& path : request.paths) path.met.assign(request.constraints.size(), 0);
      }
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

  // Rows the next step decodes, and requests held.
  int64_t rows() const {
    int64_t rows = 0;
    for (const Request& request : requests_)
      if (!request.cancelled) rows += request.rows();
    return rows;
  }
  int64_t size() const { return static_cast<int64_t>(requests_.size()); }
  // Rows once every request runs its k beams: what a storage reserves.
  int64_t beam_rows() const {
    int64_t rows = 0;
    for (const Request& request : requests_)
      if (!request.cancelled) rows += request.k;
    return rows;
  }

  // The next step's rows (cancelled requests leave first). A new request's row is numbered, in `previous`, after
  // the last step's rows, in the order the requests joined (where a storage appends them).
  const Layout& plan() {
    std::vector<Request> kept;
    for (Request& request : requests_) {
      if (request.cancelled) {
        freed_.push_back(request.slot);
        left_ = true;
      } else {
        kept.push_back(std::move(request));
      }
    }
    requests_ = std::move(kept);
    Layout& out = layout_;
    out = Layout();
    if (requests_.empty()) {  // the storage holds nothing from here on
      last_rows_ = pending_fresh_ = 0;
      left_ = false;
      return out;
    }
    bool expanding = false;
    for (Request& request : requests_) {
      request.first_row = out.rows;
      for (int64_t j = 0; j < request.rows(); ++j) {
        out.ids.push_back(request.next_tokens[j]);
        out.positions.push_back(request.step);
        out.slots.push_back(request.slot);
        out.source_lengths.push_back(request.length);
        out.previous.push_back(request.step == 0 ? last_rows_ + request.fresh_row : request.from[j]);
        out.banned.push_back(request.step + 1 < request.min_new_tokens);
        out.ending.push_back(request.target.empty() && request.budget <= request.step + 1);
      }
      expanding = expanding || (request.step == 1 && request.k > 1);
      out.rows += request.rows();
      out.width = std::max(out.width, request.step + 1);
      out.source_width = std::max(out.source_width, request.length);
      out.widest_beam = std::max(out.widest_beam, request.k);
      out.longest_budget = std::max(out.longest_budget, request.budget);
      out.every_head = out.every_head || request.capture == kCaptureEveryHead;
      out.one_head = out.one_head || request.capture == kCaptureOneHead;
    }
    for (const Request& request : requests_)
      for (int64_t j = 0; j < request.rows(); ++j)
        out.wanted_width = std::max<int64_t>(out.wanted_width, allowed(request, request.paths[j]).size());
    out.wanted.assign(out.rows * out.wanted_width, -1);
    for (const Request& request : requests_) {
      for (int64_t j = 0; j < request.rows(); ++j) {
        const std::vector<int64_t> tokens = allowed(request, request.paths[j]);
        std::copy(tokens.begin(), tokens.end(), out.wanted.begin() + (request.first_row + j) * out.wanted_width);
      }
    }
    out.same_sources = !left_ && !expanding;
    out.unchanged = !left_;
    for (int64_t r = 0; r < out.rows && out.unchanged; ++r) out.unchanged = out.previous[r] == r;
    return out;
  }

  // The rows of the requests still running laid out as `plan` would, and taken as where they are from now on: a
  // storage Python holds moves its rows right after a step (`previous`), so that the rows joining next follow
  // them and the next step's layout is unchanged.
  const Layout& compact() {
    plan();
    for (Request& request : requests_)
      for (int64_t j = 0; j < static_cast<int64_t>(request.from.size()); ++j) request.from[j] = request.first_row + j;
    last_rows_ = layout_.rows;
    left_ = false;
    return layout_;
  }

  // The planned step's candidates (lp, tk: m per row, best first, m at least twice the widest beam) and the
  // attention rows it computed ((N, L, h, S) and (N, S); undefined where no request keeps them): every request's
  // search advances. Returns the streamed tokens and the requests that are done, with their hypotheses.
  std::pair<std::vector<Token>, std::vector<Done>> advance(const float* lp, const int64_t* tk, int64_t m,
                                                           const Tensor& all_heads, const Tensor& head_rows,
                                                           const float* wanted_lp = nullptr) {
    std::vector<Token> tokens;
    std::vector<Done> finished;
    std::vector<Request> kept;
    for (Request& request : requests_) {
      Tensor attention;  // this step's rows of the request, cut to its source: (n, L, h, S) or (n, S)
      if (request.capture == kCaptureEveryHead || request.capture == kCaptureOneHead) {
        const Tensor& from = request.capture == kCaptureEveryHead ? all_heads : head_rows;
        attention = from.narrow(0, request.first_row, request.rows()).narrow(-1, 0, request.length).clone();
      }
      const int64_t width = layout_.wanted_width, first = request.first_row;
      const bool done = !request.target.empty()
                            ? advance_forced(request, wanted_lp[first * width], attention)
                            : advance(request, lp + first * m, tk + first * m, m, wanted_lp + first * width,
                                      layout_.wanted.data() + first * width, width, attention);
      if (request.stream) settled(request, done, tokens);
      if (done) {
        finished.emplace_back(request.id, hypotheses(request));
        freed_.push_back(request.slot);
      } else {
        kept.push_back(std::move(request));
      }
    }
    left_ = kept.size() < requests_.size();
    last_rows_ = layout_.rows;
    pending_fresh_ = 0;
    requests_ = std::move(kept);
    return {tokens, finished};
  }

  // `advance` from each planned row's `pool` best log-probabilities and their tokens (N, P) on the host (a step
  // Python drives), made into its m candidates under the constraints.
  // `wanted`: each row's log-probabilities of the layout's wanted tokens (N, wanted_width), where it has any.
  std::pair<std::vector<Token>, std::vector<Done>> advance_pools(const Tensor& values, const Tensor& tokens, int64_t m,
                                                                 const c10::optional<Tensor>& all_heads,
                                                                 const c10::optional<Tensor>& head_rows,
                                                                 const c10::optional<Tensor>& wanted) {
    at::InferenceMode guard;
    const Tensor v = values.contiguous(), t = tokens.contiguous();
    TORCH_CHECK(plain_cpu(v) && t.scalar_type() == at::kLong && v.size(0) == layout_.rows && t.sizes() == v.sizes(),
                "one row of float32 values and long tokens per planned row, on the host");
    const int64_t rows = layout_.rows, pool = v.size(1);
    std::vector<float> best(rows * m);
    std::vector<int64_t> best_tokens(rows * m);
    for (int64_t r = 0; r < rows; ++r)
      row_candidates(v.data_ptr<float>() + r * pool, t.data_ptr<int64_t>() + r * pool, pool, 0.0f, 0.0f, m,
                     layout_.banned[r], layout_.ending[r], eos_, pad_, best.data() + r * m, best_tokens.data() + r * m);
    const Tensor w = wanted ? wanted->contiguous() : Tensor();
    TORCH_CHECK(layout_.wanted.empty() || (w.defined() && w.numel() == static_cast<int64_t>(layout_.wanted.size())),
                "the wanted tokens' values");
    return advance(best.data(), best_tokens.data(), m, all_heads.value_or(Tensor()), head_rows.value_or(Tensor()),
                   w.defined() ? w.data_ptr<float>() : nullptr);
  }

  // A wanted token's log-probability under the constraints row_candidates applies.
  float constrained_logprob(float value, int64_t token, bool banned, bool ending) const {
    const float inf = std::numeric_limits<float>::infinity();
    if (token < 0 || token == pad_ || (banned && token == eos_)) return -inf;
    if (ending) return token == eos_ ? 0.0f : -inf;
    return value;
  }

  // The source slots of the requests that left since the last call.
  std::vector<int64_t> take_freed() { return std::exchange(freed_, {}); }

  // The target tokens that continue a word (no word boundary before them): a constraint is a whole word, so one
  // followed by such a token is not met.
  void set_word_continuations(const std::vector<int64_t>& tokens) {
    continues_.assign(0, 0);
    for (int64_t token : tokens) {
      if (token >= static_cast<int64_t>(continues_.size())) continues_.resize(token + 1, 0);
      continues_[token] = 1;
    }
  }

 private:
  static constexpr float kNeg = -1.0e9f;

  // One beam's tokens so far, their log-probabilities and the attention rows that produced them.
  struct Path {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
    std::vector<Tensor> attention;
    // under constraints: which are met, the one under way and its tokens so far, and the tokens they set
    std::vector<char> met, forced;
    int64_t phrase = -1, progress = 0, met_tokens = 0;
    int64_t closing = -1;  // the constraint its last token completed: a token that continues the word undoes it
  };

  struct Request {
    int64_t id = 0, k = 1, budget = 1, min_new_tokens = 0, capture = kCaptureNothing, length = 1, slot = 0;
    double length_penalty = 1.0;
    bool stream = false, cancelled = false;
    int64_t step = 0;       // tokens decoded so far: its rows' next position
    size_t emitted = 0;     // tokens streamed so far
    int64_t first_row = 0;  // where its rows are at this step
    int64_t fresh_row = 0;  // before its first step: its row's place among the rows joined since the last step
    std::vector<float> running, finished;  // summed log-probabilities; the finished slots' normalised scores
    std::vector<char> finished_done;
    bool improvable = true;
    std::vector<Path> paths, finished_paths;  // the running beams', the finished slots'
    std::vector<int64_t> next_tokens;         // each row's input at its next step
    std::vector<int64_t> from;                // the row (at the last step) each of its rows continues
    std::vector<std::vector<int64_t>> constraints;  // token sequences every finished hypothesis contains
    std::vector<int64_t> target;                    // a target teacher-forced (an explanation's pass), eos included

    int64_t rows() const { return step == 0 ? 1 : k; }
  };

  // One beam step for one request on its rows' candidates (`stride` per row, the first 2k read); returns whether
  // it is done. Its first step has one row, which stands for its k beams. Under lexical constraints this is dynamic
  // beam allocation (Post & Vilar 2018, as Sockeye's): the tokens its constraints want (`wanted`: `width` a row,
  // their log-probabilities in `wanted_lp`) join each beam's 2k best, eos waits until every constraint is met (or
  // the budget ends), and the k beams that run on are shared out between banks of hypotheses by constraint tokens
  // met. Without constraints there is one bank: transformers' beam step.
  bool advance(Request& request, const float* lp, const int64_t* tk, int64_t stride, const float* wanted_lp,
               const int64_t* wanted, int64_t width, const Tensor& attention) {
    const int64_t k = request.k;
    const bool one_row = request.step == 0 && k > 1, constrained = !request.constraints.empty();
    const bool ending = request.budget <= request.step + 1, banned = request.step + 1 < request.min_new_tokens;
    const float divisor =
        static_cast<float>(std::pow(static_cast<double>(request.step + 1), request.length_penalty));
    const auto better = [](float x, float y) {  // at::topk's order: larger first, NaN largest
      return std::isnan(x) != std::isnan(y) ? std::isnan(x) : x > y;
    };
    struct Candidate {
      float score;
      int64_t beam, token;
      float logprob;
      bool hit;
      Path path;  // under constraints its path (their state); otherwise made only for the candidates kept
    };
    std::vector<Candidate> candidates;
    const auto path_of = [&](const Candidate& c) {
      return constrained ? c.path
                         : extended(request.paths[c.beam], c.token, c.logprob, attention, one_row ? 0 : c.beam);
    };
    for (int64_t b = 0; b < k; ++b) {
      // beams that do not exist yet compete at -1e9, as transformers' do, except under constraints
      if (constrained && request.running[b] <= kNeg / 2) continue;
      const int64_t row = one_row ? 0 : b;
      std::vector<int64_t> seen;
      const auto consider = [&](int64_t token, float logprob) {
        if (constrained && (std::find(seen.begin(), seen.end(), token) != seen.end() || std::isinf(logprob))) return;
        seen.push_back(token);
        Candidate c{request.running[b] + logprob, b, token, logprob, token == eos_ || ending, Path()};
        if (constrained) {
          c.path = extended(request.paths[b], token, logprob, attention, row);
          c.path.forced.push_back(0);
          constrain(request, c.path);
          if (c.hit && !ending && !all_met(c.path)) return;  // eos waits for the constraints
        }
        candidates.push_back(std::move(c));
      };
      for (int64_t j = 0; j < 2 * k; ++j) consider(tk[row * stride + j], lp[row * stride + j]);
      for (int64_t j = 0; j < width; ++j)  // their raw log-probabilities, under the candidates' constraints here
        if (wanted[row * width + j] >= 0)
          consider(wanted[row * width + j], constrained_logprob(wanted_lp[row * width + j], wanted[row * width + j],
                                                                banned, ending));
    }
    std::stable_sort(candidates.begin(), candidates.end(),
                     [&](const Candidate& x, const Candidate& y) { return better(x.score, y.score); });
    int64_t total = 0;
    for (const auto& phrase : request.constraints) total += static_cast<int64_t>(phrase.size());
    // banks by constraint tokens met: k / banks places each, the rest to the fullest, places a bank cannot fill
    // passed down, then up (with fewer beams than banks the fullest take them: every step makes progress)
    const int64_t banks = total + 1;
    std::vector<int64_t> counts(banks, 0), places(banks, k / banks);
    places[banks - 1] += k % banks;
    for (const Candidate& c : candidates)
      if (!c.hit) ++counts[c.path.met_tokens];
    int64_t spare = 0;
    for (int64_t bank = banks - 1; bank >= 0; --bank) {
      places[bank] += spare;
      spare = std::max<int64_t>(0, places[bank] - counts[bank]);
      places[bank] -= spare;
    }
    for (int64_t bank = banks - 1; bank >= 0 && spare > 0; --bank) {
      const int64_t more = std::min(spare, counts[bank] - places[bank]);
      places[bank] += more;
      spare -= more;
    }
    // the k best that do not end run on, by bank; one that ends among its bank's first k finishes
    std::vector<const Candidate*> running;
    std::vector<int64_t> rank_in_bank(banks, 0);
    std::vector<char> taking(candidates.size(), 0);
    int64_t complete_hits = 0;  // at the budget every candidate ends: the complete ones first, then the fullest
    if (ending)
      for (const Candidate& c : candidates) complete_hits += all_met(c.path);
    int64_t taken_complete = 0, taken_other = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const Candidate& c = candidates[i];
      const int64_t bank = c.path.met_tokens;
      if (c.hit && ending) {
        taking[i] = all_met(c.path) ? taken_complete++ < k : taken_other++ < k - std::min(k, complete_hits);
      } else if (c.hit) {
        taking[i] = rank_in_bank[bank] < k;
      } else if (places[bank] > 0) {
        --places[bank];
        running.push_back(&c);
      }
      ++rank_in_bank[bank];
    }
    // the finished slots merged with this step's finishing candidates: the k best stay
    bool all_done = true;
    for (int64_t j = 0; j < k; ++j) all_done = all_done && request.finished_done[j];
    std::vector<std::pair<float, int64_t>> merged;
    for (int64_t j = 0; j < k; ++j) merged.emplace_back(request.finished[j], j);
    for (size_t i = 0; i < candidates.size(); ++i) {
      const bool eligible = taking[i] && request.improvable && !all_done;
      // one cut by the budget before its constraints were met ranks below every complete one
      const float cut = all_met(candidates[i].path) ? 0.0f : kNeg;
      if (taking[i])
        merged.emplace_back(eligible ? candidates[i].score / divisor + cut : candidates[i].score + 2.0f * kNeg,
                            k + static_cast<int64_t>(i));
    }
    std::stable_sort(merged.begin(), merged.end(),
                     [&](const auto& x, const auto& y) { return better(x.first, y.first); });
    std::vector<Path> finished_paths(k);
    std::vector<float> kept_scores(k);
    std::vector<char> kept_done(k);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = merged[j].second;
      kept_scores[j] = merged[j].first;
      kept_done[j] = slot < k ? request.finished_done[slot] : 1;
      finished_paths[j] = slot < k ? request.finished_paths[slot] : path_of(candidates[slot - k]);
    }
    const float* best = running.empty() ? nullptr : &running[0]->score;
    if (keep_finished(request, kept_scores, kept_done, std::move(finished_paths), best, divisor)) return true;
    std::vector<Path> paths(k);
    request.from.resize(k);
    request.next_tokens.resize(k);
    for (int64_t j = 0; j < k; ++j) {  // fewer candidates than beams (a tiny vocabulary): the rest do not exist
      const bool real = j < static_cast<int64_t>(running.size());
      const Candidate& c = *running[real ? j : running.size() - 1];
      request.running[j] = real ? c.score : kNeg;
      paths[j] = path_of(c);
      request.from[j] = request.first_row + (one_row ? 0 : c.beam);
      request.next_tokens[j] = c.token;
    }
    request.paths = std::move(paths);
    ++request.step;
    return false;
  }

  // The k finished slots kept (scores, whether each holds a hypothesis, paths); then whether the request is done:
  // every slot holds one, or no running beam (`best_running`: the best one's score; null: none) can beat the worst.
  static bool keep_finished(Request& request, const std::vector<float>& scores, const std::vector<char>& held,
                            std::vector<Path> paths, const float* best_running, float divisor) {
    float worst = scores[0];
    bool every_done = true;
    for (int64_t j = 0; j < request.k; ++j) {
      request.finished[j] = scores[j];
      request.finished_done[j] = held[j];
      worst = std::min(worst, scores[j]);
      every_done = every_done && held[j];
    }
    request.finished_paths = std::move(paths);
    if (best_running == nullptr) return true;
    const float best_possible = *best_running / divisor;
    bool can_improve = false;
    for (int64_t j = 0; j < request.k; ++j) can_improve = can_improve || best_possible > (held[j] ? worst : kNeg);
    request.improvable = request.improvable && can_improve;
    return !request.improvable || every_done;
  }

  // The tokens a constrained hypothesis may take next to advance its constraints: the next of the one under way,
  // else the first of each unmet one.
  static std::vector<int64_t> allowed(const Request& request, const Path& path) {
    if (!request.target.empty()) return {request.target[request.step]};
    std::vector<int64_t> tokens;
    if (request.constraints.empty()) return tokens;
    if (path.phrase >= 0) return {request.constraints[path.phrase][path.progress]};
    for (size_t c = 0; c < request.constraints.size(); ++c)
      if (!path.met[c] && std::find(tokens.begin(), tokens.end(), request.constraints[c][0]) == tokens.end())
        tokens.push_back(request.constraints[c][0]);
    return tokens;
  }

  static bool all_met(const Path& path) {
    return path.phrase < 0 && std::all_of(path.met.begin(), path.met.end(), [](char met) { return met != 0; });
  }

  // `path` after its last token: a constraint under way goes on or is given up (its tokens no longer marked), an
  // unmet one whose first token this is starts.
  void constrain(const Request& request, Path& path) const {
    const int64_t token = path.tokens.back();
    if (path.closing >= 0) {  // the word a constraint ended goes on: it was not the term
      const int64_t c = path.closing, length = static_cast<int64_t>(request.constraints[c].size());
      path.closing = -1;
      if (token < static_cast<int64_t>(continues_.size()) && continues_[token]) {
        path.met[c] = 0;
        for (int64_t i = 0; i < length; ++i) path.forced[path.forced.size() - 2 - i] = 0;
        path.met_tokens -= length;
      }
    }
    if (path.phrase >= 0) {
      const std::vector<int64_t>& phrase = request.constraints[path.phrase];
      if (token == phrase[path.progress]) {
        path.forced.back() = 1;
        ++path.met_tokens;
        if (++path.progress == static_cast<int64_t>(phrase.size())) {
          path.met[path.phrase] = 1;
          path.closing = path.phrase;
          path.phrase = -1;
          path.progress = 0;
        }
        return;
      }
      for (int64_t i = 0; i < path.progress; ++i) path.forced[path.forced.size() - 2 - i] = 0;
      path.met_tokens -= path.progress;
      path.phrase = -1;
      path.progress = 0;
    }
    for (size_t c = 0; c < request.constraints.size(); ++c) {
      if (path.met[c] || request.constraints[c][0] != token) continue;
      path.forced.back() = 1;
      ++path.met_tokens;
      if (request.constraints[c].size() == 1) {
        path.met[c] = 1;
        path.closing = static_cast<int64_t>(c);
      } else {
        path.phrase = static_cast<int64_t>(c);
        path.progress = 1;
      }
      return;
    }
  }

  // A forced request's step: its next target token at the model's log-probability, whatever the search would pick.
  bool advance_forced(Request& request, float logprob, const Tensor& attention) {
    Path& path = request.paths[0];
    path.tokens.push_back(request.target[request.step]);
    path.logprobs.push_back(logprob);
    if (attention.defined()) path.attention.push_back(attention[0]);
    request.running[0] += logprob;
    request.next_tokens = {path.tokens.back()};
    request.from = {request.first_row};
    if (++request.step < static_cast<int64_t>(request.target.size())) return false;
    request.finished[0] = request.running[0];
    request.finished_done[0] = 1;
    request.finished_paths[0] = path;
    return true;
  }

  // Hand out a streamed request's tokens that no later step can take back: the prefix its running beams and its
  // finished hypotheses share (greedy: each token as it comes), and once it is done the rest of its best. So a
  // stream is always a prefix of the final answer.
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

  // A beam's path with one more token (and its row's attention).
  static Path extended(Path path, int64_t token, float logprob, const Tensor& attention, int64_t row) {
    path.tokens.push_back(token);
    path.logprobs.push_back(logprob);
    if (attention.defined()) path.attention.push_back(attention[row]);
    return path;
  }

  static std::vector<Hypothesis> hypotheses(const Request& request) {
    std::vector<Hypothesis> out;
    for (int64_t j = 0; j < request.k; ++j) {
      if (!request.finished_done[j]) continue;
      const Path& path = request.finished_paths[j];
      std::vector<double> logprobs(path.logprobs.begin(), path.logprobs.end());
      c10::optional<Tensor> attention;
      if (!path.attention.empty()) attention = at::stack(path.attention, 0);
      out.emplace_back(path.tokens, logprobs, static_cast<double>(request.finished[j]), attention,
                       std::vector<bool>(path.forced.begin(), path.forced.end()));
    }
    return out;
  }

  int64_t eos_, pad_, start_, positions_;
  std::vector<Request> requests_;  // in row order
  int64_t next_id_ = 0, last_rows_ = 0, pending_fresh_ = 0;
  bool left_ = false;  // a request left since the last step
  std::vector<int64_t> freed_;
  Layout layout_;
  std::vector<char> continues_;  // by token: continues a word
};

}  // namespace
