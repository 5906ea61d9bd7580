// Conversion shard by shard: --from-hf against a loopback hub and --from-dir --delete-source give
// the container a whole-directory repack gives, fetch each shard once, and resume after an
// interruption without fetching or converting again what was done. (kill -9 at random points and
// a disk quota: tests/fault/fault_test.cpp.)
#include "convert/hf_source.h"
#include "convert/repack.h"
#include "convert/shard_feed.h"
#include "core/error.h"
#include "io/mapped_file.h"
#include "support/local_hub.h"
#include "support/sharded_checkpoint.h"
#include "support/test_paths.h"
#include "support/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using swiftlet::testing::error_of;
using swiftlet::testing::fixture_dir;
using swiftlet::testing::LocalHub;
using swiftlet::testing::write_sharded;
using TempDir = swiftlet::testing::ScratchDir;

// Every file of a container but manifest.json (which names where it came from).
std::map<std::string, std::string> container_bytes(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "manifest.json")
      m[fs::relative(e.path(), dir).string()] = read_text_file(e.path().string());
  return m;
}

RepackOptions opts(const std::string& out, std::vector<std::string>* log = nullptr) {
  RepackOptions o;
  o.output = out;
  if (log) o.log = [log](const std::string& s) { log->push_back(s); };
  return o;
}

// Interrupts a repack (as SIGINT does) when it logs a line starting with `prefix`.
RepackOptions interrupting_at(const std::string& out, const std::string& prefix, std::vector<std::string>* log) {
  RepackOptions o = opts(out);
  o.log = [prefix, log](const std::string& s) {
    log->push_back(s);
    if (s.starts_with(prefix)) request_repack_interrupt();
  };
  return o;
}

bool logged(const std::vector<std::string>& log, const std::string& part) {
  return std::any_of(log.begin(), log.end(), [&](const std::string& l) { return l.find(part) != std::string::npos; });
}

class ShardByShard : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fixture_dir("next_8l") + "/config.json")) GTEST_SKIP() << "fixture next_8l missing";
    // ~8 shards of the 1.5 MB checkpoint, layers straddling shards as on the hub.
    shards_ = write_sharded(fixture_dir("next_8l"), tmp_ / "ckpt", 200 << 10);
    ASSERT_GE(shards_.size(), 6u);
    repack_from_dir(tmp_ / "ckpt", opts(tmp_ / "whole.qpack"));
    want_ = container_bytes(tmp_ / "whole.qpack");
  }
  void TearDown() override { request_repack_interrupt(false); }

  TempDir tmp_;
  std::vector<std::string> shards_;
  std::map<std::string, std::string> want_;
};

