// The request queue and the one engine thread that owns the model.
//
// HTTP threads submit Jobs (token ids and sampling, no JSON) to a bounded FIFO; the engine
// thread loads the model, then runs up to N jobs at once (--parallel N: continuous batching).
// Each of the N slots is a Session, both a decode slot and a kept conversation: a job takes the
// free slot that best continues its conversation (prefix reuse), joins the running Batch at the
// next step, has its prompt fed in chunks between the others' decode steps, and leaves when it
// finishes; the oldest waiting job takes the next free slot. Text pieces are pushed into the
// job as they are generated; a job's consumer polls them at its own pace, so a slow client never
// holds up the engine; cancelling a job (client gone) stops it at its next step.
#pragma once

#include "runtime/batch.h"
#include "runtime/engine.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
  int sessions = 4;         // slots, each keeping one conversation's state for prefix reuse (--sessions)
  int parallel = 0;         // jobs generated together at most (--parallel); 0: one per slot
  size_t max_queue = 32;    // jobs waiting for a slot (not counting the running ones); more -> rejected
  int prefill_chunk = 256;  // prompt tokens a newcomer feeds between two decode steps
  int64_t max_context = 8192;
  int max_new_tokens = 0;   // per request, whatever it asks (--max-tokens); 0: what the context leaves
  int max_snapshots = 3;    // DeltaNet snapshots per session
  // The prefix state cache shared by every slot (--state-cache DIR, --state-cache-gb,
  // --state-cache-ram-gb); off when false.
  bool state_cache = false;
  StateCacheOptions state_cache_options;
};

// What the engine thread is doing, for /metrics.
struct BatchGauges {
  size_t running = 0;     // jobs in slots
  size_t decoding = 0;    // of those, past their prompt (the batch size of a decode step)
  size_t prefilling = 0;  // of those, feeding their prompt
  uint64_t steps = 0;     // batch steps so far
  uint64_t rows = 0;      // sequences decoded over those steps (rows / steps: the mean batch size)
  struct Slot {
    bool busy = false;
    uint64_t generated_tokens = 0;  // by every job this slot ran
    double decode_tok_s = 0;        // of the last job it finished
  };
  std::vector<Slot> slots;
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
  bool busy() const { return busy_.load(); }  // some job is running
  BatchGauges gauges() const;
  const WorkerOptions& options() const { return opts_; }
  // The prefix state cache's counters; nothing when it is off (or bypassed on the GPU).
  std::optional<StateCacheStats> state_cache_stats() const;

  void shutdown();

 private:
  struct Slot {
    std::unique_ptr<Session> session;
    uint64_t last_used = 0;  // 0: never used
    size_t turn_start = 0;   // where the last request's last turn began (see pick_slot)
    std::shared_ptr<Job> job;  // running here; null: free
  };

  void run();
  void start_job(const std::shared_ptr<Job>& job);
  void finish_job(Batch::Finished& f);
  void publish_gauges();
  Slot* pick_slot(const JobSpec& spec);
  size_t free_slots() const;
  // How many more jobs may start now: a free slot each, and at most `parallel` running.
  size_t admissible() const;

  WorkerOptions opts_;
  Metrics& metrics_;
  std::unique_ptr<Engine> engine_;
  std::atomic<Status> status_{Status::Loading};
  std::string load_error_;
  std::vector<Slot> slots_;  // engine thread only
  std::unique_ptr<Batch> batch_;
  std::shared_ptr<StateCache> state_cache_;  // set before status_ becomes Ready
  std::map<Batch::Id, size_t> members_;  // batch member -> slot
  uint64_t clock_ = 0;
  BatchGauges gauges_;  // guarded by mu_

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // queue changes, load finished
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Job>> running_;  // cancelled by shutdown()
  bool stopping_ = false;
  std::atomic<bool> busy_{false};
  std::thread thread_;
};

// Length of the common prefix of two token sequences.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace swiftlet::server
