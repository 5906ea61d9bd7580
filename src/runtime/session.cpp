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
  if (opts.gpu) {
    if (opts.routing_observer || opts.route_override)
      fail("expert traces and routing overrides run on the CPU only: drop --gpu");
    std::unique_ptr<ForwardPass> pass = make_gpu_forward(opts.gpu);
    SWIFTLET_CHECK(pass != nullptr, "a GpuModel exists only in a binary built with CUDA");
    return pass;
  }
  auto f = std::make_unique<Forward>(model, opts.backend);
  f->set_predict_next(opts.predict_next);
  f->set_chunked_prefill(opts.chunked_prefill);
  f->set_routing_observer(opts.routing_observer);
  f->set_route_override(opts.route_override);
  return f;
}
}  // namespace

Session::Session(const Model& model, const Tokenizer* tokenizer, SessionOptions opts)
    : model_(model), tokenizer_(tokenizer), opts_(opts), forward_(make_pass(model, opts_)),
      state_(SessionState::create(model.config)) {}

void Session::reset() {
  forward_->reset(state_);
  logits_pos_ = -1;
  snapshots_.clear();
}

void Session::feed(std::span<const int32_t> tokens, const std::atomic<bool>* cancel) {
  const size_t chunk = size_t(std::max(1, opts_.prefill_chunk));
  for (size_t i = 0; i < tokens.size(); i += chunk) {
    if (cancelled(cancel)) {
      logits_pos_ = -1;
      return;
    }
    const size_t n = std::min(chunk, tokens.size() - i);
    const bool last = i + n == tokens.size();
    forward_->run(state_, tokens.subspan(i, n), last ? LogitsMode::Last : LogitsMode::None, logits_);
  }
  logits_pos_ = state_.pos;
  // A long prompt grew the activation buffers to its size: do not keep that while decoding or
  // waiting for the next turn (a server keeps several sessions; the memory plan counts one
  // prompt's buffers).
  if (tokens.size() > 1) forward_->release_buffers();
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

int64_t Session::prepare(std::span<const int32_t> prompt, const std::atomic<bool>* cancel) {
  if (prompt.empty()) fail("the prompt is empty: give at least one token");
  if (opts_.max_context > 0 && int64_t(prompt.size()) > opts_.max_context)
    fail("the prompt has {} tokens but the context is limited to {} (raise --ctx or shorten it)",
         prompt.size(), opts_.max_context);
  const auto& seen = state_.tokens;
  const size_t lcp = size_t(std::mismatch(seen.begin(), seen.end(), prompt.begin(), prompt.end()).first - seen.begin());
  const int64_t P = int64_t(prompt.size());

  if (int64_t(lcp) == state_.pos && (int64_t(lcp) < P || logits_pos_ == P)) {
    // Pure extension (or the same prompt again with its logits still at hand).
    if (int64_t(lcp) < P) feed(prompt.subspan(lcp), cancel);
    return int64_t(lcp);
  }
  // Diverged (or nothing left to feed): rewind to the latest snapshot inside the common prefix.
  const StateSnapshot* best = nullptr;
  for (const auto& s : snapshots_)
    if (s.pos <= int64_t(lcp) && s.pos < P && (!best || s.pos > best->pos)) best = &s;
  if (best) {
    forward_->restore(state_, *best);
    const int64_t reused = best->pos;
    // Drop snapshots past the rewind point: they belong to the abandoned branch.
    std::erase_if(snapshots_, [&](const StateSnapshot& s) { return s.pos > reused; });
    feed(prompt.subspan(size_t(reused)), cancel);
    return reused;
  }
  forward_->reset(state_);
  snapshots_.clear();
  feed(prompt, cancel);
  return 0;
}

GenerateResult Session::generate(const GenerateRequest& req, const TokenCallback& on_token,
                                 const std::atomic<bool>* cancel) {
  if (req.max_new_tokens < 0) fail("max new tokens must be >= 0, got {}", req.max_new_tokens);
  validate(req.sampling);
  GenerateResult res;
  GenerateStats& st = res.stats;
  const ExpertStats experts_before = model_.experts ? model_.experts->expert_stats() : ExpertStats{};
  const GpuStats gpu_before = opts_.gpu ? gpu_stats(*opts_.gpu) : GpuStats{};
  const auto t0 = Clock::now();

  st.prompt_tokens = int64_t(req.prompt.size());
  st.reused_tokens = prepare(req.prompt, cancel);
  st.prefilled_tokens = st.prompt_tokens - st.reused_tokens;
  st.prefill_seconds = since(t0);
  if (logits_pos_ != state_.pos) res.finish = FinishReason::Cancelled;
  else remember_snapshot();

  Sampler sampler(req.sampling, int(model_.config.vocab_size));
  std::optional<StreamDecoder> decoder;
  if (tokenizer_) decoder.emplace(*tokenizer_, /*skip_special=*/true);
  StopMatcher stops(req.stop);
  std::vector<int32_t> history(req.prompt.begin(), req.prompt.end());
  Clock::time_point t_first{};

  auto emit = [&](const std::string& text, int32_t token) {
    if (text.empty()) return true;
    res.text += text;
    return !on_token || on_token(text, token);
  };

  for (int i = 0; res.finish != FinishReason::Cancelled && i < req.max_new_tokens; ++i) {
    if (cancelled(cancel)) {
      res.finish = FinishReason::Cancelled;
      break;
    }
    logits_pos_ = -1;  // sampling (and the constraint) modifies the logits in place
    const int32_t next = req.constraint
                             ? sample_constrained(sampler, *req.constraint, logits_, unmasked_, history, req.max_new_tokens - i)
                             : sampler.sample(logits_, history);
    if (i == 0) {
      t_first = Clock::now();
      st.ttft_seconds = since(t0);
    }
    res.tokens.push_back(next);
    history.push_back(next);
    if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), next) != req.stop_tokens.end()) {
      res.finish = FinishReason::Stop;
      break;
    }
    if (decoder) {
      StopMatcher::Result r = stops.feed(decoder->push(next));
      if (!emit(r.text, next)) res.finish = FinishReason::Cancelled;
      if (r.stopped) {
        res.finish = FinishReason::Stop;
        res.stop_string = stops.matched_stop();
        break;
      }
    } else if (on_token && !on_token("", next)) {
      res.finish = FinishReason::Cancelled;
    }
    if (res.finish == FinishReason::Cancelled) break;
    if (i + 1 == req.max_new_tokens) break;  // Length: the last token is kept but not fed
    forward_->run(state_, std::span(&next, 1), LogitsMode::Last, logits_);
    logits_pos_ = state_.pos;
  }
  if (decoder && res.finish != FinishReason::Stop) {
    std::string tail = decoder->flush();
    StopMatcher::Result r = stops.feed(tail);
    std::string rest = r.text + (r.stopped ? "" : stops.flush());
    if (r.stopped) {
      res.finish = FinishReason::Stop;
      res.stop_string = stops.matched_stop();
    }
    emit(rest, res.tokens.empty() ? -1 : res.tokens.back());
  }
  st.generated_tokens = int64_t(res.tokens.size());
  if (!res.tokens.empty()) st.decode_seconds = since(t_first);
  if (model_.experts) st.experts = minus(model_.experts->expert_stats(), experts_before);
  if (opts_.gpu) {
    st.on_gpu = true;
    st.gpu = gpu_stats(*opts_.gpu);
    st.gpu.hits -= gpu_before.hits;
    st.gpu.misses -= gpu_before.misses;
    st.gpu.evictions -= gpu_before.evictions;
    st.gpu.bytes_uploaded -= gpu_before.bytes_uploaded;
    st.gpu.upload_seconds -= gpu_before.upload_seconds;
  }
  st.peak_rss = peak_rss_bytes();
  return res;
}

}  // namespace swiftlet
