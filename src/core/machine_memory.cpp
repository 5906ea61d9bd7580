#include "core/machine_memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace swiftlet {

namespace fs = std::filesystem;

namespace {

// A file's first word as a number; false when missing or not a number ("max": no limit).
bool read_number(const fs::path& p, uint64_t& out) {
  std::ifstream f(p);
  std::string word;
  if (!(f >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos) return false;
  try {
    out = std::stoull(word);
  } catch (...) {
    return false;
  }
  return true;
}

// The value of `key` in a "key value" file (memory.stat); 0 when absent.
uint64_t stat_value(const fs::path& p, const std::string& key) {
  std::ifstream f(p);
  std::string k;
  uint64_t v = 0;
  while (f >> k >> v)
    if (k == key) return v;
  return 0;
}

// The directories from the process's own cgroup up to the hierarchy's root: a limit anywhere on
// the way binds. A cgroup path that is not there (another namespace's view) leaves the root only.
std::vector<fs::path> cgroup_dirs(const fs::path& base, const std::string& path) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(base, ec)) return out;
  fs::path rel = fs::path(path).relative_path();
  if (!fs::is_directory(base / rel, ec)) rel.clear();
  for (;;) {
    out.push_back(base / rel);
    if (rel.empty()) break;
    rel = rel.parent_path();
  }
  return out;
}

struct Room {
  uint64_t limit = 0, used = 0;
};

// The tightest (limit - used) among `dirs`, with the version's file names.
void tightest(const std::vector<fs::path>& dirs, bool v2, Room& best) {
  // cgroup v1 writes "no limit" as a page-rounded 2^63 - 1.
  constexpr uint64_t kUnlimited = uint64_t(1) << 60;
  for (const fs::path& d : dirs) {
    uint64_t limit = 0, used = 0;
    if (!read_number(d / (v2 ? "memory.max" : "memory.limit_in_bytes"), limit) || limit >= kUnlimited) continue;
    read_number(d / (v2 ? "memory.current" : "memory.usage_in_bytes"), used);
    // Inactive file pages are reclaimed before the limit is hit (as `docker stats` counts usage).
    const uint64_t inactive = stat_value(d / "memory.stat", v2 ? "inactive_file" : "total_inactive_file");
    used -= std::min(used, inactive);
    const uint64_t room = limit - std::min(limit, used);
    if (best.limit == 0 || room < best.limit - std::min(best.limit, best.used)) best = {limit, used};
  }
}

}  // namespace

uint64_t MachineMemory::spare() const {
  if (cgroup_limit == 0) return available;
  const uint64_t room = cgroup_limit - std::min(cgroup_limit, cgroup_used);
  return available == 0 ? room : std::min(available, room);
}

bool MachineMemory::cgroup_binds() const {
  if (cgroup_limit == 0) return false;
  return available == 0 || cgroup_limit - std::min(cgroup_limit, cgroup_used) < available;
}

MachineMemory read_machine_memory(const MemoryFiles& files) {
  MachineMemory m;
  {
    std::ifstream f(files.meminfo);
    std::string line;
    while (std::getline(f, line)) {
      uint64_t kb = 0;
      std::istringstream in(line);
      std::string key;
      if (in >> key >> kb && key == "MemAvailable:") {
        m.available = kb * 1024;
        break;
      }
    }
  }
  // /proc/self/cgroup: "0::/path" (v2), "4:memory:/path" (v1's memory controller).
  std::ifstream f(files.self_cgroup);
  std::string line;
  Room best;
  while (std::getline(f, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    const fs::path root(files.cgroup_root);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      tightest(cgroup_dirs(root, path), true, best);
    } else {
      std::istringstream names(controllers);
      std::string name;
      while (std::getline(names, name, ','))
        if (name == "memory") tightest(cgroup_dirs(root / "memory", path), false, best);
    }
  }
  m.cgroup_limit = best.limit;
  m.cgroup_used = best.used;
  return m;
}

}  // namespace swiftlet
