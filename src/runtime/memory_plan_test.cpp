// The expert cache's size: the default from what a (fake) machine can spare, between one token's
// experts and every expert; a cgroup limit binds; --ram-budget and an explicit size win.
#include "runtime/model_loader.h"

#include "format/qpack.h"
#include "support/fake_machine.h"
#include "support/test_util.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

namespace swiftlet {
namespace {

constexpr uint64_t kMiB = 1ull << 20, kGiB = 1ull << 30;

class MemoryPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const QpackContainer qc = QpackContainer::open(path_);
    stride_ = qc.layout.expert_stride;
    all_ = qc.config.num_layers * qc.config.num_experts;
    one_token_ = qc.config.num_layers * qc.config.num_experts_per_tok;
    ASSERT_LT(one_token_ + 3, all_);  // the tiny model leaves room between the two
    LoadOptions o;
    o.cache_bytes = 0;
    const MemoryPlan p = plan_memory(path_, o);
    fixed_ = p.resident + p.state + p.buffers + p.runtime;
  }
  // The plan with no size given, on a machine whose files are `m`'s.
  MemoryPlan plan_on(const testing::FakeMachine& m, LoadOptions o = {}) {
    o.machine = m.files();
    return plan_memory(path_, o);
  }
  std::string path_ = testing::tiny_qpack_with_tokenizer();
  uint64_t stride_ = 0, fixed_ = 0;
  int all_ = 0, one_token_ = 0;
};

TEST_F(MemoryPlanTest, DefaultIsWhatTheMachineSparesLessAMargin) {
  // Below 4 GiB spare, the headroom is its minimum, 512 MiB: spare = fixed + 512 MiB + n experts
  // (and a little less than one more) leaves n experts.
  const int n = one_token_ + 3;
  testing::FakeMachine m(fixed_ + 512 * kMiB + uint64_t(n) * stride_ + stride_ / 2);
  const MemoryPlan p = plan_on(m);
  EXPECT_EQ(p.cache_experts, n);
  EXPECT_EQ(p.cache, uint64_t(n) * stride_);
  EXPECT_EQ(p.headroom, 512 * kMiB);
  EXPECT_NE(p.reason.find("MemAvailable"), std::string::npos) << p.reason;
  EXPECT_NE(p.reason.find("headroom 0.54 GB"), std::string::npos) << p.reason;
  EXPECT_EQ(p.reason.find("cgroup"), std::string::npos) << p.reason;
  // Above 4 GiB spare the headroom is an eighth of it: 8 GiB spare, 1 GiB headroom.
  testing::FakeMachine big(8 * kGiB);
  EXPECT_EQ(plan_on(big).headroom, kGiB);
}

TEST_F(MemoryPlanTest, ACgroupLimitBinds) {
  testing::FakeMachine m(64 * kGiB);
  const int n = one_token_ + 2;
  // Limit - (current - inactive file pages) = fixed + 512 MiB + n experts.
  const uint64_t room = fixed_ + 512 * kMiB + uint64_t(n) * stride_;
  m.cgroup_v2("/job", 2 * kGiB + room, 2 * kGiB + 100 * kMiB, 100 * kMiB);
  const MemoryPlan p = plan_on(m);
  EXPECT_EQ(p.cache_experts, n);
  EXPECT_EQ(p.spare, room);
  EXPECT_NE(p.reason.find("cgroup limit"), std::string::npos) << p.reason;
}

TEST_F(MemoryPlanTest, ASmallMachineFallsBackToOneTokensExperts) {
  testing::FakeMachine m(300 * kMiB);  // less than the margin alone
  const MemoryPlan p = plan_on(m);
  EXPECT_EQ(p.cache_experts, one_token_);
  EXPECT_NE(p.reason.find("one token's experts, the least"), std::string::npos) << p.reason;
  // No reading at all (no /proc/meminfo): one token's experts too.
  LoadOptions o;
  o.machine = {"/nonexistent/meminfo", "/nonexistent/cgroup", "/nonexistent/sys"};
  const MemoryPlan none = plan_memory(path_, o);
  EXPECT_EQ(none.cache_experts, one_token_);
  EXPECT_NE(none.reason.find("no memory reading"), std::string::npos) << none.reason;
}

TEST_F(MemoryPlanTest, NeverMoreThanTheContainersExperts) {
  testing::FakeMachine m(256 * kGiB);
  const MemoryPlan p = plan_on(m);
  EXPECT_EQ(p.cache_experts, all_);
  EXPECT_EQ(p.cache, uint64_t(all_) * stride_);
  EXPECT_NE(p.reason.find("every expert"), std::string::npos) << p.reason;
  LoadOptions o;
  o.cache_bytes = 1000 * kGiB;
  EXPECT_EQ(plan_on(m, o).cache_experts, all_);
}

TEST_F(MemoryPlanTest, RamBudgetWinsOverTheMachine) {
  testing::FakeMachine m(256 * kGiB);
  LoadOptions o;
  o.ram_budget = fixed_ + 5 * stride_ + 10;  // below one token's experts: a budget may ask that
  const MemoryPlan p = plan_on(m, o);
  EXPECT_EQ(p.cache_experts, 5);
  EXPECT_EQ(p.headroom, 0u);
  EXPECT_NE(p.reason.find("RAM budget"), std::string::npos) << p.reason;
  // ... on a small machine too.
  testing::FakeMachine small(300 * kMiB);
  o.ram_budget = fixed_ + uint64_t(one_token_ + 4) * stride_;
  EXPECT_EQ(plan_on(small, o).cache_experts, one_token_ + 4);
}

TEST_F(MemoryPlanTest, CacheFlagsSetTheSizeExactly) {
  testing::FakeMachine m(256 * kGiB);
  LoadOptions o;
  // --cache-mb: that many bytes, in whole experts, whatever the machine has.
  const uint64_t bytes = 7 * stride_ + stride_ / 3;
  apply_cache_flags(o, "", fmt::format("{}", double(bytes) / 1e6), "", "uring", 4096);
  const MemoryPlan p = plan_on(m, o);
  EXPECT_EQ(p.cache_experts, 7);
  EXPECT_NE(p.reason.find("the size asked for"), std::string::npos) << p.reason;
  testing::FakeMachine small(300 * kMiB);
  EXPECT_EQ(plan_on(small, o).cache_experts, 7);
  // --cache-gb all: every expert.
  LoadOptions all;
  apply_cache_flags(all, "all", "", "", "uring", 4096);
  EXPECT_EQ(plan_on(small, all).cache_experts, all_);
}

}  // namespace
}  // namespace swiftlet
