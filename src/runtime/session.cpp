#include "runtime/session.h"

#include "core/error.h"
#include "core/sys_stats.h"
#include "model/gpu_forward.h"

#include <algorithm>
#include <chrono>
#include <optional>

namespace swiftlet {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

ExpertStats minus(const ExpertStats& a, const ExpertStats& b) {
  ExpertStats d;
  d.hits = a.hits - b.hits;
  d.misses = a.misses - b.misses;
  d.evictions = a.evictions - b.evictions;
  d.bytes_read = a.bytes_read - b.bytes_read;
  d.read_seconds = a.read_seconds - b.read_seconds;
  d.wait_seconds = a.wait_seconds - b.wait_seconds;
  d.verify_seconds = a.verify_seconds - b.verify_seconds;
  d.predicted = a.predicted - b.predicted;
  d.predicted_used = a.predicted_used - b.predicted_used;
  d.skipped = a.skipped - b.skipped;
  d.low_bit = a.low_bit - b.low_bit;
  d.cache_bytes = a.cache_bytes;  // levels, not counters
  d.cache_budget = a.cache_budget;
  return d;
}

bool cancelled(const std::atomic<bool>* c) { return c && c->load(std::memory_order_relaxed); }
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "?";
}

namespace {
// The pass a session runs: the GPU's when it has a GPU model, else the CPU Forward with the
// options only it takes.
std::unique_ptr<ForwardPass> make_pass(const Model& model, const SessionOptions& opts) {
  const RoutingHooks hooks{opts.routing_observer, opts.route_override, opts.predict_next};
  if (opts.gpu) {
    if (opts.on_miss.lossy()) fail("--on-miss {} is CPU-only for now; drop --gpu or the flag", opts.on_miss.name());
    std::unique_ptr<ForwardPass> pass = make_gpu_forward(opts.gpu);
    SWIFTLET_CHECK(pass != nullptr, "a GpuModel exists only in a binary built with CUDA");
    pass->set_routing(hooks);
    return pass;
  }
  auto f = std::make_unique<Forward>(model, opts.backend);
  f->set_miss_policy(opts.on_miss);
  f->set_chunked_prefill(opts.chunked_prefill);
  f->set_routing(hooks);
  return f;
}
}  // namespace

Session::Session(const Model& model, const Tokenizer* tokenizer, SessionOptions opts)
    : model_(model), tokenizer_(tokenizer), opts_(opts), forward_(make_pass(model, opts_)),
      state_(SessionState::create(model.config)) {
  if (opts_.prefetch_masks.value_or(opts_.gpu != nullptr)) prefetcher_ = std::make_unique<MaskPrefetcher>();
}

void Session::reset() {
  forward_->reset(state_);
  logits_pos_ = -1;
  snapshots_.clear();
}

const std::vector<float>& Session::score(std::span<const int32_t> tokens, int64_t from) {
  if (tokens.empty()) fail("nothing to score: give at least one token");
  SWIFTLET_CHECK(from >= 0 && from < int64_t(tokens.size()), "score: first row {} of {} tokens", from, tokens.size());
  reset();
  const size_t chunk = size_t(std::max(1, opts_.prefill_chunk));
  if (tokens.size() <= chunk) {
    forward_->run(state_, tokens, LogitsMode::All, logits_, from);
  } else {  // a window longer than one call: its calls' rows one after another
    std::vector<float> all;
    for (size_t i = 0; i < tokens.size(); i += chunk) {
      const int64_t n = int64_t(std::min(chunk, tokens.size() - i)), first = from - int64_t(i);
      if (first >= n) {
        forward_->run(state_, tokens.subspan(i, size_t(n)), LogitsMode::None, logits_);
        continue;
      }
      forward_->run(state_, tokens.subspan(i, size_t(n)), LogitsMode::All, logits_, std::max<int64_t>(0, first));
      all.insert(all.end(), logits_.begin(), logits_.end());
    }
    logits_ = std::move(all);
  }
  logits_pos_ = -1;  // logits_ holds every row, not the last one's
  forward_->release_buffers();
  return logits_;
}

