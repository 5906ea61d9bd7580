#include "io/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace swiftlet {

void RateMeter::add(uint64_t bytes, Clock::time_point now) {
  samples_.emplace_back(now, bytes);
  // Keep one sample older than the window so the rate spans the whole window.
  while (samples_.size() > 2 &&
         std::chrono::duration<double>(now - samples_[1].first).count() >= window_s_)
    samples_.pop_front();
}

double RateMeter::rate_bps() const {
  if (samples_.size() < 2) return 0;
  const auto& [t0, b0] = samples_.front();
  const auto& [t1, b1] = samples_.back();
  double dt = std::chrono::duration<double>(t1 - t0).count();
  if (dt < 0.05 || b1 < b0) return 0;
  return double(b1 - b0) / dt;
}

std::string format_bytes(uint64_t n) {
  static const char* const units[] = {"kB", "MB", "GB", "TB", "PB"};
  if (n < 1000) return fmt::format("{} B", n);
  double v = double(n);
  int u = -1;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  return fmt::format("{:.{}f} {}", v, v < 10 ? 2 : v < 100 ? 1 : 0, units[u]);
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "--:--";
  auto s = uint64_t(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

std::string format_progress_line(const TransferProgress& p, int bar_width) {
  std::string line(p.name);
  if (bar_width > 0) {
    int filled = 0;
    if (p.total > 0)
      filled = int(double(std::min(p.done, p.total)) / double(p.total) * bar_width);
    line += fmt::format("  [{}{}]", std::string(size_t(filled), '#'),
                        std::string(size_t(bar_width - filled), '-'));
  }
  line += "  " + format_bytes(p.done);
  if (p.total > 0) line += " / " + format_bytes(p.total);
  if (p.rate_bps > 0) line += fmt::format("  {}/s", format_bytes(uint64_t(p.rate_bps)));
  if (!p.finished) line += "  ETA " + format_duration(p.eta_s);
  return line;
}

ProgressBar::ProgressBar(bool force) : tty_(::isatty(STDERR_FILENO) == 1), enabled_(tty_ || force) {}

void ProgressBar::update(const TransferProgress& p) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (tty_) {
    // \x1b[K clears what a longer previous line left behind.
    std::fprintf(stderr, "\r%s\x1b[K%s", format_progress_line(p).c_str(), p.finished ? "\n" : "");
  } else if (p.finished || now - last_ >= std::chrono::seconds(1)) {
    std::fprintf(stderr, "%s\n", format_progress_line(p, 0).c_str());
    last_ = now;
  }
  std::fflush(stderr);
}

}  // namespace swiftlet
