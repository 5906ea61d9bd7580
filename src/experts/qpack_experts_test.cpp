// The .qpack expert source: it reads the right blobs, and what checking their checksums costs.
#include "experts/qpack_experts.h"

#include "io/mapped_file.h"
#include "convert/synthetic.h"
#include "support/test_util.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <random>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;

TEST(QpackExpertsTest, AcquireReadsEachExpertsBlob) {
  const fs::path dir = fs::temp_directory_path() / ("swiftlet_qpack_experts_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RepackOptions o;
  o.output = (dir / "t.qpack").string();
  repack_synthetic("tiny", o);
  const QpackContainer qc = QpackContainer::open(o.output);
  QpackExperts src(qc);
  EXPECT_EQ(src.max_batch(), 4 * qc.config.num_experts_per_tok);
  EXPECT_TRUE(src.verifying());
  const int32_t ids[3] = {15, 0, 7};
  ExpertWeights w[3];
  src.acquire(2, ids, w);
  const std::string file = read_text_file(qc.layer_path(2));
  for (int i = 0; i < 3; ++i) {
    const uint8_t* blob = reinterpret_cast<const uint8_t*>(file.data()) + size_t(ids[i]) * qc.layout.expert_stride;
    for (int p = 0; p < 3; ++p) {
      const QMatrix& m = p == 0 ? w[i].gate : p == 1 ? w[i].up : w[i].down;
      const QMatrix want = qc.layout.view(p, qc.config, blob);
      EXPECT_EQ(m.rows, want.rows);
      EXPECT_EQ(m.cols, want.cols);
      EXPECT_EQ(m.bits, 4);
      EXPECT_EQ(0, std::memcmp(m.data, want.data, size_t(m.rows) * m.row_bytes()));
      EXPECT_EQ(0, std::memcmp(m.scales, want.scales, size_t(m.rows) * m.scale_row_bytes()));
      EXPECT_EQ(0, std::memcmp(m.biases, want.biases, size_t(m.rows) * m.scale_row_bytes()));
    }
  }
  EXPECT_EQ(src.expert_stats().misses, 3u);
  EXPECT_EQ(src.expert_stats().bytes_read, 3 * qc.layout.expert_stride);
  fs::remove_all(dir);
}

// A tiny container made once for the tests below.
class QpackSource : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("swiftlet_qpack_src_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    RepackOptions o;
    o.output = (*dir_ / "t.qpack").string();
    repack_synthetic("tiny", o);
    qc_ = new QpackContainer(QpackContainer::open(o.output));
  }
  static void TearDownTestSuite() {
    delete qc_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  static size_t stride() { return size_t(qc_->layout.expert_stride); }
  static std::string file_bytes(int layer, int expert) {
    const std::string f = read_text_file(qc_->layer_path(layer));
    return f.substr(size_t(expert) * stride(), qc_->layout.payload());
  }
  static std::string blob_of(const ExpertWeights& w) {
    return std::string(reinterpret_cast<const char*>(w.blob), qc_->layout.payload());
  }
  static fs::path* dir_;
  static QpackContainer* qc_;
};
fs::path* QpackSource::dir_ = nullptr;
QpackContainer* QpackSource::qc_ = nullptr;

// Fails every read of one expert, as a dying disk would; others read normally.
class FailingReader : public ExpertReader {
 public:
  FailingReader(const QpackContainer& qc, int layer, int expert) : inner_(qc), layer_(layer), expert_(expert) {}
  const char* name() const override { return "failing"; }
  void submit(int layer, int expert, void* dst, size_t bytes, uint64_t tag, int buffer) override {
    if (layer == layer_ && expert == expert_) {
      std::memset(dst, 0xAB, bytes);  // garbage that must never reach the model
      done_.push_back({tag, "cannot read layer 01 expert 5: Input/output error"});
      return;
    }
    inner_.submit(layer, expert, dst, bytes, tag, buffer);
  }
  void reap(bool wait, std::vector<ReadDone>& done) override {
    for (auto& d : done_) done.push_back(d);
    done_.clear();
    inner_.reap(wait, done);
  }
  int outstanding() const override { return int(done_.size()) + inner_.outstanding(); }
  bool buffered() const override { return false; }

 private:
  UringExpertReader inner_;
  int layer_, expert_;
  std::vector<ReadDone> done_;
};

TEST_F(QpackSource, EveryIoModeAndBudgetServesTheSameBytes) {
  for (IoMode io : {IoMode::Uring, IoMode::Serial})
    for (size_t slots : {1, 2, 5, 0}) {
      QpackExpertsOptions o;
      o.io = io;
      o.cache_bytes = slots * stride();
      o.prepared_slots = 0;  // allocation on demand: evictions only when the budget is full
      QpackExperts src(*qc_, std::move(o));
      std::mt19937 rng(3);
      for (int step = 0; step < 60; ++step) {
        const int layer = int(rng() % uint32_t(qc_->layout.layer_count));
        std::vector<int32_t> ids;
        while (int(ids.size()) < std::min(3, src.max_batch())) {
          const int32_t e = int32_t(rng() % uint32_t(qc_->layout.expert_count));
          if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
        }
        src.prefetch(layer, ids);
        std::vector<ExpertWeights> w(ids.size());
        src.acquire(layer, ids, w);
        for (size_t i = 0; i < ids.size(); ++i)
          ASSERT_EQ(blob_of(w[i]), file_bytes(layer, ids[i])) << "layer " << layer << " expert " << ids[i];
        src.release(layer);
        const ExpertStats st = src.expert_stats();
        ASSERT_LE(st.cache_bytes, st.cache_budget);
      }
      const ExpertStats st = src.expert_stats();
      EXPECT_EQ(st.hits + st.misses, 60u * uint64_t(std::min(3, src.max_batch())));
      EXPECT_GE(st.bytes_read, st.misses * stride());
      if (slots == 0) {
        EXPECT_EQ(st.evictions, 0u);
      }
      if (slots == 1) {
        EXPECT_EQ(st.hits, 0u);
      }
    }
}

TEST_F(QpackSource, RepeatedExpertsAreHitsAndCountersAddUp) {
  QpackExpertsOptions o;
  o.cache_bytes = 4 * stride();
  o.prepared_slots = 0;  // cache_bytes counts exactly the slots claimed
  QpackExperts src(*qc_, std::move(o));
  ExpertWeights w[2];
  const int32_t a[2] = {1, 2}, b[2] = {2, 3};
  src.acquire(0, a, w);
  src.release(0);
  src.acquire(0, b, w);  // 2 is a hit
  src.release(0);
  ExpertStats st = src.expert_stats();
  EXPECT_EQ(st.misses, 3u);
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.evictions, 0u);
  EXPECT_EQ(st.bytes_read, 3 * stride());
  EXPECT_EQ(st.cache_bytes, 3 * stride());
  const int32_t c[2] = {4, 5};  // 5 experts in 4 slots: 1 (used once, oldest) goes
  src.acquire(0, c, w);
  src.release(0);
  st = src.expert_stats();
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_EQ(st.cache_bytes, 4 * stride());
  EXPECT_FALSE(src.ready(0, 1));
  EXPECT_TRUE(src.ready(0, 2));
}

