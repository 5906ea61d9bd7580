#include "core/cpu_count.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

namespace swiftlet {
namespace cpu_count {
namespace {

std::string read_small_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool parse_number(std::string_view s, double& v) {
  s = trim(s);
  long long n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || end != s.data() + s.size()) return false;
  v = double(n);
  return true;
}

}  // namespace

double parse_cpu_max(std::string_view text) {
  text = trim(text);
  const size_t sp = text.find(' ');
  if (sp == std::string_view::npos) return 0;
  double quota = 0, period = 0;
  if (!parse_number(text.substr(0, sp), quota) || !parse_number(text.substr(sp + 1), period)) return 0;  // "max"
  return quota > 0 && period > 0 ? quota / period : 0;
}

double parse_cfs(std::string_view quota_us, std::string_view period_us) {
  double quota = 0, period = 0;
  if (!parse_number(quota_us, quota) || !parse_number(period_us, period)) return 0;
  return quota > 0 && period > 0 ? quota / period : 0;
}

int thread_count(const Topology& t) {
  std::set<std::string> cores;
  int unknown = 0;
  for (size_t i = 0; i < t.allowed.size(); ++i) {
    const std::string& id = i < t.cores.size() ? t.cores[i] : std::string();
    if (id.empty()) ++unknown;
    else cores.insert(id);
  }
  int n = int(cores.size()) + unknown;
  if (t.quota > 0) n = std::min(n, int(std::ceil(t.quota - 1e-9)));
  return std::max(1, n);
}

Topology read_topology(const std::string& root, const std::vector<int>& allowed) {
  Topology t;
  t.allowed = allowed;
  for (int cpu : allowed) {
    const std::string dir = root + "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    const std::string package = std::string(trim(read_small_file(dir + "physical_package_id")));
    const std::string core = std::string(trim(read_small_file(dir + "core_id")));
    t.cores.push_back(core.empty() ? std::string() : package + ":" + core);
  }
  // cgroup v2: the process's own cgroup (/proc/self/cgroup's "0::/path") and each one above it;
  // the smallest quota on the way up holds.
  std::istringstream lines(read_small_file(root + "/proc/self/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("0::", 0) != 0) continue;
    std::string path = line.substr(3);
    while (true) {
      const double q = parse_cpu_max(read_small_file(root + "/sys/fs/cgroup" + (path == "/" ? "" : path) + "/cpu.max"));
      if (q > 0 && (t.quota == 0 || q < t.quota)) t.quota = q;
      if (path.empty() || path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
    }
  }
  if (t.quota == 0)
    t.quota = parse_cfs(read_small_file(root + "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
                        read_small_file(root + "/sys/fs/cgroup/cpu/cpu.cfs_period_us"));
  return t;
}

}  // namespace cpu_count

int default_thread_count() {
  std::vector<int> allowed;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) allowed.push_back(c);
  if (allowed.empty()) return int(std::max(1u, std::thread::hardware_concurrency()));
  return cpu_count::thread_count(cpu_count::read_topology("", allowed));
}

}  // namespace swiftlet
