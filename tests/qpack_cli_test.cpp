// End-to-end: swiftlet-repack, then `swiftlet info / verify / logits / generate` on the .qpack.
#include "io/mapped_file.h"
#include "support/test_paths.h"
#include "support/test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using swiftlet::testing::bin_path;
using swiftlet::testing::fixture_dir;

using CmdOut = swiftlet::testing::CmdResult;

CmdOut sh(const std::string& exe, const std::string& args) { return swiftlet::testing::run_binary(exe, args); }

class QpackCli : public ::testing::Test {
 protected:
  std::string path(const std::string& rel) const { return dir_ / rel; }
  swiftlet::testing::ScratchDir dir_;
};

TEST_F(QpackCli, RepackInfoVerifyAndRunTheTinyPreset) {
  const std::string q = path("tiny.qpack");
  CmdOut r = sh("swiftlet-repack", "--synthetic tiny --output " + q);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("layer 04/4"), std::string::npos) << r.out;

  r = sh("swiftlet", "info " + q + " --cache-experts 32");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* want : {"Qwen3-Next (qwen3_next)", "4: 3 Gated DeltaNet + 1 full attention",
                           "16 per layer, top-4", "4-bit g64", "per expert     13824 bytes", "16384 bytes per read",
                           "cache of 32 experts", "peak RAM", "synthetic:tiny"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;

  r = sh("swiftlet", "verify " + q);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("OK, 3 files and 64 experts"), std::string::npos) << r.out;

  r = sh("swiftlet", "logits " + q + " --tokens 1,2,3,500 --out " + path("l.f32"));
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string b = read_text_file(path("l.f32"));
  ASSERT_EQ(b.size(), 4u * 1024 * 4);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  for (float x : v) ASSERT_TRUE(std::isfinite(x));

  r = sh("swiftlet", "generate " + q + " --ids 1,2,3 --max-new 5 --greedy --print-ids");
  ASSERT_EQ(r.status, 0) << r.out;

  // One flipped byte in layer 01, expert 9: verify names it and fails.
  {
    std::fstream f(q + "/packed_experts/layer_01.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(9 * 16384 + 100);
    f.put('\x55');
  }
  r = sh("swiftlet", "verify " + q);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("layer 01 expert 9: checksum mismatch"), std::string::npos) << r.out;
}

