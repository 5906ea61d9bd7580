// Runs f(i) for i in [0, n) on a few threads of its own, an exception from any of them passed to
// the caller once all have stopped (repack.cpp's expert chunks, miss_copies.cpp's copies).
#pragma once

#include <algorithm>
#include <exception>
#include <future>
#include <vector>

namespace swiftlet {

// Up to `threads` threads; f(i) for i = t, t + threads, ... on thread t.
template <typename F>
void parallel_for(int n, int threads, F&& f) {
  threads = std::max(1, std::min(threads, n));
  if (threads == 1) {
    for (int i = 0; i < n; ++i) f(i);
    return;
  }
  std::vector<std::future<void>> futs;
  for (int t = 1; t < threads; ++t)
    futs.push_back(std::async(std::launch::async, [&, t] {
      for (int i = t; i < n; i += threads) f(i);
    }));
  std::exception_ptr err;
  try {
    for (int i = 0; i < n; i += threads) f(i);
  } catch (...) {
    err = std::current_exception();
  }
  for (auto& fu : futs) {
    try {
      fu.get();
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace swiftlet
