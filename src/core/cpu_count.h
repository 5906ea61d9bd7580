// How many worker threads the CPU kernels use by default: one per physical core this process may
// run on (SMT siblings count once: the decode streams memory and the prompt products keep the FMA
// units busy, so a second hardware thread on a core adds little and makes the pool's spinning
// workers contend), and no more than a cgroup CPU quota allows (a container started with
// --cpus=4 on a 64-core host gets 4).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace swiftlet {

// The default above, read from sched_getaffinity, /sys/devices/system/cpu and /sys/fs/cgroup; at
// least 1. Falls back to std::thread::hardware_concurrency where those cannot be read.
int default_thread_count();

namespace cpu_count {

// What default_thread_count is computed from, read from the machine (read_topology) or given by
// tests.
struct Topology {
  std::vector<int> allowed;          // the CPUs this process may run on
  std::vector<std::string> cores;    // per allowed CPU: its core's identity ("" where unknown)
  double quota = 0;                  // CPUs the cgroup quota allows (0: no quota)
};

// cgroup v2 cpu.max ("max 100000" or "400000 100000"): the CPUs it allows, 0 for none or junk.
double parse_cpu_max(std::string_view text);
// cgroup v1: cpu.cfs_quota_us and cpu.cfs_period_us (-1 quota: none).
double parse_cfs(std::string_view quota_us, std::string_view period_us);
// Distinct physical cores among the allowed CPUs (CPUs of unknown core count once each), capped by
// the quota (rounded up); at least 1.
int thread_count(const Topology& t);
// The topology of this machine and process: each allowed CPU's core from
// /sys/devices/system/cpu/cpuN/topology, the quota from the cgroup v2 cpu.max of the process's
// cgroup and those above it (/proc/self/cgroup), else cgroup v1's cpu.cfs_quota_us. Files are
// read under `root` ("" for the real ones; tests pass a directory laid out the same way).
Topology read_topology(const std::string& root, const std::vector<int>& allowed);

}  // namespace cpu_count
}  // namespace swiftlet
