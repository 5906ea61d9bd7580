// Low-bit copies added to a container (add_miss_copies) and read by --on-miss low-bit: listed in a
// version-1 manifest that leaves the experts as they were, verified, a corrupt copy caught both by
// `verify` and when read, low-bit:0 the exact run bit for bit, low-bit reading fewer bytes, a
// container without copies refused with the command that adds them, an interrupted run leaving
// the container as it was.
#include "convert/repack.h"
#include "convert/synthetic.h"
#include "experts/qpack_experts.h"
#include "format/miss_copy.h"
#include "format/qpack.h"
#include "model/miss_policy.h"
#include "model/qwen3_hybrid.h"
#include "runtime/model_loader.h"
#include "support/greedy_decode.h"
#include "support/test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;

// The tiny-256 synthetic container (experts of 256 x 256, 4-bit: a 2-bit copy is 4 of their 7
// 16 KiB pages) in the test's scratch directory; `name` tells two apart.
std::string tiny_container(const testing::ScratchDir& dir, const char* name = "tiny.qpack") {
  RepackOptions o;
  o.output = dir / name;
  repack_synthetic("tiny-256", o);
  return o.output;
}

struct TinyRun {
  std::vector<float> logits;  // prefill's last row, then each decode step's
  ExpertStats stats;
  int cached_whole = 0, cached_other = 0;  // cache slots holding an expert's own bytes, or others
};

// 17 prompt tokens and 6 greedy steps through a cache of two experts.
TinyRun run(const std::string& path, const char* on_miss) {
  const MissPolicy policy = parse_miss_policy(on_miss);
  LoadOptions o;
  o.cache_bytes = 2 * QpackContainer::open(path).layout.expert_stride;
  o.miss_copies = policy.reads_low_bit();
  auto lm = load_model(path, o);
  Forward fwd(lm->model, Backend::CpuF32);
  fwd.set_miss_policy(policy);
  SessionState st = SessionState::create(lm->model.config);
  const std::vector<int32_t> prompt = testing::random_tokens(17, lm->model.config.vocab_size, 3);
  TinyRun r;
  r.logits = testing::greedy_logits(fwd, st, prompt, 6);
  r.stats = lm->experts->expert_stats();
  const QpackContainer qc = QpackContainer::open(path);
  const auto* source = dynamic_cast<const QpackExperts*>(lm->experts.get());
  if (!source) {
    ADD_FAILURE() << "not a streamed container";
    return r;
  }
  const ExpertCache& cache = source->cache();
  for (int slot = 0; slot < cache.allocated(); ++slot) {
    if (cache.state(slot) != ExpertCache::State::Ready) continue;
    const std::string file = testing::read_file(qc.layer_path(cache.layer_of(slot)));
    const bool whole = file.compare(size_t(cache.expert_of(slot)) * qc.layout.expert_stride, qc.layout.payload(),
                                    reinterpret_cast<const char*>(cache.data(slot)), qc.layout.payload()) == 0;
    (whole ? r.cached_whole : r.cached_other)++;
  }
  return r;
}

TEST(MissCopies, AreListedVerifiedAndLeaveTheExpertsAsTheyWere) {
  testing::ScratchDir dir;
  const std::string path = tiny_container(dir);
  const QpackContainer before = QpackContainer::open(path);
  std::vector<std::string> experts;
  for (int l = 0; l < before.layout.layer_count; ++l) experts.push_back(testing::read_file(before.layer_path(l)));
  const std::string layout = testing::read_file(before.path("packed_experts/layout.json"));

  const uint64_t bytes = add_miss_copies(path, {2, 2, {}});
  const QpackContainer qc = QpackContainer::open(path);
  EXPECT_EQ(qc.manifest.version, 1);
  for (const char* rel : {"miss_copies/layout.json", "miss_copies/checksums.json", "miss_copies/layer_00.bin",
                          "miss_copies/layer_03.bin"})
    EXPECT_TRUE(qc.manifest.files.contains(rel)) << rel;
  for (int l = 0; l < qc.layout.layer_count; ++l)
    EXPECT_EQ(testing::read_file(qc.layer_path(l)), experts[size_t(l)]) << "layer " << l;
  EXPECT_EQ(testing::read_file(qc.path("packed_experts/layout.json")), layout);
  const std::optional<MissCopies> mc = MissCopies::open(qc);
  ASSERT_TRUE(mc.has_value());
  EXPECT_EQ(mc->layout.bits, 2);
  EXPECT_LT(mc->layout.stride, qc.layout.expert_stride);
  EXPECT_GE(bytes, uint64_t(qc.layout.layer_count) * qc.layout.expert_count * mc->layout.stride);
  const QpackVerifyReport rep = verify_qpack(qc);
  EXPECT_TRUE(rep.ok()) << (rep.problems.empty() ? "" : rep.problems.front());
  EXPECT_EQ(rep.experts_checked, 2 * int64_t(qc.layout.layer_count) * qc.layout.expert_count);
  // The experts themselves: an exact run reads them as before the copies.
  EXPECT_EQ(run(path, "exact").logits, run(tiny_container(dir, "plain.qpack"), "exact").logits);

  // Replaced by 3-bit copies.
  add_miss_copies(path, {3, 1, {}});
  const QpackContainer qc3 = QpackContainer::open(path);
  EXPECT_EQ(MissCopies::open(qc3)->layout.bits, 3);
  EXPECT_TRUE(verify_qpack(qc3).ok());
}

