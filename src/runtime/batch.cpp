#include "runtime/batch.h"

#include "core/error.h"

#include <algorithm>
#include <cstring>

namespace swiftlet {

struct Batch::Member {
  Id id = 0;
  Session* session = nullptr;
  GenerateRequest req;  // Generation keeps a reference: a member never moves (unique_ptr)
  std::unique_ptr<Generation> gen;
  const std::atomic<bool>* cancel = nullptr;
  int64_t reused = 0;
  bool prompt_in = false;
  std::exception_ptr error;
};

Batch::Batch(const Model& model, BatchOptions opts)
    : model_(model), opts_(opts), forward_(std::make_unique<Forward>(model, opts.backend)) {
  if (opts_.prefill_chunk < 1) fail("the batch's prefill chunk must be at least 1 token, got {}", opts_.prefill_chunk);
  forward_->set_routing({.predict_next = opts_.predict_next});
  forward_->set_miss_policy(opts_.on_miss);
  if (opts_.gpu) gpu_runner_ = make_gpu_forward(opts_.gpu);
  if (opts_.prefetch_masks.value_or(opts_.gpu != nullptr)) prefetcher_ = std::make_unique<MaskPrefetcher>();
}

Batch::~Batch() = default;

size_t Batch::decoding() const {
  return size_t(std::count_if(members_.begin(), members_.end(), [](const auto& m) { return m->prompt_in; }));
}

size_t Batch::prefilling() const { return members_.size() - decoding(); }

Batch::Id Batch::add(Session& session, GenerateRequest req, TokenCallback on_token,
                     const std::atomic<bool>* cancel, size_t snapshot_at) {
  if (&session.model() != &model_) fail("this session belongs to another model than the batch's: make it from the same engine");
  for (const auto& m : members_)
    if (m->session == &session)
      fail("this session is already generating in the batch: wait until its answer finishes, or use another session");
  auto m = std::make_unique<Member>();
  m->id = next_id_;
  m->session = &session;
  m->req = std::move(req);
  m->cancel = cancel;
  m->gen = std::make_unique<Generation>(session, m->req, std::move(on_token), cancel);  // validates the request
  m->reused = session.begin_prompt(m->req.prompt, snapshot_at, m->req.message_starts);  // validates the prompt, then rewinds
  if (session.prompt_pending() == 0) {
    m->gen->prompt_done(m->reused);
    m->prompt_in = true;
  }
  members_.push_back(std::move(m));
  return next_id_++;
}

namespace {
bool is_cancelled(const std::atomic<bool>* c) { return c && c->load(std::memory_order_relaxed); }
}  // namespace

// Runs each member's token; on failure every member of the step carries the error.
void Batch::decode(std::vector<Member*>& run, std::vector<int32_t>& tokens) {
  // The batched pass serves sessions on the CPU with the batch's backend and nothing watching
  // or overriding their routing; any other session steps through its own pass.
  auto batchable = [&](const Member* m) {
    const SessionOptions& o = m->session->opts_;
    return !o.gpu && !o.routing_observer && !o.route_override && o.backend == opts_.backend;
  };
  // Sessions on the batch's GPU model decode together on it.
  auto gpu_batchable = [&](const Member* m) { return gpu_runner_ && m->session->opts_.gpu == opts_.gpu; };
  std::vector<Member*> together, on_gpu;
  std::vector<int32_t> together_tokens, gpu_tokens;
  std::vector<SessionState*> states, gpu_states;
  std::vector<ForwardPass*> gpu_passes;
  for (size_t i = 0; i < run.size(); ++i) {
    Member* m = run[i];
    Session& s = *m->session;
    if (batchable(m)) {
      together.push_back(m);
      together_tokens.push_back(tokens[i]);
      states.push_back(&s.state_);
      continue;
    }
    if (gpu_batchable(m)) {
      on_gpu.push_back(m);
      gpu_tokens.push_back(tokens[i]);
      gpu_states.push_back(&s.state_);
      gpu_passes.push_back(s.forward_.get());
      continue;
    }
    try {
      s.forward_->run(s.state_, std::span(&tokens[i], 1), LogitsMode::Last, s.logits_);
      s.logits_pos_ = s.state_.pos;
    } catch (...) {
      m->error = std::current_exception();
    }
  }
  const size_t V = size_t(model_.config.vocab_size);
  auto hand_out = [&](const std::vector<Member*>& ms) {
    for (size_t i = 0; i < ms.size(); ++i) {
      Session& s = *ms[i]->session;
      s.logits_.resize(V);
      std::memcpy(s.logits_.data(), logits_.data() + i * V, V * sizeof(float));
      s.logits_pos_ = s.state_.pos;
    }
  };
  if (!on_gpu.empty()) {
    try {
      gpu_decode_batch(*gpu_runner_, gpu_passes, gpu_states, gpu_tokens, logits_);
      hand_out(on_gpu);
    } catch (...) {
      for (Member* m : on_gpu) m->error = std::current_exception();
    }
  }
  if (together.empty()) return;
  try {
    forward_->decode_batch(states, together_tokens, logits_);
  } catch (...) {
    for (Member* m : together) m->error = std::current_exception();
    return;
  }
  hand_out(together);
}

void Batch::prefetch_masks() {
  if (!prefetcher_) return;
  std::vector<MaskJob> jobs;
  for (auto& mp : members_)
    if (mp->req.constraint && !mp->error && !mp->gen->finished()) jobs.push_back(mp->req.constraint->next_mask());
  prefetcher_->submit(std::move(jobs));
}

std::vector<Batch::Finished> Batch::step() {
  ++steps_;
  // A newcomer's first mask is made during its prompt (it samples in the step its prompt ends).
  if (prefilling() > 0) prefetch_masks();
  // The oldest newcomer feeds a chunk of its prompt (first come, first served: each prompt is
  // bounded, so none waits forever, and the first to come gets its first token soonest).
  for (auto& mp : members_) {
    Member& m = *mp;
    if (m.prompt_in) continue;
    if (is_cancelled(m.cancel)) {
      m.gen->prompt_done(m.reused);  // logits not ready: finishes as cancelled
    } else {
      // With nobody decoding there is no one to interleave with: the whole prompt goes in at
      // once (in the session's own calls of kPrefillChunk, each reading a streamed expert once).
      const bool alone = std::none_of(members_.begin(), members_.end(), [](const auto& o) { return o->prompt_in; });
      try {
        m.session->feed_prompt(alone ? m.session->prompt_pending() : size_t(opts_.prefill_chunk));
      } catch (...) {
        m.error = std::current_exception();
      }
      if (!m.error && m.session->prompt_pending() == 0) {
        m.gen->prompt_done(m.reused);
        m.prompt_in = true;
      }
    }
    break;
  }
  // Every member whose prompt is in takes its next token; those that continue run together.
  std::vector<Member*> run;
  std::vector<int32_t> tokens;
  for (auto& mp : members_) {
    Member& m = *mp;
    if (!m.prompt_in || m.error) continue;
    if (std::optional<int32_t> t = m.gen->next()) {
      run.push_back(&m);
      tokens.push_back(*t);
    }
  }
  rows_ += run.size();
  // The masks the next step may need, made while this one runs the model.
  prefetch_masks();
  if (!run.empty()) decode(run, tokens);

  std::vector<Finished> done;
  std::erase_if(members_, [&](std::unique_ptr<Member>& mp) {
    Member& m = *mp;
    if (m.error) m.session->reset();  // its state may be half-stepped
    else if (!m.gen->finished()) return false;
    Finished f;
    f.id = m.id;
    f.session = m.session;
    f.error = m.error;
    if (m.gen->finished()) f.result = m.gen->finish();
    done.push_back(std::move(f));
    return true;
  });
  return done;
}

}  // namespace swiftlet
