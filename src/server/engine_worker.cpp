#include "server/engine_worker.h"

#include "core/data_error.h"
#include "core/error.h"
#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

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
  if (opts_.sessions < 1) fail("--parallel must be at least 1, got {}", opts_.sessions);
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

void EngineWorker::shutdown() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    dropped.swap(queue_);
    if (running_) running_->cancel();
  }
  cv_.notify_all();
  for (auto& job : dropped) {
    job->cancel();
    job->push({JobEvent::Kind::Failed, "the server is shutting down", FinishReason::Cancelled, {}, false});
  }
  if (thread_.joinable()) thread_.join();
}

void EngineWorker::run() {
  try {
    engine_ = std::make_unique<Engine>(opts_.engine);
    engine_->require_tokenizer();
    slots_.resize(size_t(opts_.sessions));
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
  }
  cv_.notify_all();

  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = job;
      busy_.store(true);
    }
    run_job(*job);
    {
      std::lock_guard lock(mu_);
      running_.reset();
      busy_.store(false);
    }
  }
}

EngineWorker::Slot& EngineWorker::pick_slot(const JobSpec& spec) {
  // A request continues a session's conversation when it shares everything up to the start of
  // that session's last turn (the re-rendering of the last answer may differ after it). Of
  // those, the longest common prefix wins. A request that continues none takes an unused
  // session, else the least recently used one: sharing only a system prompt is no reason to
  // overwrite another conversation.
  Slot* best = nullptr;
  size_t best_lcp = 0;
  for (Slot& s : slots_) {
    if (!s.session) continue;
    const size_t lcp = common_prefix(s.session->state().tokens, spec.prompt);
    if (lcp > 0 && lcp >= s.turn_start && lcp > best_lcp) {
      best = &s;
      best_lcp = lcp;
    }
  }
  if (!best) {
    best = &*std::min_element(slots_.begin(), slots_.end(),
                              [](const Slot& a, const Slot& b) { return a.last_used < b.last_used; });
  }
  if (!best->session) {
    SessionOptions so;
    so.max_context = opts_.max_context;
    so.max_snapshots = opts_.max_snapshots;
    best->session = engine_->new_session(so);
  }
  best->last_used = ++clock_;
  best->turn_start = spec.snapshot_at > 0 ? spec.snapshot_at : spec.prompt.size();
  return *best;
}

namespace {
void add_experts(ExpertStats& a, const ExpertStats& b) {
  a.hits += b.hits;
  a.misses += b.misses;
  a.evictions += b.evictions;
  a.bytes_read += b.bytes_read;
  a.read_seconds += b.read_seconds;
  a.wait_seconds += b.wait_seconds;
  a.verify_seconds += b.verify_seconds;
}
}  // namespace

void EngineWorker::run_job(Job& job) {
  const JobSpec& spec = job.spec();
  auto done = [&](FinishReason finish, const GenerateStats& stats, std::string stop_string = {}) {
    metrics_.on_job(finish, stats);
    job.push({JobEvent::Kind::Done, "", finish, stats, false, std::move(stop_string)});
  };
  if (job.cancelled()) {  // the client left while it was queued
    done(FinishReason::Cancelled, {});
    return;
  }
  Session* used = nullptr;
  try {
    Session& session = *pick_slot(spec).session;
    used = &session;
    GenerateRequest req;
    req.prompt = spec.prompt;
    req.sampling = spec.sampling;
    req.max_new_tokens = spec.max_new_tokens;
    req.stop = spec.stop;
    req.stop_tokens = engine_->stop_tokens();
    req.constraint = spec.constraint;

    // First bring the state to the turn boundary (Session::generate snapshots the DeltaNet
    // state at the end of each prompt it prepares), unless the state is already past it.
    GenerateStats head;
    bool have_head = false;
    const size_t lcp = common_prefix(session.state().tokens, spec.prompt);
    if (spec.snapshot_at > 0 && spec.snapshot_at < spec.prompt.size() && lcp < spec.snapshot_at) {
      GenerateRequest h = req;
      h.prompt.resize(spec.snapshot_at);
      h.max_new_tokens = 0;
      GenerateResult r = session.generate(h, {}, job.cancel_flag());
      head = r.stats;
      have_head = true;
      if (r.finish == FinishReason::Cancelled || job.cancelled()) {
        done(FinishReason::Cancelled, head);
        return;
      }
    }

    GenerateResult res = session.generate(
        req,
        [&](std::string_view text, int32_t) {
          job.push({JobEvent::Kind::Text, std::string(text), FinishReason::Stop, {}, false});
          return !job.cancelled();
        },
        job.cancel_flag());
    GenerateStats st = res.stats;
    if (have_head) {
      st.reused_tokens = head.reused_tokens;
      st.prefilled_tokens = st.prompt_tokens - st.reused_tokens;
      st.prefill_seconds += head.prefill_seconds;
      st.ttft_seconds += head.prefill_seconds;
      add_experts(st.experts, head.experts);
    }
    done(res.finish, st, res.stop_string);
  } catch (const DataError& e) {  // the model's files, not the request: a 500
    if (used) used->reset();
    metrics_.on_job_failed();
    job.push({JobEvent::Kind::Failed, e.what(), FinishReason::Stop, {}, false});
  } catch (const Error& e) {
    if (used) used->reset();  // its state may be half-fed
    metrics_.on_job_failed();
    job.push({JobEvent::Kind::Failed, e.what(), FinishReason::Stop, {}, true});
  } catch (const std::exception& e) {
    if (used) used->reset();
    metrics_.on_job_failed();
    job.push({JobEvent::Kind::Failed, fmt::format("internal error: {}", e.what()), FinishReason::Stop, {}, false});
  }
}

}  // namespace swiftlet::server
