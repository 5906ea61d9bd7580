// Several generations stepped together (continuous batching): each member is one answer on its
// own Session. A step feeds one newcomer a chunk of its prompt, then samples one token for every
// member whose prompt is in and runs all those tokens through the model at once
// (Forward::decode_batch, or gpu_decode_batch for sessions on the GPU: dense weights read once for
// the batch, each routed expert once for the members that chose it). Members join and leave between steps. Each member's tokens equal
// what Session::generate gives it alone (the CPU's decode_batch is bit-exact against a
// one-sequence run, and prompt chunk boundaries change no result; the GPU's batch equals it within
// the GPU's tolerance).
#pragma once

#include "runtime/session.h"

#include <exception>
#include <memory>
#include <optional>
#include <vector>

namespace swiftlet {

struct BatchOptions {
  Backend backend = Backend::Cpu;  // of the batched decode pass
  // Prompt tokens fed between two decode steps: a long prompt joins without stalling the
  // members already decoding for more than one chunk's time a step. (With no member decoding,
  // a prompt goes in whole.)
  int prefill_chunk = 256;
  int predict_next = 1;  // see SessionOptions::predict_next (decode_batch guesses for one member only)
  // Members whose sessions run on this GPU model decode together on it (gpu_decode_batch);
  // null: only CPU sessions batch, GPU ones step alone.
  std::shared_ptr<GpuModel> gpu;
  // Constrained members' next masks made on a worker thread during each step's forward pass
  // (mask_prefetcher.h). Unset: when the batch has a GPU model (the CPU's pass uses every core).
  std::optional<bool> prefetch_masks;
  MissPolicy on_miss;  // see SessionOptions::on_miss (the batched CPU pass)
};

class Batch {
 public:
  using Id = uint64_t;
  Batch(const Model& model, BatchOptions opts = {});
  ~Batch();

  // Starts generating `req` on `session`, which must outlive the member and not be used
  // otherwise until its answer is finished. The prompt is rewound against the session's state
  // as Session::generate would (prefix reuse); `snapshot_at` is a turn boundary inside the
  // prompt where a DeltaNet snapshot is kept (0: none). Throws Error, and nothing joins, for a
  // bad request, a session of another model, or a session already in the batch.
  Id add(Session& session, GenerateRequest req, TokenCallback on_token = {},
         const std::atomic<bool>* cancel = nullptr, size_t snapshot_at = 0);

  struct Finished {
    Id id = 0;
    Session* session = nullptr;
    GenerateResult result;  // what Session::generate would have returned
    // Set when the model failed (an expert read, a broken file): then the session was reset and
    // `result` is empty.
    std::exception_ptr error;
  };
  // One step (see the file comment); returns the members that finished in it. A member whose
  // cancel flag is set, or whose callback returned false, leaves at its next step.
  std::vector<Finished> step();

  size_t size() const { return members_.size(); }
  bool empty() const { return members_.empty(); }
  size_t decoding() const;    // members whose prompt is in
  size_t prefilling() const;  // members still feeding their prompt
  // Steps so far, and the members they decoded (their mean is the mean batch size).
  uint64_t steps() const { return steps_; }
  uint64_t decoded_rows() const { return rows_; }
  // The worker that makes masks ahead; null when prefetching is off.
  MaskPrefetcher* mask_prefetcher() { return prefetcher_.get(); }

 private:
  struct Member;
  void decode(std::vector<Member*>& run, std::vector<int32_t>& tokens);
  void prefetch_masks();  // submits every constrained member's next mask to prefetcher_

  const Model& model_;
  BatchOptions opts_;
  std::unique_ptr<Forward> forward_;  // the batched decode pass; prompts run on each session's own
  std::unique_ptr<ForwardPass> gpu_runner_;  // the GPU batch's buffers and graph (BatchOptions::gpu)
  std::vector<std::unique_ptr<Member>> members_;  // in the order they joined
  std::vector<float> logits_;                     // [members decoded][vocab]
  std::unique_ptr<MaskPrefetcher> prefetcher_;     // BatchOptions::prefetch_masks
  Id next_id_ = 1;
  uint64_t steps_ = 0, rows_ = 0;
};

}  // namespace swiftlet
