// Injected faults, end to end on the built executables: IO errors and short reads on expert
// reads during generation (through the LD_PRELOAD shim fault_shim.cpp, with --io serial: io_uring
// reads bypass libc), ENOSPC while repacking, kill -9 at random points of repacks, and a
// container modified while a process has it loaded.
#include "format/qpack.h"
#include "io/mapped_file.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "support/test_paths.h"
#include "support/local_hub.h"
#include "support/sharded_checkpoint.h"
#include "support/test_util.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <thread>

extern char** environ;

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using swiftlet::testing::bin_path;
using swiftlet::testing::CmdResult;
using swiftlet::testing::run_command;
using Scratch = swiftlet::testing::ScratchDir;
using swiftlet::testing::fixture_dir;
using swiftlet::testing::write_sharded;

// The environment prefix that loads the shim with `faults` (VAR=value ...).
std::string with_faults(const std::string& faults) {
  const char* asan = std::getenv("ASAN_OPTIONS");
  return "LD_PRELOAD=" + bin_path("libswiftlet_fault_shim.so") + " ASAN_OPTIONS=" + (asan ? std::string(asan) + ":" : "") +
         "verify_asan_link_order=0 " + faults + " ";
}

std::string repack_tiny(const std::string& out, const std::string& extra = "") {
  return bin_path("swiftlet-repack") + " --synthetic tiny --quiet --output " + out + " " + extra;
}

std::string generate_cmd(const std::string& model) {
  return bin_path("swiftlet") + " generate " + model + " --ids 5,17,42,7 --max-new 6 --greedy --print-ids --io serial";
}

class ExpertReadFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = dir_ / "tiny.qpack";
    const CmdResult r = run_command(repack_tiny(model_) + " 2>&1");
    ASSERT_EQ(r.status, 0) << r.out;
    const CmdResult clean = run_command(generate_cmd(model_) + " 2>/dev/null");
    ASSERT_EQ(clean.status, 0) << clean.out;
    clean_ids_ = clean.out;
    ASSERT_FALSE(clean_ids_.empty());
  }
  Scratch dir_;
  std::string model_, clean_ids_;
};

// EIO on one layer's expert file: a clear error naming the layer, an expert and the file; exit 1.
TEST_F(ExpertReadFaults, EioNamesLayerAndExpert) {
  const CmdResult r = run_command(with_faults("SWIFTLET_FAULT_MODE=eio SWIFTLET_FAULT_MATCH=layer_02.bin") +
                                  generate_cmd(model_) + " 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("cannot read layer 02 expert"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer_02.bin"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Input/output error"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("AddressSanitizer"), std::string::npos) << r.out;
}

// Reads that come back short are continued: the same tokens as without faults.
TEST_F(ExpertReadFaults, ShortReadsAreContinued) {
  const CmdResult r = run_command(with_faults("SWIFTLET_FAULT_MODE=short SWIFTLET_FAULT_MATCH=packed_experts/") +
                                  generate_cmd(model_) + " 2>/dev/null");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, clean_ids_);
}

