// A machine's memory files in a scratch directory (core/machine_memory.h reads them): MemAvailable,
// the process's cgroup line and its cgroup's limit, so memory readings and the default expert
// cache can be tested for any machine.
#pragma once

#include "core/machine_memory.h"
#include "support/test_util.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace swiftlet::testing {

class FakeMachine {
 public:
  // A machine with `available` bytes of MemAvailable and no cgroup limit.
  explicit FakeMachine(uint64_t available) {
    write("proc/meminfo", "MemTotal:       99999999 kB\nMemFree:          1000 kB\nMemAvailable:   " +
                              std::to_string(available / 1024) + " kB\n");
    write("proc/self/cgroup", "0::/\n");
  }
  // The process in cgroup v2 group `group` ("/" the root) limited to `limit` bytes of which `current`
  // are used, `inactive_file` of those reclaimable.
  void cgroup_v2(const std::string& group, uint64_t limit, uint64_t current, uint64_t inactive_file = 0) {
    write("proc/self/cgroup", "0::" + group + "\n");
    const std::string d = "sys/fs/cgroup" + group + (group.back() == '/' ? "" : "/");
    write(d + "memory.max", std::to_string(limit) + "\n");
    write(d + "memory.current", std::to_string(current) + "\n");
    write(d + "memory.stat", "anon 1\nfile 2\ninactive_file " + std::to_string(inactive_file) + "\nactive_file 3\n");
  }
  // cgroup v1: the memory controller's group.
  void cgroup_v1(const std::string& group, uint64_t limit, uint64_t usage) {
    write("proc/self/cgroup", "5:cpu,cpuacct:/\n4:memory:" + group + "\n0::/\n");
    const std::string d = "sys/fs/cgroup/memory" + group + "/";
    write(d + "memory.limit_in_bytes", std::to_string(limit) + "\n");
    write(d + "memory.usage_in_bytes", std::to_string(usage) + "\n");
    write(d + "memory.stat", "cache 0\ntotal_inactive_file 0\n");
  }
  void write(const std::string& rel, const std::string& text) const {
    const std::filesystem::path p = dir_.path() / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  MemoryFiles files() const {
    return {dir_ / "proc/meminfo", dir_ / "proc/self/cgroup", dir_ / "sys/fs/cgroup"};
  }

 private:
  ScratchDir dir_;
};

}  // namespace swiftlet::testing
