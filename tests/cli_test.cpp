// End-to-end: the built `swiftlet` executable on the committed fixtures.
#include "io/mapped_file.h"
#include "kernels/cpu/kernels.h"
#include "support/test_paths.h"
#include "support/test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sys/wait.h>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using swiftlet::testing::bin_path;
using swiftlet::testing::fixture_dir;

using swiftlet::testing::CmdResult;
using swiftlet::testing::join_ids;
using swiftlet::testing::read_f32;

// Runs `swiftlet ARGS`; stderr is captured too unless `stdout_only`.
CmdResult run(const std::string& args, bool stdout_only = false) {
  return swiftlet::testing::run_binary("swiftlet", args, stdout_only);
}

class Cli : public ::testing::TestWithParam<std::string> {};

TEST_P(Cli, LogitsAndGreedyGenerateMatchTransformers) {
  const std::string dir = fixture_dir(GetParam());
  auto ref = nlohmann::json::parse(read_text_file(dir + "/reference.json"));
  auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  const std::string out = (fs::temp_directory_path() / ("swiftlet_cli_" + std::to_string(::getpid()) + ".f32")).string();
  // Quantised fixtures use the exact fast backend: the default one rounds activations to int8,
  // which a chaotic random-weight model amplifies (checked layer by layer elsewhere).
  const bool quantised = GetParam().find("mlx") != std::string::npos;
  const std::string fast = quantised ? " --backend cpu-f32" : "";
  for (const std::string& mode : {fast, " --decode" + fast, std::string(" --backend reference")}) {
    CmdResult r = run("logits " + dir + " --tokens " + join_ids(tokens, ",") + " --out " + out + mode);
    ASSERT_EQ(r.status, 0) << r.out;
    auto got = read_f32(out);
    auto want = read_f32(dir + "/prefill_logits.f32");
    ASSERT_EQ(got.size(), want.size()) << mode;
    float m = 0;
    for (size_t i = 0; i < got.size(); ++i) m = std::max(m, std::fabs(got[i] - want[i]));
    EXPECT_LT(m, 1e-3f) << GetParam() << mode;
  }
  fs::remove(out);
  auto want = ref["greedy_new"].get<std::vector<int32_t>>();
  const std::string gen = "generate " + dir + " --ids " +
                          join_ids(ref["greedy_prompt"].get<std::vector<int32_t>>(), ",") + " --max-new " +
                          std::to_string(want.size()) + " --greedy --print-ids" + fast;
  CmdResult g = run(gen, true);
  ASSERT_EQ(g.status, 0) << g.out;
  EXPECT_EQ(g.out, join_ids(want, " ") + "\n");
  // --isa: every instruction set this CPU runs gives the same greedy tokens; one it lacks is
  // refused with what it does run.
  const std::vector<Isa> have = available_isas();
  for (Isa isa : {Isa::Avx2, Isa::Avx512Vnni, Isa::Neon, Isa::NeonDotprod, Isa::NeonI8mm}) {
    const bool runs = std::find(have.begin(), have.end(), isa) != have.end();
    CmdResult gi = run(gen + " --isa " + isa_name(isa), /*stdout_only=*/runs);
    if (runs) {
      ASSERT_EQ(gi.status, 0) << isa_name(isa) << ": " << gi.out;
      EXPECT_EQ(gi.out, join_ids(want, " ") + "\n") << isa_name(isa);
    } else {
      EXPECT_NE(gi.status, 0) << isa_name(isa);
      EXPECT_NE(gi.out.find("this CPU does not run it"), std::string::npos) << gi.out;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Cli, ::testing::Values("next_8l", "q35_vl", "next_mlx4"));

TEST(CliErrors, BadInputsExitNonZeroWithAMessage) {
  CmdResult r = run("logits /nonexistent/model --tokens 1,2 --out /tmp/x.f32");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  r = run("logits " + fixture_dir("next_8l") + " --tokens 1,x --out /tmp/x.f32");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("'x' is not a non-negative token id"), std::string::npos) << r.out;
  r = run("logits " + fixture_dir("next_8l") + " --tokens 1,99999 --out /tmp/x.f32");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("outside the vocabulary"), std::string::npos) << r.out;
  r = run("logits " + fixture_dir("next_8l") + " --tokens 1 --out /tmp/x.f32 --backend tpu");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("unknown backend"), std::string::npos) << r.out;
  r = run("generate " + fixture_dir("next_8l") + " --ids 1,2 --max-new 2 --isa sse9");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("unknown instruction set 'sse9' (use 'avx2' or 'avx512-vnni' on x86-64"), std::string::npos)
      << r.out;
}

// swiftlet-server takes the same model flags as `swiftlet` (one registration): bad values are
// refused before it listens, with the message the CLI gives.
TEST(CliErrors, ServerRefusesBadModelFlagsBeforeListening) {
  const std::string model = " --model " + fixture_dir("next_8l") + " --port 0";
  struct Case {
    std::string args, message;
  };
  for (const Case& c : {Case{" --gpu-cache-gb 2", "--gpu-cache-gb needs --gpu"}, Case{" --io fast", "--io"},
                        Case{" --resident maybe", "unknown residency"}, Case{" --cache-gb lots", "--cache-gb"},
                        Case{" --backend tpu", "unknown backend"}, Case{" --isa sse9", "unknown instruction set"}}) {
    // `timeout`: a server that accepted the flags would listen until killed.
    const CmdResult r =
        swiftlet::testing::run_command("timeout 60 " + bin_path("swiftlet-server") + model + c.args + " 2>&1");
    EXPECT_EQ(r.status, 1) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << ": " << r.out;
    EXPECT_EQ(r.out.find("listening"), std::string::npos) << c.args << ": " << r.out;
  }
}

}  // namespace
}  // namespace swiftlet
