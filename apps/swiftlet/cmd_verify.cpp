// swiftlet verify CONTAINER: checks a .qpack's structure, then every file and every expert blob
// against checksums.json. Exit status 1 and one line per problem when anything is wrong.
#include "commands.h"

#include "core/error.h"
#include "format/qpack.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

namespace swiftlet::cli {

namespace {
struct VerifyOptions {
  std::string container;
  int max_problems = 20;
};

void run_verify(const VerifyOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const QpackContainer qc = QpackContainer::open(o.container);  // structure: throws on problems
  if (!qc.checksums) {
    std::printf("%s: structure OK (manifest, layout, %d layer files); no checksums.json (a version-1 "
                "container from another writer), so the bytes were not checked\n",
                o.container.c_str(), qc.layout.layer_count);
    return;
  }
  const bool tty = ::isatty(2);
  auto last = t0;
  const QpackVerifyReport rep = verify_qpack(qc, [&](uint64_t done, uint64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (!tty || now - last < std::chrono::milliseconds(250)) return;
    last = now;
    std::fprintf(stderr, "\rverifying %.1f / %.1f GB", double(done) / 1e9, double(total) / 1e9);
  });
  if (tty) std::fprintf(stderr, "\r\033[K");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!rep.ok()) {
    for (size_t i = 0; i < rep.problems.size() && int(i) < o.max_problems; ++i)
      std::printf("%s\n", rep.problems[i].c_str());
    if (int(rep.problems.size()) > o.max_problems)
      std::printf("... and %zu more\n", rep.problems.size() - size_t(o.max_problems));
    fail("corrupt container '{}': {} problem(s) — re-run swiftlet-repack or download it again",
         o.container, rep.problems.size());
  }
  std::printf("%s: OK, %d files and %lld experts match their xxh3-64 checksums (%.2f GB in %.1f s, %.2f GB/s)\n",
              o.container.c_str(), rep.files_checked, (long long)rep.experts_checked,
              double(rep.bytes_hashed) / 1e9, s, double(rep.bytes_hashed) / 1e9 / std::max(s, 1e-9));
}
}  // namespace

void add_verify_command(CLI::App& app) {
  auto o = std::make_shared<VerifyOptions>();
  auto* cmd = app.add_subcommand("verify", "check every file and expert of a .qpack against its checksums");
  cmd->add_option("container", o->container, "the .qpack container")->required();
  cmd->add_option("--max-problems", o->max_problems, "problems to list");
  cmd->callback([o] { run_verify(*o); });
}

}  // namespace swiftlet::cli
