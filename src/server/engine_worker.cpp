#include "server/engine_worker.h"

#include "core/data_error.h"
#include "core/error.h"
#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace swiftlet::server {

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return size_t(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

// ------------------------------------------------------------------------------------ Job

bool Job::wait_events(std::vector<JobEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return true;
}

void Job::push(JobEvent ev) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

// --------------------------------------------------------------------------- EngineWorker

EngineWorker::EngineWorker(WorkerOptions opts, Metrics& metrics) : opts_(std::move(opts)), metrics_(metrics) {
  if (opts_.sessions < 1) fail("--sessions must be at least 1, got {}", opts_.sessions);
  if (opts_.parallel < 0) fail("--parallel must be at least 1, got {}", opts_.parallel);
  if (opts_.parallel > opts_.sessions)
    fail("--sessions ({}) must be at least --parallel ({}): each running request holds a session", opts_.sessions,
         opts_.parallel);
  if (opts_.max_context < 2) fail("--ctx must be at least 2 tokens, got {}", opts_.max_context);
  thread_ = std::thread([this] { run(); });
}

EngineWorker::~EngineWorker() { shutdown(); }

std::string EngineWorker::load_error() const {
  std::lock_guard lock(mu_);
  return load_error_;
}

EngineWorker::Status EngineWorker::wait_loaded() const {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return status_.load() != Status::Loading; });
  return status_.load();
}

std::shared_ptr<Job> EngineWorker::submit(JobSpec spec) {
  std::lock_guard lock(mu_);
  if (stopping_ || queue_.size() >= opts_.max_queue) return nullptr;
  if (opts_.max_new_tokens > 0) spec.max_new_tokens = std::min(spec.max_new_tokens, opts_.max_new_tokens);
  auto job = std::make_shared<Job>(std::move(spec));
  queue_.push_back(job);
  cv_.notify_all();
  return job;
}

size_t EngineWorker::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

BatchGauges EngineWorker::gauges() const {
  std::lock_guard lock(mu_);
  return gauges_;
}

std::optional<StateCacheStats> EngineWorker::state_cache_stats() const {
  if (status() != Status::Ready || !state_cache_) return std::nullopt;
  return state_cache_->stats();
}

void EngineWorker::shutdown() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    dropped.swap(queue_);
    for (auto& job : running_) job->cancel();
  }
  cv_.notify_all();
  for (auto& job : dropped) {
    job->cancel();
    job->push({JobEvent::Kind::Failed, "the server is shutting down", FinishReason::Cancelled, {}, false});
  }
  if (thread_.joinable()) thread_.join();
}

size_t EngineWorker::free_slots() const {
  return size_t(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.job; }));
}

size_t EngineWorker::admissible() const {
  const size_t limit = size_t(opts_.parallel > 0 ? opts_.parallel : opts_.sessions);
  return running_.size() >= limit ? 0 : std::min(free_slots(), limit - running_.size());
}

void EngineWorker::run() {
  try {
    engine_ = std::make_unique<Engine>(opts_.engine);
    engine_->require_tokenizer();
    slots_.resize(size_t(opts_.sessions));
    BatchOptions bo;
    bo.backend = engine_->backend();
    bo.prefill_chunk = opts_.prefill_chunk;
    bo.predict_next = opts_.engine.predict_next;
    bo.on_miss = opts_.engine.on_miss;
    bo.gpu = engine_->gpu_model();
    batch_ = std::make_unique<Batch>(engine_->model(), bo);
    if (opts_.state_cache)
      state_cache_ = std::make_shared<StateCache>(engine_->model(), opts_.state_cache_options);
  } catch (const std::exception& e) {
    std::lock_guard lock(mu_);
    load_error_ = e.what();
    status_.store(Status::Failed);
    cv_.notify_all();
    return;
  }
  {
    std::lock_guard lock(mu_);
    status_.store(Status::Ready);
    gauges_.slots.resize(slots_.size());
  }
  cv_.notify_all();

  for (;;) {
    std::vector<std::shared_ptr<Job>> admitted;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !batch_->empty() || (!queue_.empty() && admissible() > 0); });
      if (stopping_ && batch_->empty()) return;
      // Jobs take free slots in the order they came (shutdown() has cancelled the running ones:
      // the steps below let them finish).
      for (size_t n = admissible(); !stopping_ && n > 0 && !queue_.empty(); --n) {
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
        running_.push_back(admitted.back());
      }
      busy_.store(!running_.empty());
    }
    for (auto& job : admitted) start_job(job);
    if (!batch_->empty()) {
      for (Batch::Finished& f : batch_->step()) finish_job(f);
    }
    publish_gauges();
  }
}

