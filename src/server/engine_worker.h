// The request queue and the one engine thread that owns the model.
//
// HTTP threads submit Jobs (token ids and sampling, no JSON) to a bounded FIFO; the engine
// thread loads the model, then takes one job at a time and runs it on the best-matching of N
// kept Sessions (the conversation cache), pushing text pieces into the job as they are
// generated. A job's consumer polls those events at its own pace, so a slow client never holds
// up the engine; cancelling a job (client gone) stops its generation at the next token.
#pragma once

#include "runtime/engine.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace swiftlet::server {

class Metrics;

struct JobSpec {
  std::vector<int32_t> prompt;  // the whole prompt (a chat: the whole conversation so far)
  // A turn boundary inside the prompt (the start of the last chat turn) where a DeltaNet
  // snapshot is worth taking: the next request of this conversation usually re-renders
  // everything after it differently (Qwen3 drops the answer's think block), and can then
  // rewind to it. 0: none.
  size_t snapshot_at = 0;
  SamplingParams sampling;
  int max_new_tokens = 256;
  std::vector<std::string> stop;
  std::shared_ptr<TokenConstraint> constraint;  // see GenerateRequest::constraint
};

struct JobEvent {
  enum class Kind { Text, Done, Failed };
  Kind kind = Kind::Text;
  std::string text;                          // Text: a piece of the answer; Failed: the message
  FinishReason finish = FinishReason::Stop;  // Done
  GenerateStats stats;                       // Done
  bool client_error = false;                 // Failed: the request was at fault (400), else 500
  std::string stop_string = {};              // Done: the stop string that ended the answer, if any
};

// One request in flight: its spec, a cancel flag, and the events the engine has produced.
class Job {
 public:
  explicit Job(JobSpec spec) : spec_(std::move(spec)) {}

  const JobSpec& spec() const { return spec_; }

  // Consumer side. Moves every pending event into `out` (waiting up to `timeout` for the first);
  // returns false if none came.
  bool wait_events(std::vector<JobEvent>& out, std::chrono::milliseconds timeout);
  void cancel() { cancel_.store(true); }
  bool cancelled() const { return cancel_.load(); }

  // Engine side.
  void push(JobEvent ev);
  const std::atomic<bool>* cancel_flag() const { return &cancel_; }

 private:
  JobSpec spec_;
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobEvent> events_;
};

struct WorkerOptions {
  EngineOptions engine;
  int sessions = 4;         // conversations kept for prefix reuse (--parallel)
  size_t max_queue = 32;    // jobs waiting (not counting the running one); more -> rejected
  int64_t max_context = 8192;
  int max_new_tokens = 0;   // per request, whatever it asks (--max-tokens); 0: what the context leaves
  int max_snapshots = 3;    // DeltaNet snapshots per session
};

class EngineWorker {
 public:
  enum class Status { Loading, Ready, Failed };

  // Starts the engine thread, which loads the model first.
  EngineWorker(WorkerOptions opts, Metrics& metrics);
  ~EngineWorker();  // cancels what is queued and running, joins the thread
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  Status status() const { return status_.load(); }
  std::string load_error() const;
  // Once Ready, the engine is immutable and may be read from any thread (tokenizer, config).
  const Engine* engine() const { return status() == Status::Ready ? engine_.get() : nullptr; }
  // Blocks until the model is loaded or failed to load.
  Status wait_loaded() const;

  // Queues a job; nullptr when the queue is full (or shutting down).
  std::shared_ptr<Job> submit(JobSpec spec);
  size_t queued() const;
  bool busy() const { return busy_.load(); }
  const WorkerOptions& options() const { return opts_; }

  void shutdown();

 private:
  struct Slot {
    std::unique_ptr<Session> session;
    uint64_t last_used = 0;  // 0: never used
    size_t turn_start = 0;   // where the last request's last turn began (see pick_slot)
  };

  void run();
  void run_job(Job& job);
  Slot& pick_slot(const JobSpec& spec);

  WorkerOptions opts_;
  Metrics& metrics_;
  std::unique_ptr<Engine> engine_;
  std::atomic<Status> status_{Status::Loading};
  std::string load_error_;
  std::vector<Slot> slots_;  // engine thread only
  uint64_t clock_ = 0;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // queue changes, load finished
  std::deque<std::shared_ptr<Job>> queue_;
  std::shared_ptr<Job> running_;
  bool stopping_ = false;
  std::atomic<bool> busy_{false};
  std::thread thread_;
};

// Length of the common prefix of two token sequences.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace swiftlet::server
