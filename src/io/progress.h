// Transfer progress: a rate meter and a one-line progress bar for stderr.
//
// The download client reports a TransferProgress to a callback; callers render it however they
// like, or hand it to ProgressBar, which draws "name [####----] 1.2 GB / 4.0 GB 85 MB/s ETA 0:32".
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>

namespace swiftlet {

struct TransferProgress {
  std::string_view name;     // what is being transferred (a file name)
  uint64_t done = 0;         // bytes of the file we hold, including any resumed prefix
  uint64_t total = 0;        // 0 when unknown
  double rate_bps = 0;       // recent rate in bytes/s (0 until measurable)
  double eta_s = -1;         // seconds left at the recent rate; < 0 when unknown
  bool finished = false;     // last report for this file
};

// Bytes/second over a sliding window, so a stall shows up within seconds rather than being
// averaged away over a long transfer.
class RateMeter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RateMeter(double window_s = 5.0) : window_s_(window_s) {}
  // Records that `bytes` (a running total) were reached at `now`.
  void add(uint64_t bytes, Clock::time_point now = Clock::now());
  double rate_bps() const;

 private:
  double window_s_;
  std::deque<std::pair<Clock::time_point, uint64_t>> samples_;
};

// "1.23 GB", "512 B", "85.3 MB" (decimal units, as the hub shows sizes).
std::string format_bytes(uint64_t n);
// "0:32", "1:02:03", "--:--" for unknown (< 0).
std::string format_duration(double seconds);
// One line without terminal control codes; `width` is the bar's cell count (0 for no bar).
std::string format_progress_line(const TransferProgress& p, int bar_width = 24);

// Draws TransferProgress reports on stderr, redrawing one line in place (\r). Enabled only when
// stderr is a terminal unless `force` is set (then each report is a new line, at most one per
// second, so logs stay readable).
class ProgressBar {
 public:
  explicit ProgressBar(bool force = false);
  void update(const TransferProgress& p);

 private:
  bool tty_;
  bool enabled_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace swiftlet