// The cache flags: every setting gives the same tokens; bad values are refused with a message
// and a non-zero exit; the bench command runs every configuration and prints its table.
TEST_F(QpackCli, CacheFlagsAndBench) {
  const std::string q = path("tiny.qpack");
  ASSERT_EQ(sh("swiftlet-repack", "--synthetic tiny --output " + q).status, 0);
  const std::string gen = "generate " + q + " --ids 1,2,3,4,5,6 --max-new 6 --greedy --print-ids";
  // The tokens (stdout); stderr's line on the cache's size differs between the settings.
  CmdOut base = swiftlet::testing::run_binary("swiftlet", gen + " --cache-gb all -q", /*stdout_only=*/true);
  ASSERT_EQ(base.status, 0) << base.out;
  for (const char* flags : {"--cache-mb 0.0164", "--cache-mb 0.05 --io serial", "--ram-budget 4G --predict-next 2",
                            "--resident read", "--resident map --io uring --predict-next 0",
                            "--cache-mb 0.0164 --on-miss exact", "--cache-mb 0.0164 --on-miss skip:0"}) {
    CmdOut r = swiftlet::testing::run_binary("swiftlet", gen + " -q " + flags, /*stdout_only=*/true);
    ASSERT_EQ(r.status, 0) << flags << "\n" << r.out;
    EXPECT_EQ(r.out, base.out) << flags;
  }
  CmdOut r = sh("swiftlet", gen + " --cache-mb 0.05");
  EXPECT_NE(r.out.find("evictions"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cache 0.05 of 0.05 MB"), std::string::npos) << r.out;
  struct Bad {
    const char* flags;
    const char* message;
  };
  for (const Bad& b : {Bad{"--ram-budget 10M", "cannot be met"}, Bad{"--ram-budget lots", "cannot read 'lots'"},
                       Bad{"--cache-gb 1 --ram-budget 4G", "only one of"}, Bad{"--io async", "unknown --io mode"},
                       Bad{"--cache-mb 0", "cannot be empty"}, Bad{"--resident swap", "unknown residency"},
                       Bad{"--on-miss skip:abc", "'exact' (the default), 'skip:W'"},
                       Bad{"--on-miss skip:1.5", "W must be a number in [0, 1)"}, Bad{"--on-miss bogus", "skip:W"},
                       Bad{"--on-miss low-bit:2", "W must be a number in [0, 1]"},
                       Bad{"--on-miss low-bit", "has no low-bit copies; add them with swiftlet-repack --add-miss-copy"}}) {
    CmdOut e = sh("swiftlet", gen + " " + b.flags);
    EXPECT_EQ(e.status, 1) << b.flags << "\n" << e.out;
    EXPECT_NE(e.out.find(b.message), std::string::npos) << b.flags << "\n" << e.out;
  }
  r = sh("swiftlet", "bench " + q + " --cache default,0.05M,all --io-modes uring,serial --predict off,on "
                     "--prompt-tokens 5 --decode 4 --disk-seconds 0.2 --memory-mb 8");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* want : {"disk bound", "peakRSS", "def ", "0.05M", "all", "serial", "worst case",
                           "every exact configuration generated the same 4 tokens: yes"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  // --on-miss: a list to compare, every row saying which it is; the exact row gives the same
  // tokens as above.
  r = sh("swiftlet", "bench " + q + " --cache 0.02M --io-modes uring --predict off --on-miss exact,skip:0.2 "
                     "--prompt-tokens 5 --decode 4 --disk-seconds 0.2 --memory-mb 8");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* want : {"  exact", "lossy (skip:0.2)", "lossy configurations against the exact tokens: 0.02M skip:0.2"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  r = sh("swiftlet", "bench " + q + " --on-miss exact,skip:2 --disk-seconds 0.2 --memory-mb 8");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("W must be a number in [0, 1)"), std::string::npos) << r.out;
  r = sh("swiftlet", "bench " + q + " --memory-mb 0");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("--memory-mb"), std::string::npos) << r.out;
  r = sh("swiftlet", gen + " --cache-mb 0.0164 --on-miss skip:0.3");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("experts, lossy (skip:0.3): "), std::string::npos) << r.out;
  // --gpu reaches each configuration's process: it runs on the GPU (its own table) or says why not.
  r = sh("swiftlet", "bench " + q + " --gpu --gpu-cache-gb 1 --cache default --io-modes uring --predict off "
                     "--prompt-tokens 5 --decode 4 --disk-seconds 0.2 --memory-mb 8");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(r.out.find("GPU runs") != std::string::npos || r.out.find("falling back to the CPU") != std::string::npos)
      << r.out;
}

TEST_F(QpackCli, MlxFixtureRepackedGivesTransformersLogits) {
  const std::string fx = fixture_dir("next_mlx4");
  if (!fs::exists(fx + "/reference.json")) GTEST_SKIP() << "fixture missing";
  const std::string q = path("m.qpack");
  CmdOut r = sh("swiftlet-repack", "-q --from-dir " + fx + " -o " + q);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto ref = nlohmann::json::parse(read_text_file(fx + "/reference.json"));
  std::string toks;
  for (int t : ref["tokens"]) toks += (toks.empty() ? "" : ",") + std::to_string(t);
  r = sh("swiftlet", "logits " + q + " --backend reference --tokens " + toks + " --out " + path("l.f32"));
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string got = read_text_file(path("l.f32")), want = read_text_file(fx + "/prefill_logits.f32");
  ASSERT_EQ(got.size(), want.size());
  float m = 0;
  for (size_t i = 0; i < got.size() / 4; ++i) {
    float a, b;
    std::memcpy(&a, got.data() + 4 * i, 4);
    std::memcpy(&b, want.data() + 4 * i, 4);
    m = std::max(m, std::fabs(a - b));
  }
  EXPECT_LT(m, 1e-3f);
}

TEST_F(QpackCli, CtrlCLeavesNothingBehind) {
  const std::string out = path("big.qpack");
  const std::string cmd = "sh -c '" + bin_path("swiftlet-repack") + " --synthetic small -o " + out +
                          " & pid=$!; sleep 0.3; kill -INT $pid; wait $pid; echo rc=$?' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string text;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
  pclose(p);
  if (text.find("rc=0") != std::string::npos) GTEST_SKIP() << "the repack finished before the signal";
  EXPECT_NE(text.find("interrupted"), std::string::npos) << text;
  EXPECT_NE(text.find("rc=1"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(dir_.path())) ADD_FAILURE() << "left behind: " << e.path();
}

TEST_F(QpackCli, RepackRefusesBadRequests) {
  CmdOut r = sh("swiftlet-repack", "--synthetic nope -o " + path("x.qpack"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("unknown synthetic preset 'nope'"), std::string::npos) << r.out;
  r = sh("swiftlet-repack", "--synthetic tiny --bits 3 -o " + path("x.qpack"));
  EXPECT_NE(r.status, 0);
  r = sh("swiftlet-repack", "--synthetic tiny --from-dir /nonexistent -o " + path("x.qpack"));
  EXPECT_NE(r.status, 0);
  r = sh("swiftlet-repack", "--from-hf 'not a repo' -o " + path("x.qpack"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_FALSE(fs::exists(path("x.qpack")));
  r = sh("swiftlet", "info " + path("missing.qpack"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  // Low-bit copies: the bits are required and only 2 or 3; a missing container or one whose
  // experts are not quantised is refused by name.
  r = sh("swiftlet-repack", "--add-miss-copy " + path("missing.qpack"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--add-miss-copy needs --miss-copy-bits 2 or 3"), std::string::npos) << r.out;
  r = sh("swiftlet-repack", "--add-miss-copy " + path("missing.qpack") + " --miss-copy-bits 4");
  EXPECT_NE(r.status, 0);
  r = sh("swiftlet-repack", "--add-miss-copy " + path("missing.qpack") + " --miss-copy-bits 2");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  ASSERT_EQ(sh("swiftlet-repack", "--synthetic tiny --bits 16 -q -o " + path("f16.qpack")).status, 0);
  r = sh("swiftlet-repack", "--add-miss-copy " + path("f16.qpack") + " --miss-copy-bits 2");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("low-bit copies need quantised experts"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(path("f16.qpack/miss_copies")));
}

}  // namespace
}  // namespace swiftlet
