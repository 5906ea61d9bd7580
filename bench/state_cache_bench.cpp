// Time to first token with the prefix state cache (runtime/state_cache.h), on a container:
//
//   swiftlet_bench_state_cache MODEL [--prompt P] [--new N] [--dir DIR] [--cache-gb G] [--gpu] [--no-check]
//
// Three conversations share their first P tokens (random ids) and differ in their last N:
//   cold:      the first, prefilled whole (its checkpoints go to memory and to DIR);
//   warm RAM:  the second, in the same process: restored from memory, N tokens prefilled;
//   warm disk: the third, on a new cache over the same DIR (a restarted server): read back from
//              the file (dropped from the page cache first), N tokens prefilled.
// Time to first token is the prompt's time until its logits are ready (the greedy pick costs
// nothing more); the warm ones' picks are checked against fresh runs of the same prompts (two
// more cold prefills; --no-check skips them). Prints the state sizes per checkpoint from the
// configuration and as written. --gpu: on the GPU (its states copied out of VRAM and back).
#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "runtime/state_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

namespace {

using namespace swiftlet;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string model, dir;
  int prompt = 1024, fresh_tokens = 8;
  std::string cache_gb;
  bool check = true, gpu = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail("{} needs a value", s);
      return argv[++i];
    };
    if (s == "--prompt")
      a.prompt = std::stoi(next());
    else if (s == "--new")
      a.fresh_tokens = std::stoi(next());
    else if (s == "--dir")
      a.dir = next();
    else if (s == "--cache-gb")
      a.cache_gb = next();
    else if (s == "--no-check")
      a.check = false;
    else if (s == "--gpu")
      a.gpu = true;
    else if (!s.starts_with("-") && a.model.empty())
      a.model = s;
    else
      fail(
          "unknown argument {}: usage: swiftlet_bench_state_cache MODEL [--prompt P] [--new N] [--dir DIR] [--cache-gb "
          "G] [--gpu] [--no-check]",
          s);
  }
  if (a.model.empty()) fail("give a model: swiftlet_bench_state_cache MODEL [--prompt P] [--new N] [--dir DIR]");
  if (a.prompt < 1 || a.fresh_tokens < 1) fail("--prompt and --new must be at least 1");
  return a;
}

std::vector<int32_t> random_ids(const ModelConfig& c, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(std::min<int64_t>(c.vocab_size, 150000)) - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

struct Run {
  double ttft = 0;
  double restore = 0;  // of ttft, finding and restoring the cached prefix (begin_prompt)
  int64_t reused = 0;
  int32_t token = -1;
};

// The prompt as the server feeds one: the end of the shared part is a turn boundary
// (Session::begin_prompt's snapshot_at), so a checkpoint is kept there.
Run first_token(const Engine& e, std::shared_ptr<StateCache> cache, const std::vector<int32_t>& prompt, size_t turn) {
  SessionOptions so;
  so.state_cache = std::move(cache);
  auto s = e.new_session(so);
  const auto t0 = Clock::now();
  Run r;
  r.reused = s->begin_prompt(prompt, turn);
  r.restore = std::chrono::duration<double>(Clock::now() - t0).count();
  while (s->prompt_pending() > 0) s->feed_prompt(size_t(kPrefillChunk));
  const std::vector<float>& l = s->last_logits();
  r.token = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
  r.ttft = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  EngineOptions eo;
  eo.model = a.model;
  apply_cache_flags(eo.load, a.cache_gb, "", "", "uring", a.prompt + a.fresh_tokens);
  eo.gpu = a.gpu;
  Engine e(eo);
  if (a.gpu && !e.gpu()) fail("--gpu: no usable CUDA GPU (or a build without CUDA)");
  const ModelConfig& c = e.config();
  const std::string dir = a.dir.empty() ? (fs::temp_directory_path() / "swiftlet_state_cache_bench").string() : a.dir;
  fs::remove_all(dir);

  const double deltanet = double(c.linear_state_bytes()), kv = double(c.kv_bytes_per_token());
  std::printf("model %s (%s, %s): DeltaNet state %.1f MB, KV %.1f KB per token\n", a.model.c_str(), c.family_name(),
              a.gpu ? "GPU" : "CPU", deltanet / 1e6, kv / 1e3);
  std::printf("state per checkpoint at %d tokens: %.1f MB (DeltaNet %.1f MB + KV %.1f MB)\n", a.prompt,
              (deltanet + kv * a.prompt) / 1e6, deltanet / 1e6, kv * a.prompt / 1e6);

  const std::vector<int32_t> shared = random_ids(c, size_t(a.prompt), 1);
  auto prompt = [&](uint32_t seed) {
    std::vector<int32_t> p = shared, more = random_ids(c, size_t(a.fresh_tokens), seed);
    p.insert(p.end(), more.begin(), more.end());
    return p;
  };
  StateCacheOptions o;  // the server's defaults
  o.dir = dir;
  o.disk_bytes = uint64_t(64) << 30;
  const size_t turn = size_t(a.prompt);

  auto cache = std::make_shared<StateCache>(e.model(), o);
  const Run cold = first_token(e, cache, prompt(2), turn);
  cache->flush();
  const Run ram = first_token(e, cache, prompt(3), turn);
  const StateCacheStats st = cache->stats();
  cache.reset();
  // As after a restart some time later: the files are read from the disk, not the page cache.
  for (const auto& f : fs::directory_iterator(dir)) {
    const int fd = ::open(f.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  auto restarted = std::make_shared<StateCache>(e.model(), o);
  const Run disk = first_token(e, restarted, prompt(4), turn);
  restarted->flush();

  uint64_t file_bytes = 0;
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().string().find("-" + std::to_string(a.prompt) + "-") != std::string::npos) file_bytes = f.file_size();
  std::printf("state file at %d tokens: %.1f MB\n", a.prompt, double(file_bytes) / 1e6);
  std::printf("%-10s %10s %12s %8s %10s\n", "", "ttft (s)", "restore (s)", "reused", "prefilled");
  for (const auto& [name, r] : {std::pair{"cold", cold}, std::pair{"warm RAM", ram}, std::pair{"warm disk", disk}})
    std::printf("%-10s %10.3f %12.3f %8lld %10lld\n", name, r.ttft, r.restore, (long long)r.reused,
                (long long)(a.prompt + a.fresh_tokens - r.reused));
  std::printf("RAM entries %llu (%.1f MB)\n", (unsigned long long)st.entries_ram, double(st.bytes_ram) / 1e6);

  restarted.reset();
  fs::remove_all(dir);
  if (!a.check) return 0;
  // The warm answers against fresh runs of the same prompts.
  const Run fresh_ram = first_token(e, nullptr, prompt(3), 0), fresh_disk = first_token(e, nullptr, prompt(4), 0);
  const bool same = fresh_ram.token == ram.token && fresh_disk.token == disk.token;
  std::printf("first tokens equal a fresh run: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const swiftlet::Error& e) {
    std::fprintf(stderr, "swiftlet_bench_state_cache: %s\n", e.what());
    return 1;
  }
}
