#include "core/cpu_count.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace swiftlet::cpu_count {
namespace {

namespace fs = std::filesystem;

// A directory laid out like / for read_topology: write(path, text) creates the file.
class FakeRoot {
 public:
  FakeRoot() : dir_(fs::temp_directory_path() / ("swiftlet_cpu_" + std::to_string(std::random_device{}()))) {
    fs::create_directories(dir_);
  }
  ~FakeRoot() { fs::remove_all(dir_); }
  void write(const std::string& path, const std::string& text) const {
    const fs::path p = dir_ / path;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  // CPU `cpu` on core `core` of package `package`.
  void cpu(int cpu, int package, int core) const {
    const std::string d = "sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    write(d + "physical_package_id", std::to_string(package) + "\n");
    write(d + "core_id", std::to_string(core) + "\n");
  }
  std::string path() const { return dir_.string(); }

 private:
  fs::path dir_;
};

TEST(CpuCount, CgroupQuotas) {
  EXPECT_DOUBLE_EQ(parse_cpu_max("400000 100000\n"), 4.0);
  EXPECT_DOUBLE_EQ(parse_cpu_max("150000 100000"), 1.5);
  EXPECT_DOUBLE_EQ(parse_cpu_max("max 100000\n"), 0.0);
  EXPECT_DOUBLE_EQ(parse_cpu_max(""), 0.0);
  EXPECT_DOUBLE_EQ(parse_cpu_max("garbage"), 0.0);
  EXPECT_DOUBLE_EQ(parse_cpu_max("-5 100000"), 0.0);
  EXPECT_DOUBLE_EQ(parse_cfs("200000\n", "100000\n"), 2.0);
  EXPECT_DOUBLE_EQ(parse_cfs("-1\n", "100000\n"), 0.0);
  EXPECT_DOUBLE_EQ(parse_cfs("", ""), 0.0);
}

TEST(CpuCount, SmtSiblingsCountOnceAndTheQuotaCaps) {
  Topology t;
  t.allowed = {0, 1, 2, 3, 4, 5, 6, 7};
  t.cores = {"0:0", "0:1", "0:2", "0:3", "0:0", "0:1", "0:2", "0:3"};  // 4 cores, 2 threads each
  EXPECT_EQ(thread_count(t), 4);
  t.cores = {"0:0", "0:1", "0:2", "0:3", "1:0", "1:1", "1:2", "1:3"};  // two packages: core ids repeat
  EXPECT_EQ(thread_count(t), 8);
  t.quota = 2.5;  // rounded up
  EXPECT_EQ(thread_count(t), 3);
  t.quota = 0.2;
  EXPECT_EQ(thread_count(t), 1);
  t = Topology{{0, 1, 2}, {"", "", ""}, 0};  // topology unknown: each CPU counts
  EXPECT_EQ(thread_count(t), 3);
  EXPECT_EQ(thread_count(Topology{}), 1);
}

TEST(CpuCount, ReadsSysfsAndTheProcessCgroup) {
  const FakeRoot root;
  for (int c = 0; c < 8; ++c) root.cpu(c, 0, c % 4);  // 4 cores with 2 threads each
  // Allowed: CPUs 0, 1, 4 (cores 0, 1, 0): 2 cores.
  Topology t = read_topology(root.path(), {0, 1, 4});
  EXPECT_EQ(thread_count(t), 2);
  EXPECT_DOUBLE_EQ(t.quota, 0.0);
  // cgroup v2: the process's cgroup has no limit, its parent allows 1.5 CPUs.
  root.write("proc/self/cgroup", "0::/box/job\n");
  root.write("sys/fs/cgroup/box/job/cpu.max", "max 100000\n");
  root.write("sys/fs/cgroup/box/cpu.max", "150000 100000\n");
  t = read_topology(root.path(), {0, 1, 2, 3});
  EXPECT_DOUBLE_EQ(t.quota, 1.5);
  EXPECT_EQ(thread_count(t), 2);
  // The smaller of two quotas on the way up holds.
  root.write("sys/fs/cgroup/box/job/cpu.max", "100000 100000\n");
  EXPECT_EQ(thread_count(read_topology(root.path(), {0, 1, 2, 3})), 1);
}

TEST(CpuCount, CgroupV1Quota) {
  const FakeRoot root;
  for (int c = 0; c < 4; ++c) root.cpu(c, 0, c);
  root.write("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "300000\n");
  root.write("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  const Topology t = read_topology(root.path(), {0, 1, 2, 3});
  EXPECT_DOUBLE_EQ(t.quota, 3.0);
  EXPECT_EQ(thread_count(t), 3);
}

TEST(CpuCount, ThisMachine) {
  const int n = default_thread_count();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, 4096);
}

}  // namespace
}  // namespace swiftlet::cpu_count
