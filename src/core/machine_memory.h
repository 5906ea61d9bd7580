// How much memory this process can spare: the kernel's MemAvailable and the tightest cgroup
// memory limit above the process (v2 memory.max, v1 memory.limit_in_bytes). The files are
// read from paths a caller can change, so tests give a fake cgroup or a small machine.
#pragma once

#include <cstdint>
#include <string>

namespace swiftlet {

// Where the readings come from. cgroup_root holds the v2 hierarchy's files (memory.max) and,
// on v1 or hybrid systems, the memory controller's under cgroup_root/memory.
struct MemoryFiles {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
};

struct MachineMemory {
  uint64_t available = 0;     // MemAvailable; 0: unknown (no /proc/meminfo)
  uint64_t cgroup_limit = 0;  // the tightest cgroup limit on this process; 0: none
  uint64_t cgroup_used = 0;   // that cgroup's usage less its inactive file pages (reclaimable)
  // What can be spared: the smaller of MemAvailable and limit - used; 0: unknown.
  uint64_t spare() const;
  bool cgroup_binds() const;  // the cgroup's room is what spare() gives
};

// Never throws: a file that is missing or unreadable counts as no reading.
MachineMemory read_machine_memory(const MemoryFiles& files = {});

}  // namespace swiftlet
