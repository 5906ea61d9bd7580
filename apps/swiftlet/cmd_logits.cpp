// swiftlet logits MODEL --tokens 5,17,42 --out FILE [--decode] [--backend reference]
// Writes little-endian float32 logits, one row of vocab_size values per input token.
#include "cli_util.h"
#include "commands.h"

#include "core/error.h"
#include "runtime/model_loader.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace swiftlet::cli {

namespace {
struct LogitsOptions {
  std::string model, tokens, out, backend = "cpu";
  bool decode = false;
};

void run_logits(const LogitsOptions& o) {
  const Backend backend = parse_backend(o.backend);
  const std::vector<int32_t> ids = parse_id_list(o.tokens, "--tokens");
  auto lm = load_model(o.model);
  const int64_t V = lm->model.config.vocab_size;
  SessionState st = SessionState::create(lm->model.config);
  Forward fwd(lm->model, backend);
  std::vector<float> all, row;
  if (o.decode) {
    for (int32_t id : ids) {
      fwd.run(st, std::span(&id, 1), LogitsMode::Last, row);
      all.insert(all.end(), row.begin(), row.end());
    }
  } else {
    fwd.run(st, ids, LogitsMode::All, all);
  }
  SWIFTLET_CHECK(all.size() == ids.size() * size_t(V), "logits size");
  const std::string tmp = o.out + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot create '{}': {}", tmp, std::strerror(errno));
  bool ok = std::fwrite(all.data(), sizeof(float), all.size(), f) == all.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), o.out.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("cannot write '{}': {}", o.out, std::strerror(errno));
  }
  std::fprintf(stderr, "wrote %zu x %lld logits to %s\n", ids.size(), (long long)V, o.out.c_str());
}
}  // namespace

void add_logits_command(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  auto* cmd = app.add_subcommand("logits", "write the logits of every input token (float32 rows)");
  cmd->add_option("model", o->model, "checkpoint directory or .qpack")->required();
  cmd->add_option("--tokens", o->tokens, "comma-separated token ids")->required();
  cmd->add_option("--out", o->out, "output file (little-endian float32, tokens x vocab)")->required();
  cmd->add_flag("--decode", o->decode, "feed tokens one at a time through the incremental path");
  cmd->add_option("--backend", o->backend, "cpu (fast kernels) or reference (scalar fp32)");
  cmd->callback([o] { run_logits(*o); });
}

}  // namespace swiftlet::cli