// Decode as Forward drives it: prefetch the step's experts, maybe predict the next layer, then
// acquire one expert at a time. A step's cached expert must survive the reads of its misses.
// Two slots; step 1 uses 1 then 2, so 1 is the lowest-ranked (same use count, older). Step 2
// needs {1, 3}: 3 must take 2's slot, not 1's (else 1 is read again and both are misses), and
// a prediction for the next layer must not take 1's slot either.
TEST_F(QpackSource, AStepsCachedExpertsSurviveItsOwnMisses) {
  for (bool predict : {false, true}) {
    QpackExpertsOptions o;
    o.cache_bytes = 2 * stride();
    o.prepared_slots = 0;
    QpackExperts src(*qc_, std::move(o));
    ExpertWeights w[1];
    auto step = [&](std::vector<int32_t> ids) {
      src.prefetch(0, ids);
      if (predict) {
        const int32_t guess[2] = {5, 6};
        src.predict(1, guess);
      }
      std::stable_partition(ids.begin(), ids.end(), [&](int32_t e) { return src.ready(0, e); });
      for (int32_t e : ids) {
        src.acquire(0, std::span(&e, 1), w);
        ASSERT_EQ(blob_of(w[0]), file_bytes(0, e));
        src.release(0);
      }
    };
    step({1, 2});
    step({1, 3});
    const ExpertStats st = src.expert_stats();
    EXPECT_EQ(st.hits, 1u) << "predict " << predict;
    EXPECT_EQ(st.misses, 3u) << "predict " << predict;
    EXPECT_TRUE(src.ready(0, 1));
    EXPECT_TRUE(src.ready(0, 3));
    EXPECT_FALSE(src.ready(0, 2));
  }
}

// The tiny model's 4 layers, one slot each (the cache holds one token's expert per layer), decoded
// as Forward does: each layer prefetches its step, guesses the next layer (from the second token
// on), then acquires. Layer l uses expert l + 1 on both tokens and every guess (expert 9) is
// wrong. A guess may not push out the expert the next layer used on the previous token, so the
// second token hits every layer; with room to spare (two slots a layer) the guesses are read.
TEST_F(QpackSource, AGuessNeverEvictsWhatItsLayersLatestStepUsed) {
  for (int per_layer : {1, 2}) {
    QpackExpertsOptions o;
    o.cache_bytes = size_t(4 * per_layer) * stride();
    o.prepared_slots = 0;
    QpackExperts src(*qc_, std::move(o));
    ExpertWeights w[1];
    for (int token = 0; token < 2; ++token) {
      for (int l = 0; l < 4; ++l) {
        int32_t e = l + 1;
        src.prefetch(l, std::span(&e, 1));
        if (token > 0 && l + 1 < 4) {
          const int32_t guess = 9;
          src.predict(l + 1, std::span(&guess, 1));
        }
        src.acquire(l, std::span(&e, 1), w);
        ASSERT_EQ(blob_of(w[0]), file_bytes(l, e));
        src.release(l);
      }
    }
    const ExpertStats st = src.expert_stats();
    EXPECT_EQ(st.misses, 4u) << per_layer << " slots a layer";
    EXPECT_EQ(st.hits, 4u) << per_layer << " slots a layer";
    EXPECT_EQ(st.predicted_used, 0u);
    if (per_layer == 1) EXPECT_EQ(st.predicted, 0u) << "every slot held a layer's latest expert";
    else EXPECT_GE(st.predicted, 3u) << "free slots take the guesses";
  }
}