// A read that ends early (the file seems truncated) is reported as such, with layer and expert.
TEST_F(ExpertReadFaults, EndOfFileIsAShortReadError) {
  const CmdResult r = run_command(with_faults("SWIFTLET_FAULT_MODE=eof SWIFTLET_FAULT_MATCH=layer_00.bin") +
                                  generate_cmd(model_) + " 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("corrupt container: layer 00 expert"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("short read"), std::string::npos) << r.out;
}

// In one process: a failed read fails that generation only; once the disk reads again, the
// next generation gives the same tokens as a fresh process.
TEST_F(ExpertReadFaults, ProcessStaysUsableAfterAFailedRead) {
  LoadOptions lo;
  lo.io = IoMode::Serial;
  // One token's experts, asked for: the default cache may hold every expert, and then nothing
  // would be read again.
  const QpackContainer qc = QpackContainer::open(model_);
  lo.cache_bytes = uint64_t(qc.config.num_experts_per_tok) * uint64_t(qc.config.num_layers) * qc.layout.expert_stride;
  auto lm = load_model(model_, lo);
  const std::vector<int32_t> prompt = {5, 17, 42, 7};
  auto greedy = [&] {
    Session s(lm->model, nullptr);
    GenerateRequest req;
    req.prompt = prompt;
    req.max_new_tokens = 6;
    req.sampling.greedy = true;
    return s.generate(req).tokens;
  };
  const std::vector<int32_t> before = greedy();
  // Break one layer file under the running process (EOF from a third on: the experts the
  // one-token cache does not hold are read again), then mend it.
  const std::string layer = model_ + "/packed_experts/layer_01.bin";
  const std::string good = read_text_file(layer);
  fs::resize_file(layer, good.size() / 3);
  std::string error;
  try {
    greedy();
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("layer 01 expert"), std::string::npos) << error;
  {
    std::FILE* f = std::fopen(layer.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(good.data(), 1, good.size(), f);
    std::fclose(f);
  }
  EXPECT_EQ(greedy(), before);
}

// ENOSPC at several points of a repack (resident file, expert files, the small files at the
// end): a clear message, exit 1, nothing at the output path, no temporary left; a rerun works.
TEST(RepackFaults, DiskFullAtAnyPointLeavesNothingAndARerunWorks) {
  Scratch dir;
  const std::string out = dir / "tiny.qpack";
  for (const char* after : {"0", "4096", "200000", "1000000"}) {
    SCOPED_TRACE(std::string("ENOSPC after ") + after + " bytes");
    const CmdResult r = run_command(with_faults(std::string("SWIFTLET_FAULT_MODE=enospc SWIFTLET_FAULT_MATCH=.qpack.tmp- "
                                                            "SWIFTLET_FAULT_AFTER=") + after) +
                                    repack_tiny(out) + " 2>&1");
    if (r.status == 0) {
      // The whole container fit in `after` bytes: then it must be complete.
      EXPECT_EQ(run_command(bin_path("swiftlet") + " verify " + out + " 2>&1").status, 0);
      fs::remove_all(out);
      continue;
    }
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("the disk filled up"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(out));
    for (const auto& e : fs::directory_iterator(dir.path())) ADD_FAILURE() << "left behind: " << e.path();
  }
  const CmdResult again = run_command(repack_tiny(out) + " 2>&1");
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_EQ(run_command(bin_path("swiftlet") + " verify " + out + " 2>&1").status, 0);
}

// Every file of a container, by relative path.
std::map<std::string, std::string> container_files(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) m[fs::relative(e.path(), dir).string()] = read_text_file(e.path().string());
  return m;
}

// Starts `cmd` in a shell (which should exec the program, so that a signal reaches it), kills it
// with SIGKILL after `seconds`: true when the kill ended it, false when it had finished.
bool killed_after(const std::string& cmd, double seconds) {
  pid_t pid;
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  if (posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) != 0) {
    ADD_FAILURE() << "cannot start " << cmd;
    return false;
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFSIGNALED(st);
}

// The seconds one run of `cmd` takes; it must succeed.
double seconds_of(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  const CmdResult r = run_command(cmd + " 2>&1");
  EXPECT_EQ(r.status, 0) << r.out;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// kill -9 at random points of repacks that replace the same output: at every moment the output
// either does not exist or is a complete container identical to an uninterrupted repack's.
TEST(RepackFaults, KillNineAtRandomPointsNeverLeavesAWrongContainer) {
  Scratch dir;
  const std::string ref = dir / "ref.qpack", out = dir / "out.qpack";
  const double full_s = seconds_of(repack_tiny(ref));
  ASSERT_TRUE(fs::exists(ref));
  const auto want = container_files(ref);
  std::mt19937 rng(12345);
  // Kill points are drawn from [0, window); a repack that finishes before its kill shrinks the
  // window, so that a machine whose speed changes during the test (shared cores) still gets its
  // kills in the middle of repacks.
  double window = full_s * 1.2;
  int killed = 0, finished = 0, complete = 0, absent = 0;
  for (int i = 0; i < 120 && killed < 20; ++i) {
    // Every other run writes a new container, the others replace a complete one.
    if (i % 2 == 0) fs::remove_all(out);
    if (killed_after("exec " + repack_tiny(out, "--force") + " 2>/dev/null",
                     std::uniform_real_distribution<double>(0.0, window)(rng))) {
      ++killed;
    } else {
      ++finished;
      window *= 0.8;
    }
    if (!fs::exists(out)) {
      ++absent;
      continue;
    }
    ++complete;
    ASSERT_EQ(container_files(out), want) << "after kill " << i << ": the container differs from an uninterrupted repack";
  }
  std::printf("kill -9 during repack: %d killed, %d finished first; afterwards %d complete containers, %d none\n",
              killed, finished, complete, absent);
  EXPECT_EQ(killed, 20);
  // A rerun cleans up what the killed runs left and finishes.
  ASSERT_EQ(run_command(repack_tiny(out, "--force") + " 2>&1").status, 0);
  EXPECT_EQ(container_files(out), want);
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_TRUE(e.path() == ref || e.path() == out) << "left behind: " << e.path();
}

// ---- Downloads (swiftlet-repack --from-hf of a published container) --------------------------

using swiftlet::testing::LocalHub;
// The hub sends files 16 KiB every 5 ms, so that a kill lands in the middle of a transfer.
constexpr std::chrono::milliseconds kHubPace{5};

std::string fetch_cmd(const LocalHub& hub, const std::string& out, const std::string& faults = "") {
  return "export HF_ENDPOINT=" + hub.endpoint() + "; exec env " + faults + bin_path("swiftlet-repack") + " --from-hf acme/tiny --quiet --output " + out;
}

// What a download directory holds may only be finished files equal to the published ones and
// .part files that are prefixes of them.
void expect_download_consistent(const std::string& dl, const std::map<std::string, std::string>& want) {
  if (!fs::exists(dl)) return;
  for (const auto& e : fs::recursive_directory_iterator(dl)) {
    if (!e.is_regular_file()) continue;
    std::string rel = fs::relative(e.path(), dl).string();
    const bool part = rel.ends_with(".part");
    if (part) rel.resize(rel.size() - 5);
    const auto it = want.find(rel);
    ASSERT_NE(it, want.end()) << "unexpected file " << e.path();
    const std::string got = read_text_file(e.path().string());
    if (part) {
      EXPECT_EQ(it->second.compare(0, got.size(), got), 0) << e.path() << " is not a prefix of the file";
    } else {
      EXPECT_EQ(got, it->second) << e.path();
    }
  }
}

TEST(DownloadFaults, KillNineAtRandomPointsThenResumeGivesTheSameBytes) {
  Scratch dir;
  const std::string published = dir / "published.qpack", out = dir / "out.qpack";
  ASSERT_EQ(run_command(repack_tiny(published) + " 2>&1").status, 0);
  const auto want = container_files(published);
  LocalHub hub(published, kHubPace);
  const double full_s = seconds_of(fetch_cmd(hub, dir / "once.qpack"));
  EXPECT_EQ(container_files(dir / "once.qpack"), want);
  std::mt19937 rng(777);
  std::uniform_real_distribution<double> when(0.0, full_s);
  int killed = 0, with_parts = 0, complete = 0;
  for (int i = 0; i < 20; ++i) {
    killed += killed_after(fetch_cmd(hub, out) + " 2>/dev/null", when(rng));
    expect_download_consistent(out + ".download", want);
    if (fs::exists(out + ".download"))
      for (const auto& e : fs::recursive_directory_iterator(out + ".download"))
        if (e.path().string().ends_with(".part")) {
          ++with_parts;
          break;
        }
    if (fs::exists(out)) {
      // Finished (resuming what the killed runs left): the published bytes. Start over.
      ++complete;
      EXPECT_EQ(container_files(out), want) << "after kill " << i;
      fs::remove_all(out);
    }
  }
  std::printf("kill -9 during download: %d runs killed, %d left a partial file to resume, %d resumed to a "
              "complete container\n", killed, with_parts, complete);
  EXPECT_GT(with_parts, 0) << "no kill landed in the middle of a file";
  EXPECT_GT(complete, 0) << "no resume got to the end";
  // A last run completes whatever is left.
  const CmdResult r = run_command(fetch_cmd(hub, out) + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(container_files(out), want);
  EXPECT_FALSE(fs::exists(out + ".download"));
}

TEST(DownloadFaults, DiskFullIsClearAndARerunResumes) {
  Scratch dir;
  const std::string published = dir / "published.qpack", out = dir / "out.qpack";
  ASSERT_EQ(run_command(repack_tiny(published) + " 2>&1").status, 0);
  LocalHub hub(published, kHubPace);
  const CmdResult r = run_command(fetch_cmd(hub, out, with_faults("SWIFTLET_FAULT_MODE=enospc SWIFTLET_FAULT_MATCH=.download/ "
                                                                   "SWIFTLET_FAULT_AFTER=300000")) + " 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("re-run to resume"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
  expect_download_consistent(out + ".download", container_files(published));
  const CmdResult again = run_command(fetch_cmd(hub, out) + " 2>&1");
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_EQ(container_files(out), container_files(published));
}

// ---- Conversion shard by shard (swiftlet-repack --from-hf of a sharded checkpoint) ------------

class HubConversion : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fixture_dir("next_8l") + "/config.json")) GTEST_SKIP() << "fixture next_8l missing";
    // ~8 shards of ~200 KB, layers straddling shards as on the hub.
    shards_ = write_sharded(fixture_dir("next_8l"), dir_ / "ckpt", 200 << 10);
    for (const auto& s : shards_) {
      total_ += fs::file_size(dir_ / ("ckpt/" + s));
      largest_ = std::max<uint64_t>(largest_, fs::file_size(dir_ / ("ckpt/" + s)));
    }
    const CmdResult r = run_command(bin_path("swiftlet-repack") + " --quiet --from-dir " + (dir_ / "ckpt") +
                                    " --output " + (dir_ / "whole.qpack") + " 2>&1");
    ASSERT_EQ(r.status, 0) << r.out;
    want_ = without_manifest(dir_ / "whole.qpack");
  }
  static std::map<std::string, std::string> without_manifest(const std::string& dir) {
    auto m = container_files(dir);
    m.erase("manifest.json");  // it names the source
    return m;
  }
  static std::string convert_cmd(const LocalHub& hub, const std::string& out) {
    return "HF_ENDPOINT=" + hub.endpoint() + " " + bin_path("swiftlet-repack") + " --from-hf acme/next --quiet --output " + out;
  }

  Scratch dir_;
  std::vector<std::string> shards_;
  uint64_t total_ = 0, largest_ = 0;
  std::map<std::string, std::string> want_;
};