TEST(ShardSchedule, PartsFollowTheirLastShardAndAtMostTwoShardsAreOnDisk) {
  // Shards of 10, 20, 30, 40 bytes; parts reading {0}, {0, 1} (a layer straddling), {1}, {2}, {2, 3}, {3}.
  const std::vector<uint64_t> bytes = {10, 20, 30, 40};
  ShardSchedule s = schedule_shards({{0}, {0, 1}, {1}, {2}, {3, 2}, {3}}, bytes, true);
  EXPECT_EQ(s.order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(s.step, (std::vector<size_t>{0, 1, 1, 2, 3, 3}));
  EXPECT_EQ(s.last_step, (std::vector<size_t>{1, 1, 3, 3}));
  EXPECT_EQ(s.total, 100u);
  // Step 0: shard 0 and the next one fetched ahead; step 1: 0 and 1, nothing ahead; step 2: 2 and
  // 3 ahead; step 3: 2 and 3.
  EXPECT_EQ(s.peak, 70u);
  EXPECT_EQ(s.most_shards, 2u);

  // A part reading shards 0 and 3 holds shard 0 until 3 is there; 1, 2 and 3 come in turn beside it.
  s = schedule_shards({{0, 3}, {1}, {2}}, bytes, true);
  EXPECT_EQ(s.step, (std::vector<size_t>{3, 1, 2}));
  EXPECT_EQ(s.peak, 10u + 40u);
  // Shards already made (not read again) are not in the order; kept shards all count.
  s = schedule_shards({{2}, {3}}, bytes, false);
  EXPECT_EQ(s.order, (std::vector<int>{2, 3}));
  EXPECT_EQ(s.peak, 70u);
  EXPECT_EQ(s.most_shards, 2u);
}

TEST_F(ShardByShard, FromHfGivesTheDirectorysContainerAndFetchesEachShardOnce) {
  LocalHub hub(tmp_ / "ckpt");
  hub.export_endpoint();
  std::vector<std::string> log;
  const std::string out = tmp_ / "hf.qpack";
  repack_from_hf("acme/next", "main", "", false, opts(out, &log));
  EXPECT_EQ(container_bytes(out), want_);
  EXPECT_FALSE(fs::exists(out + ".download"));
  EXPECT_FALSE(fs::exists(out + ".partial"));
  EXPECT_TRUE(logged(log, "peak disk use")) << "no plan printed";
  // Each shard: its header (one request cut short), then its bytes.
  const auto served = hub.served();
  for (const auto& s : shards_) EXPECT_EQ(std::count(served.begin(), served.end(), s), 2) << s;
}

TEST_F(ShardByShard, AnInterruptedHubConversionResumesWithoutFetchingWhatItConverted) {
  LocalHub hub(tmp_ / "ckpt");
  hub.export_endpoint();
  const std::string out = tmp_ / "hf.qpack";
  std::vector<std::string> log;
  const std::string e = error_of([&] { repack_from_hf("acme/next", "main", "", false, interrupting_at(out, "layer 05/", &log)); });
  EXPECT_NE(e.find("interrupted"), std::string::npos) << e;
  EXPECT_NE(e.find("run the same command again"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(out));
  ASSERT_TRUE(fs::exists(out + ".partial"));
  // The first shards were converted and deleted.
  EXPECT_FALSE(fs::exists(out + ".download/" + shards_[0]));
  request_repack_interrupt(false);
  const size_t before = hub.served().size();
  log.clear();
  repack_from_hf("acme/next", "main", "", false, opts(out, &log));
  EXPECT_EQ(container_bytes(out), want_);
  EXPECT_TRUE(logged(log, "parts made earlier")) << "did not resume";
  const auto served = hub.served();
  const std::vector<std::string> again(served.begin() + std::ptrdiff_t(before), served.end());
  EXPECT_EQ(std::count(again.begin(), again.end(), shards_[0]), 0) << "the first shard was fetched again";
  for (const auto& s : again) EXPECT_LE(std::count(again.begin(), again.end(), s), 1) << s;
  EXPECT_FALSE(fs::exists(out + ".partial"));
  EXPECT_FALSE(fs::exists(out + ".download"));
}

TEST_F(ShardByShard, DeleteSourceFreesEachShardAndResumesAfterAnInterruption) {
  const std::string out = tmp_ / "local.qpack";
  std::vector<std::string> log;
  RepackOptions o = interrupting_at(out, "layer 04/", &log);
  o.delete_source = true;
  EXPECT_NE(error_of([&] { repack_from_dir(tmp_ / "ckpt", o); }).find("interrupted"), std::string::npos);
  EXPECT_FALSE(fs::exists(tmp_ / ("ckpt/" + shards_[0]))) << "a converted shard was kept";
  EXPECT_TRUE(fs::exists(tmp_ / ("ckpt/" + shards_.back()))) << "a shard was deleted before it was converted";
  request_repack_interrupt(false);
  o = opts(out, &log);
  o.delete_source = true;
  repack_from_dir(tmp_ / "ckpt", o);
  EXPECT_EQ(container_bytes(out), want_);
  for (const auto& s : shards_) EXPECT_FALSE(fs::exists(tmp_ / ("ckpt/" + s))) << s;
  EXPECT_TRUE(fs::exists(tmp_ / "ckpt/config.json"));
  EXPECT_FALSE(fs::exists(out + ".partial"));
}

// A run killed after writing the manifest, while removing its scratch files or renaming: the
// shards are gone, and the rerun moves the complete container into place.
TEST_F(ShardByShard, ABuildStoppedWhileMovingIntoPlaceIsFinishedByTheRerun) {
  const std::string out = tmp_ / "local.qpack";
  fs::copy(tmp_ / "whole.qpack", out + ".partial", fs::copy_options::recursive);
  for (const auto& s : shards_) fs::remove(tmp_ / ("ckpt/" + s));
  std::vector<std::string> log;
  RepackOptions o = opts(out, &log);
  o.delete_source = true;
  repack_from_dir(tmp_ / "ckpt", o);
  EXPECT_EQ(container_bytes(out), want_);
  EXPECT_FALSE(fs::exists(out + ".partial"));
  EXPECT_TRUE(logged(log, "holds a complete container"));
}

TEST_F(ShardByShard, AShardDeletedBeforeItsConversionIsNamed) {
  fs::remove(tmp_ / ("ckpt/" + shards_[2]));
  RepackOptions o = opts(tmp_ / "x.qpack");
  o.delete_source = true;
  const std::string e = error_of([&] { repack_from_dir(tmp_ / "ckpt", o); });
  EXPECT_NE(e.find(shards_[2]), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(tmp_ / "x.qpack"));
}

}  // namespace
}  // namespace swiftlet