void Session::remember_snapshot() {
  if (opts_.max_snapshots <= 0 || model_.config.num_linear_layers() == 0) return;
  for (const auto& s : snapshots_)
    if (s.pos == state_.pos) return;
  if (int(snapshots_.size()) >= opts_.max_snapshots) snapshots_.erase(snapshots_.begin());
  snapshots_.push_back(forward_->snapshot(state_));
}

void Session::check_prompt(std::span<const int32_t> prompt) const {
  if (prompt.empty()) fail("the prompt is empty: give at least one token");
  if (opts_.max_context > 0 && int64_t(prompt.size()) > opts_.max_context)
    fail("the prompt has {} tokens but the context is limited to {} (raise --ctx or shorten it)",
         prompt.size(), opts_.max_context);
}

int64_t Session::rewind_for(std::span<const int32_t> prompt) {
  const auto& seen = state_.tokens;
  const size_t lcp = size_t(std::mismatch(seen.begin(), seen.end(), prompt.begin(), prompt.end()).first - seen.begin());
  const int64_t P = int64_t(prompt.size());

  // What this session's own state offers: a pure extension (or the same prompt again with its
  // logits still at hand), else the latest snapshot inside the common prefix, else nothing.
  const bool extends = int64_t(lcp) == state_.pos && (int64_t(lcp) < P || logits_pos_ == P);
  const StateSnapshot* best = nullptr;
  if (!extends)
    for (const auto& s : snapshots_)
      if (s.pos <= int64_t(lcp) && s.pos < P && (!best || s.pos > best->pos)) best = &s;
  const int64_t own = extends ? int64_t(lcp) : best ? best->pos : 0;

  // The shared cache may hold a longer prefix (another conversation's, or an earlier server's).
  if (StateCache* cache = this->cache()) {
    if (std::shared_ptr<const SavedState> hit = cache->find(prompt, own)) {
      forward_->load_state(state_, hit->state);
      if (hit->state.pos == P) {
        logits_ = hit->logits;
        logits_pos_ = P;
      } else {
        logits_pos_ = -1;
      }
      // Snapshots inside the common prefix still describe this state's past.
      std::erase_if(snapshots_, [&](const StateSnapshot& s) { return s.pos > int64_t(lcp); });
      return hit->state.pos;
    }
  }
  if (extends) return own;
  if (best) {
    forward_->restore(state_, *best);
    // Drop snapshots past the rewind point: they belong to the abandoned branch.
    std::erase_if(snapshots_, [&](const StateSnapshot& s) { return s.pos > own; });
    return own;
  }
  forward_->reset(state_);
  snapshots_.clear();
  return 0;
}

int64_t Session::prepare(std::span<const int32_t> prompt, const std::atomic<bool>* cancel,
                         std::span<const size_t> message_starts) {
  const int64_t reused = begin_prompt(prompt, 0, message_starts);
  const size_t chunk = size_t(std::max(1, opts_.prefill_chunk));
  while (prompt_pending() > 0) {
    if (cancelled(cancel)) {
      logits_pos_ = -1;
      pending_.clear();
      pending_done_ = pending_mark_ = 0;
      pending_saves_.clear();
      return reused;
    }
    feed_prompt(chunk);
  }
  return reused;
}

int64_t Session::begin_prompt(std::span<const int32_t> prompt, size_t snapshot_at,
                              std::span<const size_t> message_starts) {
  check_prompt(prompt);
  const int64_t reused = rewind_for(prompt);
  pending_.assign(prompt.begin() + reused, prompt.end());
  pending_done_ = 0;
  pending_mark_ = snapshot_at > size_t(reused) && snapshot_at < prompt.size() ? snapshot_at - size_t(reused) : 0;
  pending_saves_.clear();
  if (StateCache* cache = this->cache())
    for (size_t at : cache->checkpoints(size_t(reused), prompt.size(), snapshot_at, message_starts))
      pending_saves_.push_back(at - size_t(reused));
  if (!pending_.empty()) logits_pos_ = -1;
  else remember_snapshot();
  return reused;
}

