// The prefix state cache (runtime/state_cache.h) and saved sessions (Session::save / load) on
// tiny synthetic models of both families: a prompt that starts from a cached prefix gives the
// same logits and greedy tokens, bit for bit, as one prefilled from scratch; a second
// conversation sharing a prefix reuses it (in memory, and from the directory after a restart);
// damaged, truncated, foreign-version and foreign-model files are ignored and counted; the
// disk budget holds; two caches writing one directory leave only whole, valid files. On the GPU
// (skipped without one): states copied out of VRAM and back give a GPU run's logits, and the
// files are the same whichever backend wrote them.
#include "runtime/state_cache.h"

#include "convert/synthetic.h"
#include "experts/expert_slots.h"
#include "model/gpu_forward.h"
#include "runtime/batch.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "support/test_util.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

// One container per family for the whole process (~1.5 MB each).
const LoadedModel& tiny(const std::string& preset, uint64_t seed = 1) {
  static std::map<std::string, std::unique_ptr<LoadedModel>> models;
  const std::string name = preset + "_" + std::to_string(seed);
  auto& m = models[name];
  if (!m) {
    const fs::path dir = fs::temp_directory_path() / ("swiftlet_state_cache_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    RepackOptions o;
    o.output = (dir / (name + ".qpack")).string();
    o.force = true;
    o.seed = seed;
    repack_synthetic(preset, o);
    m = load_model(o.output);
    static bool registered = [] {
      std::atexit([] {
        std::error_code ec;
        fs::remove_all(fs::temp_directory_path() / ("swiftlet_state_cache_" + std::to_string(::getpid())), ec);
      });
      return true;
    }();
    (void)registered;
  }
  return *m;
}

std::vector<int32_t> random_tokens(const Model& m, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(std::min<int64_t>(m.config.vocab_size, 30000)) - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

StateCacheOptions small_blocks() {
  StateCacheOptions o;
  o.block = 32;
  o.interval = 128;
  return o;
}

GenerateRequest greedy(std::vector<int32_t> prompt, int n = 6) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.sampling.greedy = true;
  r.max_new_tokens = n;
  return r;
}

SessionOptions with(std::shared_ptr<StateCache> cache) {
  SessionOptions so;
  so.state_cache = std::move(cache);
  return so;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// The oracle: the prompt from scratch on a session without a cache.
struct Fresh {
  std::vector<float> logits;
  std::vector<int32_t> tokens;
};
Fresh fresh_run(const Model& m, const std::vector<int32_t>& prompt) {
  Session s(m, nullptr);
  Fresh f;
  EXPECT_EQ(s.prepare(prompt), 0);
  f.logits = s.last_logits();
  f.tokens = s.generate(greedy(prompt)).tokens;
  return f;
}

class StateCacheFamily : public ::testing::TestWithParam<std::string> {
 protected:
  const Model& model() { return tiny(GetParam()).model; }
};

TEST_P(StateCacheFamily, RestoredPrefixEqualsAFreshRunBitForBit) {
  const Model& m = model();
  auto cache = std::make_shared<StateCache>(m, small_blocks());
  const std::vector<int32_t> shared = random_tokens(m, 300, 1);
  const std::vector<int32_t> a = concat(shared, random_tokens(m, 25, 2));
  const std::vector<int32_t> b = concat(shared, random_tokens(m, 17, 3));

  Session first(m, nullptr, with(cache));
  EXPECT_EQ(first.generate(greedy(a)).stats.reused_tokens, 0);
  // a's checkpoints: 128, 256 (the interval) and 325 (its end).
  EXPECT_EQ(cache->stats().entries_ram, 3u);

  // Another conversation sharing the first 300 tokens starts from the state at 256.
  Session second(m, nullptr, with(cache));
  EXPECT_EQ(second.prepare(b), 256);
  const Fresh want = fresh_run(m, b);
  EXPECT_TRUE(same_bits(second.last_logits(), want.logits));
  // The very same prompts again: their end states come with their logits, nothing is prefilled.
  Session third(m, nullptr, with(cache));
  const GenerateResult r = third.generate(greedy(b));
  EXPECT_EQ(r.stats.reused_tokens, int64_t(b.size()));
  EXPECT_EQ(r.tokens, want.tokens);
  EXPECT_EQ(cache->stats().tokens_saved, 256u + b.size());
  Session again(m, nullptr, with(cache));
  const GenerateResult ra = again.generate(greedy(a));
  EXPECT_EQ(ra.stats.reused_tokens, int64_t(a.size()));
  EXPECT_EQ(ra.tokens, fresh_run(m, a).tokens);
  EXPECT_EQ(cache->stats().hits_ram, 3u);
}

TEST_P(StateCacheFamily, TurnBoundaryIsACheckpointForTheNextConversation) {
  const Model& m = model();
  auto cache = std::make_shared<StateCache>(m, small_blocks());
  const std::vector<int32_t> preamble = random_tokens(m, 200, 4);  // a system prompt and tools
  const std::vector<int32_t> a = concat(preamble, random_tokens(m, 30, 5));
  const std::vector<int32_t> b = concat(preamble, random_tokens(m, 40, 6));
  Batch batch(m);
  Session s1(m, nullptr, with(cache)), s2(m, nullptr, with(cache));
  batch.add(s1, greedy(a), {}, nullptr, preamble.size());
  while (!batch.empty()) batch.step();
  std::vector<Batch::Finished> done;
  batch.add(s2, greedy(b), {}, nullptr, preamble.size());
  while (!batch.empty())
    for (auto& f : batch.step()) done.push_back(std::move(f));
  ASSERT_EQ(done.size(), 1u);
  ASSERT_FALSE(done[0].error);
  EXPECT_EQ(done[0].result.stats.reused_tokens, int64_t(preamble.size()));
  EXPECT_EQ(done[0].result.tokens, fresh_run(m, b).tokens);
}

TEST_P(StateCacheFamily, SavedSessionResumesExactly) {
  const Model& m = model();
  ScratchDir dir;
  const std::vector<int32_t> prompt = random_tokens(m, 150, 7);
  Session a(m, nullptr);
  const GenerateResult first = a.generate(greedy(prompt, 4));
  a.save(dir / "chat.swst", "note bytes");

  Session b(m, nullptr);
  EXPECT_EQ(b.load(dir / "chat.swst"), "note bytes");
  EXPECT_EQ(b.state().tokens, a.state().tokens);
  // The next turn continues both the same way, each prefilling only its own tokens.
  std::vector<int32_t> next = concat(a.state().tokens, random_tokens(m, 12, 8));
  const GenerateResult ra = a.generate(greedy(next));
  const GenerateResult rb = b.generate(greedy(next));
  EXPECT_EQ(rb.stats.reused_tokens, int64_t(first.stats.prompt_tokens + first.stats.generated_tokens - 1));
  EXPECT_EQ(ra.stats.reused_tokens, rb.stats.reused_tokens);
  EXPECT_EQ(rb.tokens, ra.tokens);
  EXPECT_TRUE(same_bits(a.last_logits(), b.last_logits()));
}

// ------------------------------------------------------------------------------ on the GPU

std::shared_ptr<GpuModel> gpu_of(const Model& m) {
  GpuOptions o;
  o.make_slots = make_expert_slots;
  std::string why;
  auto g = make_gpu_model(m, o, &why);
  EXPECT_TRUE(g) << why;
  return g;
}

SessionOptions on_gpu(std::shared_ptr<GpuModel> g, std::shared_ptr<StateCache> cache = nullptr) {
  SessionOptions so = with(std::move(cache));
  so.gpu = std::move(g);
  return so;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float diff = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
  return diff;
}

// The GPU's logits against another run's: its rounding differs from the CPU's and between chunk
// splits of a prompt (the GPU tests' 1e-3 between GPU runs), and the greedy pick is the same.
void expect_close(const std::vector<float>& want, const std::vector<float>& got, const std::string& what,
                  float tolerance = 1e-3f) {
  ASSERT_EQ(want.size(), got.size()) << what;
  EXPECT_LE(max_diff(want, got), tolerance) << what;
  EXPECT_EQ(std::max_element(want.begin(), want.end()) - want.begin(),
            std::max_element(got.begin(), got.end()) - got.begin()) << what;
}

TEST_P(StateCacheFamily, GpuRestoredPrefixMatchesAFreshGpuRun) {
  if (!gpu_usable(nullptr)) GTEST_SKIP() << "no usable CUDA GPU";
  const Model& m = model();
  auto g = gpu_of(m);
  ASSERT_TRUE(g);
  auto cache = std::make_shared<StateCache>(m, small_blocks());
  const std::vector<int32_t> shared = random_tokens(m, 300, 1);
  const std::vector<int32_t> a = concat(shared, random_tokens(m, 25, 2));
  const std::vector<int32_t> b = concat(shared, random_tokens(m, 17, 3));
  Session first(m, nullptr, on_gpu(g, cache));
  EXPECT_EQ(first.generate(greedy(a)).stats.reused_tokens, 0);
  EXPECT_EQ(cache->stats().entries_ram, 3u);  // 128, 256 and 325, copied out of VRAM

  Session fresh(m, nullptr, on_gpu(g));
  ASSERT_EQ(fresh.prepare(b), 0);
  const std::vector<float> want = fresh.last_logits();
  const std::vector<int32_t> want_tokens = fresh.generate(greedy(b)).tokens;

  Session second(m, nullptr, on_gpu(g, cache));
  EXPECT_EQ(second.prepare(b), 256);
  expect_close(want, second.last_logits(), "b from the state at 256");
  EXPECT_EQ(second.generate(greedy(b)).tokens, want_tokens);
  Session third(m, nullptr, on_gpu(g, cache));
  const GenerateResult r = third.generate(greedy(b));
  EXPECT_EQ(r.stats.reused_tokens, int64_t(b.size()));
  EXPECT_EQ(r.tokens, want_tokens);
}

// One cache directory outlives a server, whichever backend the next one runs: states the CPU
// saved continue on the GPU as the CPU would, and the GPU's continue on the CPU.
TEST_P(StateCacheFamily, StatesMoveBetweenTheCpuAndTheGpu) {
  if (!gpu_usable(nullptr)) GTEST_SKIP() << "no usable CUDA GPU";
  const Model& m = model();
  auto g = gpu_of(m);
  ASSERT_TRUE(g);
  const std::vector<int32_t> shared = random_tokens(m, 200, 4);
  const std::vector<int32_t> b = concat(shared, random_tokens(m, 20, 5));
  // The CPU side runs the fp32 kernels: the default CPU backend rounds activations to int8 against
  // quantised weights, a loss of its own that the GPU does not share. What is left between the two
  // backends is rounding, carried across with the state: the bound is the distance between fresh CPU
  // and GPU runs of the same prompt (twice it, plus the GPU tests' 1e-3), itself small.
  SessionOptions cpu_only;
  cpu_only.backend = Backend::CpuF32;
  auto on_cpu = [&](std::shared_ptr<StateCache> cache) {
    SessionOptions so = cpu_only;
    so.state_cache = std::move(cache);
    return so;
  };
  Session cpu_fresh(m, nullptr, cpu_only), gpu_fresh(m, nullptr, on_gpu(g));
  ASSERT_EQ(cpu_fresh.prepare(b), 0);
  ASSERT_EQ(gpu_fresh.prepare(b), 0);
  const std::vector<float> fresh = cpu_fresh.last_logits();
  const float backends = max_diff(fresh, gpu_fresh.last_logits());
  float scale = 0;
  for (float v : fresh) scale = std::max(scale, std::fabs(v));
  std::printf("fresh CPU (fp32) against fresh GPU logits: %.6f (largest logit %.3f)\n", backends, scale);
  ASSERT_LT(backends, 0.01f * scale) << "the GPU's logits are too far from the CPU's to compare states";
  const float tolerance = 1e-3f + 2 * backends;
  for (const bool cpu_first : {true, false}) {
    const std::string what = cpu_first ? "saved by the CPU, used on the GPU" : "saved by the GPU, used on the CPU";
    auto cache = std::make_shared<StateCache>(m, small_blocks());
    Session writer(m, nullptr, cpu_first ? on_cpu(cache) : on_gpu(g, cache));
    writer.generate(greedy(concat(shared, random_tokens(m, 9, 6)), 1));
    Session reader(m, nullptr, cpu_first ? on_gpu(g, cache) : on_cpu(cache));
    EXPECT_EQ(reader.prepare(b), 128) << what;
    expect_close(fresh, reader.last_logits(), what, tolerance);
  }

  ScratchDir dir;
  Session on_card(m, nullptr, on_gpu(g));
  const GenerateResult first = on_card.generate(greedy(b, 4));
  on_card.save(dir / "chat.swst", "from the GPU");
  std::vector<int32_t> next = concat(on_card.state().tokens, random_tokens(m, 7, 7));
  const GenerateResult want = on_card.generate(greedy(next));
  for (const bool gpu : {true, false}) {
    Session resumed(m, nullptr, gpu ? on_gpu(g) : cpu_only);
    EXPECT_EQ(resumed.load(dir / "chat.swst"), "from the GPU");
    const GenerateResult got = resumed.generate(greedy(next));
    EXPECT_EQ(got.stats.reused_tokens, int64_t(first.stats.prompt_tokens + first.stats.generated_tokens - 1));
    EXPECT_EQ(got.tokens, want.tokens) << (gpu ? "resumed on the GPU" : "resumed on the CPU");
    expect_close(on_card.last_logits(), resumed.last_logits(), gpu ? "resumed on the GPU" : "resumed on the CPU",
                 gpu ? 1e-3f : tolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, StateCacheFamily, ::testing::Values("tiny", "tiny-q35"),
                         [](const auto& info) { return info.param == "tiny" ? "Qwen3Next" : "Qwen35"; });

// ------------------------------------------------------------------------------ on disk

std::vector<fs::path> state_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".swst") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(StateCache, DirectorySurvivesARestart) {
  const Model& m = tiny("tiny").model;
  ScratchDir dir;
  StateCacheOptions o = small_blocks();
  o.dir = dir.str();
  o.disk_bytes = 1 << 30;
  const std::vector<int32_t> shared = random_tokens(m, 270, 9);
  const std::vector<int32_t> b = concat(shared, random_tokens(m, 9, 10));
  {
    auto cache = std::make_shared<StateCache>(m, o);
    Session s(m, nullptr, with(cache));
    s.generate(greedy(concat(shared, random_tokens(m, 20, 11))));
    cache->flush();
    EXPECT_EQ(cache->stats().files_written, 3u);  // 128, 256, 290
  }
  EXPECT_EQ(state_files(dir.path()).size(), 3u);
  auto cache = std::make_shared<StateCache>(m, o);  // a new process: memory empty
  Session s(m, nullptr, with(cache));
  const GenerateResult r = s.generate(greedy(b));
  EXPECT_EQ(r.stats.reused_tokens, 256);
  EXPECT_EQ(r.tokens, fresh_run(m, b).tokens);
  cache->flush();
  const StateCacheStats st = cache->stats();
  EXPECT_EQ(st.hits_disk, 1u);
  EXPECT_EQ(st.files_ignored, 0u);
  EXPECT_EQ(st.files_disk, 4u);  // and b's end
  EXPECT_GT(st.bytes_disk, 0u);
}

// Rewrites the header of `path` through `edit`, its checksum made right again.
void edit_header(const fs::path& path, const std::function<void(StateFileHeader&)>& edit) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  StateFileHeader h{};
  f.read(reinterpret_cast<char*>(&h), sizeof h);
  edit(h);
  h.header_xxh3 = XXH3_64bits(&h, offsetof(StateFileHeader, header_xxh3));
  f.seekp(0);
  f.write(reinterpret_cast<const char*>(&h), sizeof h);
}

TEST(StateCache, DamagedAndForeignFilesAreIgnoredAndCounted) {
  const Model& m = tiny("tiny").model;
  const std::vector<int32_t> prompt = random_tokens(m, 100, 12);
  const std::map<std::string, std::function<void(const fs::path&)>> damage = {
      {"flipped payload byte",
       [](const fs::path& p) {
         std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
         f.seekg(sizeof(StateFileHeader) + 1000);
         char c = 0;
         f.read(&c, 1);
         c ^= 0x10;
         f.seekp(sizeof(StateFileHeader) + 1000);
         f.write(&c, 1);
       }},
      {"truncated", [](const fs::path& p) { fs::resize_file(p, fs::file_size(p) - 64); }},
      {"other version", [](const fs::path& p) { edit_header(p, [](StateFileHeader& h) { h.version = 99; }); }},
      {"other model", [](const fs::path& p) { edit_header(p, [](StateFileHeader& h) { h.model_id ^= 1; }); }},
      {"header garbage", [](const fs::path& p) {
         std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(20);
         f.write("xxxx", 4);
       }}};
  for (const auto& [what, hurt] : damage) {
    SCOPED_TRACE(what);
    ScratchDir dir;
    StateCacheOptions o;
    o.dir = dir.str();
    o.disk_bytes = 1 << 30;
    {
      auto cache = std::make_shared<StateCache>(m, o);
      Session s(m, nullptr, with(cache));
      s.prepare(prompt);
      cache->flush();
    }
    const auto files = state_files(dir.path());
    ASSERT_EQ(files.size(), 1u);
    hurt(files[0]);
    o.ram_bytes = 0;
    auto cache = std::make_shared<StateCache>(m, o);
    Session s(m, nullptr, with(cache));
    EXPECT_EQ(s.prepare(prompt), 0);  // prefilled, not restored
    EXPECT_EQ(cache->stats().hits_disk, 0u);
    EXPECT_EQ(cache->stats().files_ignored, 1u);
    EXPECT_TRUE(same_bits(s.last_logits(), fresh_run(m, prompt).logits));
  }
}

TEST(StateCache, AnotherModelsFilesAreNeverUsed) {
  const Model& a = tiny("tiny").model;
  const Model& b = tiny("tiny", 2).model;  // same shape, other weights
  ASSERT_NE(model_identity(a), model_identity(b));
  ScratchDir dir;
  StateCacheOptions o;
  o.dir = dir.str();
  o.disk_bytes = 1 << 30;
  const std::vector<int32_t> prompt = random_tokens(a, 80, 13);
  {
    auto cache = std::make_shared<StateCache>(a, o);
    Session(a, nullptr, with(cache)).prepare(prompt);
  }
  auto cache = std::make_shared<StateCache>(b, o);
  EXPECT_EQ(cache->stats().files_ignored, 1u);  // counted when the directory is opened
  Session s(b, nullptr, with(cache));
  EXPECT_EQ(s.prepare(prompt), 0);
  EXPECT_TRUE(same_bits(s.last_logits(), fresh_run(b, prompt).logits));

  // A saved session refuses another model's file with the reason.
  Session sa(a, nullptr);
  sa.prepare(prompt);
  sa.save(dir / "a.session");
  Session sb(b, nullptr);
  EXPECT_NE(testing::error_of([&] { sb.load(dir / "a.session"); }).find("another model"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { sb.load(dir / "missing.session"); }).find("cannot resume"), std::string::npos);
  EXPECT_EQ(sb.state().pos, 0);
}

TEST(StateCache, DiskBudgetHolds) {
  const Model& m = tiny("tiny").model;
  ScratchDir dir;
  StateCacheOptions o;
  o.dir = dir.str();
  o.ram_bytes = 0;
  // One 64-token state's file, measured: the budget holds two and a half.
  uint64_t one = 0;
  {
    ScratchDir probe_dir;
    StateCacheOptions p = o;
    p.dir = probe_dir.str();
    p.disk_bytes = 1 << 30;
    auto probe = std::make_shared<StateCache>(m, p);
    Session(m, nullptr, with(probe)).prepare(random_tokens(m, 64, 99));
    probe->flush();
    one = fs::file_size(state_files(probe_dir.path()).at(0));
  }
  o.disk_bytes = one * 5 / 2;
  auto cache = std::make_shared<StateCache>(m, o);
  for (uint32_t i = 0; i < 6; ++i) {
    Session(m, nullptr, with(cache)).prepare(random_tokens(m, 64, 100 + i));
    cache->flush();
  }
  uint64_t total = 0;
  for (const auto& f : state_files(dir.path())) total += fs::file_size(f);
  EXPECT_LE(total, o.disk_bytes);
  EXPECT_EQ(state_files(dir.path()).size(), 2u);
  EXPECT_EQ(cache->stats().evicted_disk, 4u);
  // The newest stays.
  Session s(m, nullptr, with(cache));
  EXPECT_EQ(s.prepare(random_tokens(m, 64, 105)), 64);
}

TEST(StateCache, TwoCachesShareADirectory) {
  const Model& m = tiny("tiny").model;
  ScratchDir dir;
  StateCacheOptions o = small_blocks();
  o.dir = dir.str();
  o.disk_bytes = 1 << 30;
  const std::vector<int32_t> shared = random_tokens(m, 200, 20);
  // Two servers on one directory: each writes its own prompts and the same shared ones, their
  // writer threads racing (the sessions take turns: one model's expert source serves one thread).
  {
    std::shared_ptr<StateCache> caches[2] = {std::make_shared<StateCache>(m, o), std::make_shared<StateCache>(m, o)};
    for (uint32_t i = 0; i < 3; ++i)
      for (uint32_t who = 0; who < 2; ++who) {
        Session(m, nullptr, with(caches[who])).prepare(concat(shared, random_tokens(m, 10, 30 + i)));
        Session(m, nullptr, with(caches[who])).prepare(random_tokens(m, 50, 40 + who * 10 + i));
      }
  }
  const auto files = state_files(dir.path());
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    ++n;
    EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
  }
  EXPECT_EQ(n, files.size()) << "temporary files left behind";
  // 128 and the 3 ends of the shared prompts (written once or twice, one name each), 6 own.
  EXPECT_EQ(files.size(), 10u);
  const uint64_t id = model_identity(m);
  for (const auto& f : files) {
    std::string why;
    EXPECT_TRUE(read_state_file(f.string(), m.config, id, std::nullopt, &why)) << f << ": " << why;
  }
  // A third instance finds what both wrote.
  auto cache = std::make_shared<StateCache>(m, o);
  EXPECT_EQ(cache->stats().files_ignored, 0u);
  Session s(m, nullptr, with(cache));
  EXPECT_EQ(s.prepare(concat(shared, random_tokens(m, 10, 31))), 210);
}

TEST(StateCache, CheckpointsAndOptions) {
  const Model& m = tiny("tiny").model;
  StateCache c(m, small_blocks());
  EXPECT_EQ(c.checkpoints(0, 300, 0), (std::vector<size_t>{128, 256, 300}));
  EXPECT_EQ(c.checkpoints(130, 300, 200), (std::vector<size_t>{200, 256, 300}));
  EXPECT_EQ(c.checkpoints(0, 256, 256), (std::vector<size_t>{128, 256}));
  EXPECT_EQ(c.checkpoints(300, 300, 0), (std::vector<size_t>{}));
  // Message starts closer than a block (32) to the previous checkpoint are skipped.
  const std::vector<size_t> messages = {10, 50, 60, 200};
  EXPECT_EQ(c.checkpoints(0, 300, 0, messages), (std::vector<size_t>{50, 128, 200, 256, 300}));
  EXPECT_EQ(c.checkpoints(0, 300, 60, messages), (std::vector<size_t>{50, 60, 128, 200, 256, 300}));
  const std::vector<int32_t> t = random_tokens(m, 100, 50);
  std::vector<int32_t> u = t;
  u[99] ^= 1;
  EXPECT_NE(c.key(t, 100), c.key(u, 100));
  EXPECT_EQ(c.key(t, 99), c.key(u, 99));
  EXPECT_NE(c.key(t, 64), c.key(t, 65));
  StateCacheOptions bad = small_blocks();
  bad.interval = 100;
  EXPECT_NE(testing::error_of([&] { StateCache c2(m, bad); }).find("multiple of the block"), std::string::npos);
  bad = {};
  bad.dir = "/proc/swiftlet_no_such_dir";
  bad.disk_bytes = 1000;
  EXPECT_NE(testing::error_of([&] { StateCache c3(m, bad); }).find("cannot create"), std::string::npos);
}

}  // namespace
}  // namespace swiftlet
