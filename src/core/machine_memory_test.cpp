#include "core/machine_memory.h"

#include "support/fake_machine.h"

#include <gtest/gtest.h>

namespace swiftlet {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

TEST(MachineMemory, MemAvailableWithoutACgroupLimit) {
  testing::FakeMachine m(10 * kGiB);
  const MachineMemory r = read_machine_memory(m.files());
  EXPECT_EQ(r.available, 10 * kGiB);
  EXPECT_EQ(r.cgroup_limit, 0u);
  EXPECT_EQ(r.spare(), 10 * kGiB);
  EXPECT_FALSE(r.cgroup_binds());
  // "max" is no limit.
  m.write("sys/fs/cgroup/memory.max", "max\n");
  EXPECT_EQ(read_machine_memory(m.files()).spare(), 10 * kGiB);
}

TEST(MachineMemory, ACgroupV2LimitBindsLessItsUsageButNotItsInactiveFilePages) {
  testing::FakeMachine m(10 * kGiB);
  // 4 GiB limit, 1.5 GiB charged of which 0.5 GiB inactive page cache: 3 GiB left.
  m.cgroup_v2("/app", 4 * kGiB, 3 * kGiB / 2, kGiB / 2);
  const MachineMemory r = read_machine_memory(m.files());
  EXPECT_EQ(r.cgroup_limit, 4 * kGiB);
  EXPECT_EQ(r.cgroup_used, kGiB);
  EXPECT_EQ(r.spare(), 3 * kGiB);
  EXPECT_TRUE(r.cgroup_binds());
  // A limit with more room than MemAvailable does not bind.
  m.cgroup_v2("/app", 64 * kGiB, kGiB);
  EXPECT_EQ(read_machine_memory(m.files()).spare(), 10 * kGiB);
  EXPECT_FALSE(read_machine_memory(m.files()).cgroup_binds());
}

TEST(MachineMemory, AParentGroupsLimitBindsTheProcess) {
  testing::FakeMachine m(10 * kGiB);
  m.cgroup_v2("/a", 2 * kGiB, kGiB);  // the parent: 1 GiB left
  m.write("sys/fs/cgroup/a/b/memory.max", "max\n");
  m.write("sys/fs/cgroup/a/b/memory.current", "12345\n");
  m.write("proc/self/cgroup", "0::/a/b\n");
  EXPECT_EQ(read_machine_memory(m.files()).spare(), kGiB);
  // The process's group is not visible (another cgroup namespace): the root's files are read.
  m.write("proc/self/cgroup", "0::/elsewhere\n");
  m.write("sys/fs/cgroup/memory.max", std::to_string(3 * kGiB) + "\n");
  m.write("sys/fs/cgroup/memory.current", std::to_string(kGiB) + "\n");
  EXPECT_EQ(read_machine_memory(m.files()).spare(), 2 * kGiB);
}

TEST(MachineMemory, CgroupV1MemoryController) {
  testing::FakeMachine m(10 * kGiB);
  m.cgroup_v1("/docker/x", 6 * kGiB, 2 * kGiB);
  EXPECT_EQ(read_machine_memory(m.files()).spare(), 4 * kGiB);
  // v1 writes "unlimited" as 2^63 rounded down to a page.
  m.cgroup_v1("/docker/x", 9223372036854771712ull, 2 * kGiB);
  const MachineMemory r = read_machine_memory(m.files());
  EXPECT_EQ(r.cgroup_limit, 0u);
  EXPECT_EQ(r.spare(), 10 * kGiB);
}

TEST(MachineMemory, NothingReadableIsNoReading) {
  MemoryFiles f{"/nonexistent/meminfo", "/nonexistent/cgroup", "/nonexistent/sys"};
  const MachineMemory r = read_machine_memory(f);
  EXPECT_EQ(r.available, 0u);
  EXPECT_EQ(r.spare(), 0u);
  // Garbage is no reading either.
  testing::FakeMachine m(kGiB);
  m.write("proc/meminfo", "MemAvailable: lots\n");
  m.write("proc/self/cgroup", "garbage\n");
  EXPECT_EQ(read_machine_memory(m.files()).spare(), 0u);
}

}  // namespace
}  // namespace swiftlet