void Session::feed_prompt(size_t max_tokens) {
  size_t n = std::min(max_tokens, prompt_pending());
  if (pending_mark_ > pending_done_) n = std::min(n, pending_mark_ - pending_done_);
  const size_t chunk = size_t(std::max(1, opts_.prefill_chunk));
  const std::span<const int32_t> all(pending_);
  while (n > 0) {
    // A call ends at the next checkpoint of the state cache: chunk boundaries change no result.
    size_t m = std::min(n, chunk);
    auto save = std::upper_bound(pending_saves_.begin(), pending_saves_.end(), pending_done_);
    if (save != pending_saves_.end()) m = std::min(m, *save - pending_done_);
    const bool last = pending_done_ + m == pending_.size();
    forward_->run(state_, all.subspan(pending_done_, m), last ? LogitsMode::Last : LogitsMode::None, logits_);
    pending_done_ += m;
    n -= m;
    if (save != pending_saves_.end() && *save == pending_done_) {
      SessionState scratch;
      cache()->put(forward_->whole_state(state_, scratch), last ? &logits_ : nullptr);
    }
  }
  if (pending_mark_ > 0 && pending_done_ == pending_mark_) remember_snapshot();
  if (pending_done_ < pending_.size()) return;
  logits_pos_ = state_.pos;
  // A long prompt grew the activation buffers to its size: do not keep that while decoding or
  // waiting for the next turn (a server keeps several sessions; the memory plan counts one
  // prompt's buffers).
  if (pending_.size() > 1) forward_->release_buffers();
  pending_.clear();
  pending_done_ = pending_mark_ = 0;
  pending_saves_.clear();
  remember_snapshot();
}

void Session::save(const std::string& path, const std::string& note) const {
  SavedState s;
  SessionState scratch;
  s.state = forward_->whole_state(state_, scratch);
  if (logits_pos_ == state_.pos && state_.pos > 0) s.logits = logits_;
  s.note = note;
  write_state_file(path, model_identity(model_), 0, s);
}

std::string Session::load(const std::string& path) {
  std::string why;
  std::optional<SavedState> s = read_state_file(path, model_.config, model_identity(model_), std::nullopt, &why);
  if (!s) fail("cannot resume from {}: {} (delete the file to start a new conversation)", path, why);
  if (opts_.max_context > 0 && s->state.pos > opts_.max_context)
    fail("cannot resume from {}: its {} tokens exceed the context of {} (raise --ctx)", path, s->state.pos,
         opts_.max_context);
  forward_->load_state(state_, s->state);
  snapshots_.clear();
  pending_.clear();
  pending_done_ = pending_mark_ = 0;
  pending_saves_.clear();
  logits_ = std::move(s->logits);
  logits_pos_ = logits_.empty() ? -1 : state_.pos;
  return std::move(s->note);
}

GenerateResult Session::generate(const GenerateRequest& req, const TokenCallback& on_token,
                                 const std::atomic<bool>* cancel) {
  Generation gen(*this, req, on_token, cancel);
  // The mask of the answer's first state is made during the prompt, each next one during the
  // step that runs the token before it.
  auto prefetch = [&] {
    if (prefetcher_ && req.constraint) prefetcher_->submit(req.constraint->next_mask());
  };
  prefetch();
  gen.prompt_done(prepare(req.prompt, cancel, req.message_starts));
  while (std::optional<int32_t> next = gen.next()) {
    prefetch();
    forward_->run(state_, std::span(&*next, 1), LogitsMode::Last, logits_);
    logits_pos_ = state_.pos;
  }
  return gen.finish();
}

// ------------------------------------------------------------------------------ Generation

Generation::Generation(Session& session, const GenerateRequest& req, TokenCallback on_token,
                       const std::atomic<bool>* cancel)
    : s_(session), req_(req), on_token_(std::move(on_token)), cancel_(cancel),
      t0_(Clock::now()), sampler_((validate(req.sampling), req.sampling), int(session.model_.config.vocab_size)),
      stops_(req.stop), history_(req.prompt.begin(), req.prompt.end()) {
  if (req.max_new_tokens < 0) fail("max new tokens must be >= 0, got {}", req.max_new_tokens);
  if (s_.model_.experts) experts_before_ = s_.model_.experts->expert_stats();
  if (s_.opts_.gpu) gpu_before_ = gpu_stats(*s_.opts_.gpu);
  if (s_.tokenizer_) decoder_.emplace(*s_.tokenizer_, /*skip_special=*/true);
}