TEST_F(HubConversion, KillNineAtRandomPointsThenRerunGivesTheSameContainer) {
  LocalHub hub(dir_ / "ckpt", kHubPace);
  const std::string out = dir_ / "out.qpack";
  const double full_s = seconds_of(convert_cmd(hub, dir_ / "once.qpack"));
  EXPECT_EQ(without_manifest(dir_ / "once.qpack"), want_);
  std::mt19937 rng(4242);
  std::uniform_real_distribution<double> when(0.0, full_s);
  int killed = 0, resumable = 0, complete = 0;
  for (int i = 0; i < 16; ++i) {
    killed += killed_after("exec env " + convert_cmd(hub, out) + " 2>/dev/null", when(rng));
    if (fs::exists(out + ".partial/progress.jsonl")) {
      const std::string journal = read_text_file(out + ".partial/progress.jsonl");
      resumable += std::count(journal.begin(), journal.end(), '\n') > 1;
    }
    if (fs::exists(out)) {
      ++complete;
      EXPECT_EQ(without_manifest(out), want_) << "after kill " << i;
      fs::remove_all(out);
    }
  }
  std::printf("kill -9 during a conversion from the hub: %d runs killed, %d left converted parts to resume, %d "
              "finished\n", killed, resumable, complete);
  EXPECT_GT(resumable, 0) << "no kill landed after a converted part";
  const CmdResult r = run_command(convert_cmd(hub, out) + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(without_manifest(out), want_);
  EXPECT_FALSE(fs::exists(out + ".partial"));
  EXPECT_FALSE(fs::exists(out + ".download"));
}

// A disk of its own (a tmpfs in a private mount namespace) as small as the container and two
// shards: the conversion fits; with a shard less it is refused before any shard is downloaded.
TEST_F(HubConversion, FitsADiskOfTheContainerAndTwoShardsAndRefusesLess) {
  if (std::system("unshare -rm true >/dev/null 2>&1") != 0) GTEST_SKIP() << "no private mount namespaces (unshare -rm)";
  LocalHub hub(dir_ / "ckpt");
  fs::create_directories(dir_ / "disk");
  auto on_disk_of = [&](uint64_t bytes) {
    const std::string disk = dir_ / "disk";
    return run_command("unshare -rm sh -c 'mount -t tmpfs -o size=" + std::to_string(bytes) + " tmpfs " + disk + " && " +
                       convert_cmd(hub, disk + "/out.qpack") + "; rc=$?; ls " + disk + "/out.qpack.download > " +
                       (dir_ / "listing.txt") + " 2>/dev/null; rm -rf " + (dir_ / "got.qpack") + "; cp -r " + disk +
                       "/out.qpack " + (dir_ / "got.qpack") + " 2>/dev/null; exit $rc' 2>&1");
  };
  // What the plan asks for (the container and two shards), from its refusal on a disk of 1 MB.
  const CmdResult probe = on_disk_of(1 << 20);
  ASSERT_NE(probe.status, 0) << probe.out;
  const size_t at = probe.out.find(" bytes, plus");
  ASSERT_NE(at, std::string::npos) << probe.out;
  const uint64_t need = std::stoull(probe.out.substr(probe.out.rfind('(', at) + 1));
  // The margin is a 32nd of a small disk; 128 KiB for the download folder's small files and the
  // shards' headers.
  const uint64_t quota = (need + (128 << 10)) * 32 / 31;
  uint64_t container = 0;
  for (const auto& [rel, bytes] : container_files(dir_ / "whole.qpack")) container += (bytes.size() + 4095) / 4096 * 4096;
  std::printf("disk of %llu bytes: the container %llu, the largest shard %llu, all %zu shards %llu\n",
              (unsigned long long)quota, (unsigned long long)container, (unsigned long long)largest_, shards_.size(),
              (unsigned long long)total_);
  ASSERT_LT(quota + largest_, container + total_) << "the disk would hold every shard: the test proves nothing";

  const CmdResult less = on_disk_of(quota - largest_);
  EXPECT_NE(less.status, 0) << less.out;
  EXPECT_NE(less.out.find("not enough disk space"), std::string::npos) << less.out;
  const std::string listing = read_text_file(dir_ / "listing.txt");
  for (const auto& s : shards_) EXPECT_EQ(listing.find(s), std::string::npos) << s << " was downloaded: " << listing;

  const CmdResult fits = on_disk_of(quota);
  ASSERT_EQ(fits.status, 0) << fits.out;
  EXPECT_EQ(without_manifest(dir_ / "got.qpack"), want_);
}

// ---- A container changed on disk while a process has it loaded -------------------------------

class ModifiedWhileLoaded : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = dir_ / "tiny.qpack";
    const CmdResult r = run_command(repack_tiny(model_) + " 2>&1");
    ASSERT_EQ(r.status, 0) << r.out;
  }
  std::unique_ptr<LoadedModel> load() {
    LoadOptions lo;
    lo.io = IoMode::Serial;
    lo.resident = Residency::Map;
    return load_model(model_, lo);
  }
  static std::vector<int32_t> greedy(const LoadedModel& lm, std::vector<int32_t> prompt) {
    Session s(lm.model, nullptr);
    GenerateRequest req;
    req.prompt = std::move(prompt);
    req.max_new_tokens = 6;
    req.sampling.greedy = true;
    return s.generate(req).tokens;
  }
  Scratch dir_;
  std::string model_;
};