TEST_F(QpackSource, ExpertsInUseAreNotEvicted) {
  QpackExpertsOptions o;
  o.cache_bytes = 2 * stride();
  QpackExperts src(*qc_, std::move(o));
  ASSERT_EQ(src.max_batch(), 2);
  ExpertWeights w[2];
  const int32_t a[2] = {7, 8};
  src.acquire(1, a, w);
  const std::string before = blob_of(w[0]);
  // Prefetching other experts while 7 and 8 are in use must not take their slots.
  const int32_t others[3] = {9, 10, 11};
  src.prefetch(1, others);
  src.predict(2, others);
  EXPECT_EQ(blob_of(w[0]), before);
  EXPECT_EQ(blob_of(w[1]), file_bytes(1, 8));
  src.release(1);
  ExpertWeights x[1];
  const int32_t n[1] = {9};
  src.acquire(1, n, x);  // now there is room
  EXPECT_EQ(blob_of(x[0]), file_bytes(1, 9));
  src.release(1);
}

TEST_F(QpackSource, ReadErrorNamesTheExpertAndLeavesTheSourceUsable) {
  for (bool prefetch_first : {false, true}) {
    QpackExpertsOptions o;
    o.cache_bytes = 3 * stride();
    o.reader = std::make_unique<FailingReader>(*qc_, 1, 5);
    QpackExperts src(*qc_, std::move(o));
    ExpertWeights w[2];
    const int32_t bad[2] = {4, 5};
    if (prefetch_first) src.prefetch(1, bad);
    const std::string e = testing::error_of([&] { src.acquire(1, bad, w); });
    EXPECT_NE(e.find("layer 01 expert 5"), std::string::npos) << e;
    EXPECT_FALSE(src.ready(1, 5));
    // Nothing stays pinned or half-loaded: three other experts fit in the three slots.
    const int32_t fine[2] = {4, 6};
    ASSERT_NO_THROW(src.acquire(1, fine, w));
    EXPECT_EQ(blob_of(w[0]), file_bytes(1, 4));
    EXPECT_EQ(blob_of(w[1]), file_bytes(1, 6));
    src.release(1);
    const int32_t more[2] = {1, 2};
    ASSERT_NO_THROW(src.acquire(0, more, w));
    src.release(0);
    // And it fails the same way again, rather than serving the garbage.
    const std::string again = testing::error_of([&] { src.acquire(1, std::span(bad + 1, 1), std::span(w, 1)); });
    EXPECT_NE(again.find("layer 01 expert 5"), std::string::npos) << again;
  }
}

TEST_F(QpackSource, ChecksumFailureFoundByAPrefetchIsReportedByAcquire) {
  const fs::path copy = *dir_ / "copy.qpack";
  fs::remove_all(copy);
  fs::copy(qc_->dir, copy, fs::copy_options::recursive);
  const QpackContainer qc = QpackContainer::open(copy.string());
  {
    std::fstream f(qc.layer_path(2), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(3 * qc.layout.expert_stride + 100));
    f.put('\x55');
  }
  QpackExperts src(qc);
  const int32_t ids[2] = {3, 4};
  src.prefetch(2, ids);
  ExpertWeights w[2];
  const std::string e = testing::error_of([&] { src.acquire(2, ids, w); });
  EXPECT_NE(e.find("layer 02 expert 3 checksum mismatch"), std::string::npos) << e;
  fs::remove_all(copy);
}

// /dev/shm (tmpfs) refuses O_DIRECT: the reader warns and reads through the page cache.
TEST_F(QpackSource, FallsBackToBufferedReadsWhereODirectIsRefused) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const fs::path copy = fs::path("/dev/shm") / ("swiftlet_shm_" + std::to_string(::getpid()) + ".qpack");
  fs::remove_all(copy);
  std::error_code ec;
  fs::copy(qc_->dir, copy, fs::copy_options::recursive, ec);
  if (ec) GTEST_SKIP() << "cannot copy to /dev/shm: " << ec.message();
  const QpackContainer qc = QpackContainer::open(copy.string());
  ::testing::internal::CaptureStderr();
  QpackExperts src(qc);
  const std::string err = ::testing::internal::GetCapturedStderr();
  if (src.reader().buffered()) {
    EXPECT_NE(err.find("O_DIRECT"), std::string::npos) << err;
  }
  ExpertWeights w[1];
  const int32_t id[1] = {6};
  src.acquire(3, id, w);
  EXPECT_EQ(blob_of(w[0]), file_bytes(3, 6));
  fs::remove_all(copy);
}

}  // namespace
}  // namespace swiftlet
