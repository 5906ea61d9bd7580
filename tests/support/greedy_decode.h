// A prompt, then greedy decode steps, through one forward pass and one sequence state: the
// loop many model tests run to compare logits, tokens or routes between two set-ups.
#pragma once

#include "model/forward_pass.h"
#include "model/session_state.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace swiftlet::testing {

// n token ids below `vocab`, drawn from mt19937(seed): a prompt for tests that only need one.
inline std::vector<int32_t> random_tokens(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(int32_t(rng() % uint32_t(vocab)));
  return out;
}

// Runs `prompt` (last logits row only), then `steps` times: picks the argmax of the row and runs
// it as the next token. `after_run(row)` sees the prompt's row and each step's, right after the
// run that made it. Returns the picked tokens.
template <class Pass, class AfterRun>
std::vector<int32_t> greedy_decode(Pass& pass, SessionState& state, std::span<const int32_t> prompt, int steps,
                                   AfterRun&& after_run) {
  std::vector<float> row;
  pass.run(state, prompt, LogitsMode::Last, row);
  after_run(row);
  std::vector<int32_t> picked;
  for (int i = 0; i < steps; ++i) {
    const int32_t next = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    picked.push_back(next);
    pass.run(state, std::span(&next, 1), LogitsMode::Last, row);
    after_run(row);
  }
  return picked;
}

// The same, keeping every row: the prompt's last logits row, then each step's, in one vector.
template <class Pass>
std::vector<float> greedy_logits(Pass& pass, SessionState& state, std::span<const int32_t> prompt, int steps) {
  std::vector<float> all;
  greedy_decode(pass, state, prompt, steps,
                [&](const std::vector<float>& row) { all.insert(all.end(), row.begin(), row.end()); });
  return all;
}

}  // namespace swiftlet::testing