TEST(MissCopies, LowBitZeroIsExactAndLowBitReadsFewerBytes) {
  testing::ScratchDir dir;
  const std::string path = tiny_container(dir);
  add_miss_copies(path, {2, 2, {}});
  const TinyRun exact = run(path, "exact");
  ASSERT_GT(exact.stats.misses, 0u);
  const TinyRun zero = run(path, "low-bit:0");
  EXPECT_EQ(zero.logits, exact.logits);  // bit for bit
  EXPECT_EQ(zero.stats.low_bit, 0u);
  EXPECT_EQ(zero.stats.bytes_read, exact.stats.bytes_read);

  const TinyRun low = run(path, "low-bit");
  EXPECT_GT(low.stats.low_bit, 0u);
  EXPECT_LT(low.stats.bytes_read, exact.stats.bytes_read);
  EXPECT_NE(low.logits, exact.logits);
  ASSERT_EQ(low.logits.size(), exact.logits.size());
  for (float x : low.logits) ASSERT_TRUE(std::isfinite(x));
  // A threshold between reads some misses whole, some from their copies; the cache holds only
  // whole experts.
  const TinyRun some = run(path, "low-bit:0.3");
  EXPECT_GT(some.stats.low_bit, 0u);
  EXPECT_LT(some.stats.low_bit, low.stats.low_bit);
  EXPECT_GT(some.cached_whole, 0);
  EXPECT_EQ(some.cached_other, 0);
}

TEST(MissCopies, ACorruptCopyIsCaughtByVerifyAndWhenRead) {
  testing::ScratchDir dir;
  const std::string path = tiny_container(dir);
  add_miss_copies(path, {2, 2, {}});
  const QpackContainer qc = QpackContainer::open(path);
  const MissCopyLayout layout = MissCopies::open(qc)->layout;
  {  // one bit of every copy of layer 1
    std::fstream f(qc.path(miss_copy_layer_file(1)), std::ios::in | std::ios::out | std::ios::binary);
    for (int e = 0; e < qc.layout.expert_count; ++e) {
      const std::streamoff at = std::streamoff(uint64_t(e) * layout.stride + layout.payload_offset + 5);
      f.seekg(at);
      char c = 0;
      f.read(&c, 1);
      c = char(c ^ 0x10);
      f.seekp(at);
      f.write(&c, 1);
    }
  }
  const QpackVerifyReport rep = verify_qpack(QpackContainer::open(path));
  ASSERT_EQ(rep.problems.size(), size_t(qc.layout.expert_count));
  EXPECT_NE(rep.problems.front().find("layer 01 expert 0 low-bit copy: checksum mismatch"), std::string::npos)
      << rep.problems.front();
  const std::string msg = testing::error_of([&] { run(path, "low-bit"); });
  EXPECT_NE(msg.find("low-bit copy checksum mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer 01"), std::string::npos) << msg;
  // The experts are whole: exact runs as before.
  EXPECT_EQ(run(path, "exact").logits, run(tiny_container(dir, "plain.qpack"), "exact").logits);
}

TEST(MissCopies, AContainerWithoutCopiesIsRefusedWithTheCommandThatAddsThem) {
  testing::ScratchDir dir;
  const std::string msg = testing::error_of([&] { run(tiny_container(dir), "low-bit"); });
  EXPECT_NE(msg.find("has no low-bit copies; add them with swiftlet-repack --add-miss-copy"), std::string::npos) << msg;
}

TEST(MissCopies, AnInterruptedRunLeavesTheContainerAsItWas) {
  testing::ScratchDir dir;
  const std::string path = tiny_container(dir);
  const std::string manifest = testing::read_file(path + "/manifest.json");
  // A run killed earlier left its scratch directory (its process is gone).
  fs::create_directories(fs::path(path) / "miss_copies.tmp-2147483646");
  request_repack_interrupt();
  const std::string msg = testing::error_of([&] { add_miss_copies(path, {2, 2, {}}); });
  request_repack_interrupt(false);
  EXPECT_NE(msg.find("interrupted"), std::string::npos) << msg;
  EXPECT_EQ(testing::read_file(path + "/manifest.json"), manifest);
  for (const auto& e : fs::directory_iterator(path))
    EXPECT_FALSE(e.path().filename().string().starts_with("miss_copies")) << e.path();
  EXPECT_FALSE(MissCopies::open(QpackContainer::open(path)).has_value());
  // Copies on disk that the manifest does not list are never read.
  add_miss_copies(path, {2, 2, {}});
  QpackContainer qc = QpackContainer::open(path);
  qc.manifest.files.erase(kMissCopyLayoutFile);
  EXPECT_FALSE(MissCopies::open(qc).has_value());
}

}  // namespace
}  // namespace swiftlet