// swiftlet-repack --force swaps a new container in atomically: a running process keeps reading
// the one it opened (its files stay alive until it closes them) and computes what it did before.
TEST_F(ModifiedWhileLoaded, ReplacedByARepackTheRunningProcessKeepsItsOwn) {
  auto lm = load();
  const std::vector<int32_t> before = greedy(*lm, {5, 17, 42, 7});
  const CmdResult r = run_command(repack_tiny(model_, "--force --seed 2") + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(greedy(*lm, {5, 17, 42, 7}), before);
  EXPECT_EQ(greedy(*lm, {9, 8, 7, 6, 5, 4}), greedy(*lm, {9, 8, 7, 6, 5, 4}));
  auto fresh = load();
  EXPECT_NE(greedy(*fresh, {5, 17, 42, 7}), before) << "the new container (another seed) should differ";
}

// Expert bytes changed in place: the next read of a changed expert fails its checksum with an
// error naming layer and expert; the process goes on once the file is mended.
TEST_F(ModifiedWhileLoaded, ExpertChangedInPlaceFailsItsChecksum) {
  auto lm = load();
  const std::vector<int32_t> before = greedy(*lm, {5, 17, 42, 7});
  const std::string layer = model_ + "/packed_experts/layer_02.bin";
  const std::string good = read_text_file(layer);
  std::string bad = good;
  const size_t stride = good.size() / 16;  // the tiny preset has 16 experts
  for (size_t e = 0; e < 16; ++e) bad[e * stride + 100] ^= 0x5a;
  auto write_all = [&](const std::string& bytes) {
    const int fd = ::open(layer.c_str(), O_WRONLY);  // in place: same inode
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
    ::fsync(fd);
    ::close(fd);
  };
  write_all(bad);
  std::string error;
  try {
    greedy(*lm, {100, 200, 300, 400, 500, 600, 700});
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("layer 02 expert"), std::string::npos) << error;
  EXPECT_NE(error.find("checksum"), std::string::npos) << error;
  write_all(good);
  EXPECT_EQ(greedy(*lm, {5, 17, 42, 7}), before);
}

// The resident file truncated under a mapping: reading a lost page raises SIGBUS, and the
// process says which file before it dies (instead of a bare "Bus error").
TEST_F(ModifiedWhileLoaded, TruncatedResidentFileIsNamedBeforeTheProcessDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string resident = model_ + "/model.safetensors";
  EXPECT_DEATH(
      {
        auto lm = load();
        fs::resize_file(resident, 0);
        const QMatrix& e = lm->model.weights.embed_tokens;
        volatile uint8_t b = static_cast<const uint8_t*>(e.data)[e.rows * e.row_bytes() - 1];
        (void)b;
      },
      "model.safetensors' was truncated or rewritten while this process had it mapped");
}

}  // namespace
}  // namespace swiftlet