void Generation::prompt_done(int64_t reused) {
  GenerateStats& st = res_.stats;
  st.prompt_tokens = int64_t(req_.prompt.size());
  st.reused_tokens = reused;
  st.prefilled_tokens = st.prompt_tokens - st.reused_tokens;
  st.prefill_seconds = since(t0_);
  if (s_.logits_pos_ != s_.state_.pos) {
    res_.finish = FinishReason::Cancelled;
    finished_ = true;
  } else {
    s_.remember_snapshot();
  }
}

bool Generation::emit(const std::string& text, int32_t token) {
  if (text.empty()) return true;
  res_.text += text;
  return !on_token_ || on_token_(text, token);
}

std::optional<int32_t> Generation::next() {
  if (finished_) return std::nullopt;
  if (i_ >= req_.max_new_tokens) {
    finished_ = true;  // Length
    return std::nullopt;
  }
  if (cancelled(cancel_)) {
    res_.finish = FinishReason::Cancelled;
    finished_ = true;
    return std::nullopt;
  }
  s_.logits_pos_ = -1;  // sampling (and the constraint) modifies the logits in place
  const Clock::time_point t_sample = Clock::now();
  const int32_t next = req_.constraint ? sample_constrained(sampler_, *req_.constraint, s_.logits_,
                                                            history_, req_.max_new_tokens - i_)
                                       : sampler_.sample(s_.logits_, history_);
  res_.stats.sample_seconds += since(t_sample);
  if (i_ == 0) {
    t_first_ = Clock::now();
    res_.stats.ttft_seconds = since(t0_);
  }
  res_.tokens.push_back(next);
  history_.push_back(next);
  if (std::find(req_.stop_tokens.begin(), req_.stop_tokens.end(), next) != req_.stop_tokens.end()) {
    res_.finish = FinishReason::Stop;
    finished_ = true;
    return std::nullopt;
  }
  if (decoder_) {
    StopMatcher::Result r = stops_.feed(decoder_->push(next));
    if (!emit(r.text, next)) res_.finish = FinishReason::Cancelled;
    if (r.stopped) {
      res_.finish = FinishReason::Stop;
      res_.stop_string = stops_.matched_stop();
      finished_ = true;
      return std::nullopt;
    }
  } else if (on_token_ && !on_token_("", next)) {
    res_.finish = FinishReason::Cancelled;
  }
  ++i_;
  // Cancelled by the callback; or Length: the last token is kept but not fed.
  if (res_.finish == FinishReason::Cancelled || i_ == req_.max_new_tokens) {
    finished_ = true;
    return std::nullopt;
  }
  return next;
}

GenerateResult Generation::finish() {
  SWIFTLET_CHECK(finished_, "Generation::finish before the answer is complete");
  if (decoder_ && res_.finish != FinishReason::Stop) {
    std::string tail = decoder_->flush();
    StopMatcher::Result r = stops_.feed(tail);
    std::string rest = r.text + (r.stopped ? "" : stops_.flush());
    if (r.stopped) {
      res_.finish = FinishReason::Stop;
      res_.stop_string = stops_.matched_stop();
    }
    emit(rest, res_.tokens.empty() ? -1 : res_.tokens.back());
  }
  GenerateStats& st = res_.stats;
  st.generated_tokens = int64_t(res_.tokens.size());
  if (!res_.tokens.empty()) st.decode_seconds = since(t_first_);
  if (s_.model_.experts) st.experts = minus(s_.model_.experts->expert_stats(), experts_before_);
  st.on_miss = s_.opts_.on_miss;
  if (s_.opts_.gpu) {
    st.on_gpu = true;
    st.gpu = gpu_stats(*s_.opts_.gpu);
    st.gpu.hits -= gpu_before_.hits;
    st.gpu.misses -= gpu_before_.misses;
    st.gpu.evictions -= gpu_before_.evictions;
    st.gpu.bytes_uploaded -= gpu_before_.bytes_uploaded;
    st.gpu.upload_seconds -= gpu_before_.upload_seconds;
  }
  st.peak_rss = peak_rss_bytes();
  return std::move(res_);
}

}  // namespace swiftlet