EngineWorker::Slot* EngineWorker::pick_slot(const JobSpec& spec) {
  // Of the free slots: a request continues a session's conversation when it shares everything
  // up to the start of that session's last turn (the re-rendering of the last answer may differ
  // after it). Of those, the longest common prefix wins. A request that continues none takes an
  // unused session, else the least recently used one: sharing only a system prompt is no reason
  // to overwrite another conversation.
  Slot* best = nullptr;
  size_t best_lcp = 0;
  for (Slot& s : slots_) {
    if (!s.session || s.job) continue;
    const size_t lcp = common_prefix(s.session->state().tokens, spec.prompt);
    if (lcp > 0 && lcp >= s.turn_start && lcp > best_lcp) {
      best = &s;
      best_lcp = lcp;
    }
  }
  if (!best) {
    for (Slot& s : slots_)
      if (!s.job && (!best || s.last_used < best->last_used)) best = &s;
  }
  SWIFTLET_CHECK(best != nullptr, "a job was admitted without a free slot");
  if (!best->session) {
    SessionOptions so;
    so.max_context = opts_.max_context;
    so.max_snapshots = opts_.max_snapshots;
    so.state_cache = state_cache_;
    best->session = engine_->new_session(so);
  }
  best->last_used = ++clock_;
  best->turn_start = spec.snapshot_at > 0 ? spec.snapshot_at : spec.prompt.size();
  return best;
}

namespace {
// The job's event for an error: the request's fault (400) or the server's (500).
JobEvent failure(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const DataError& e) {  // the model's files, not the request
    return {JobEvent::Kind::Failed, e.what(), FinishReason::Stop, {}, false};
  } catch (const Error& e) {
    return {JobEvent::Kind::Failed, e.what(), FinishReason::Stop, {}, true};
  } catch (const std::exception& e) {
    return {JobEvent::Kind::Failed, fmt::format("internal error: {}", e.what()), FinishReason::Stop, {}, false};
  }
}
}  // namespace

void EngineWorker::start_job(const std::shared_ptr<Job>& job) {
  const JobSpec& spec = job->spec();
  auto leave = [&] {
    std::lock_guard lock(mu_);
    std::erase(running_, job);
  };
  if (job->cancelled()) {  // the client left while it was queued
    metrics_.on_job(FinishReason::Cancelled, {});
    job->push({JobEvent::Kind::Done, "", FinishReason::Cancelled, {}, false});
    leave();
    return;
  }
  Slot* slot = pick_slot(spec);
  GenerateRequest req;
  req.prompt = spec.prompt;
  req.sampling = spec.sampling;
  req.max_new_tokens = spec.max_new_tokens;
  req.stop = spec.stop;
  req.stop_tokens = engine_->stop_tokens();
  req.constraint = spec.constraint;
  if (state_cache_) {
    // Message starts: an agent's preamble (system prompt, tools) ends at one, and the next
    // conversation with the same preamble starts from the state kept there.
    const int32_t im_start = engine_->require_tokenizer().token_id("<|im_start|>");
    for (size_t i = 1; i < spec.prompt.size(); ++i)
      if (spec.prompt[i] == im_start) req.message_starts.push_back(i);
  }
  Job* j = job.get();
  try {
    const Batch::Id id = batch_->add(
        *slot->session, std::move(req),
        [j](std::string_view text, int32_t) {
          j->push({JobEvent::Kind::Text, std::string(text), FinishReason::Stop, {}, false});
          return !j->cancelled();
        },
        job->cancel_flag(), spec.snapshot_at);
    slot->job = job;
    members_[id] = size_t(slot - slots_.data());
  } catch (...) {
    slot->session->reset();  // a refused prompt changed nothing, but a half-made rewind is not worth a guess
    metrics_.on_job_failed();
    job->push(failure(std::current_exception()));
    leave();
  }
}

void EngineWorker::finish_job(Batch::Finished& f) {
  auto it = members_.find(f.id);
  SWIFTLET_CHECK(it != members_.end(), "batch member {} has no slot", f.id);
  Slot& slot = slots_[it->second];
  members_.erase(it);
  std::shared_ptr<Job> job = std::move(slot.job);
  {
    std::lock_guard lock(mu_);
    std::erase(running_, job);
    gauges_.running = running_.size();
    BatchGauges::Slot& g = gauges_.slots[size_t(&slot - slots_.data())];
    g.generated_tokens += uint64_t(f.result.stats.generated_tokens);
    if (!f.error) g.decode_tok_s = f.result.stats.decode_tok_s();
  }
  if (f.error) {
    metrics_.on_job_failed();
    job->push(failure(f.error));
  } else {
    metrics_.on_job(f.result.finish, f.result.stats);
    job->push({JobEvent::Kind::Done, "", f.result.finish, f.result.stats, false, f.result.stop_string});
  }
  cv_.notify_all();
}

void EngineWorker::publish_gauges() {
  std::lock_guard lock(mu_);
  gauges_.running = running_.size();
  gauges_.decoding = batch_->decoding();
  gauges_.prefilling = batch_->prefilling();
  gauges_.steps = batch_->steps();
  gauges_.rows = batch_->decoded_rows();
  for (size_t i = 0; i < slots_.size(); ++i) gauges_.slots[i].busy = slots_[i].job != nullptr;
  busy_.store(!running_.empty());
}

}  // namespace swiftlet::server
