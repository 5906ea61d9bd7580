// swiftlet: run Mixture-of-Experts models larger than RAM. Wires the subcommands together.
#include "commands.h"
#include "core/error.h"
#include "core/version.h"

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"swiftlet: run Qwen3-Next / Qwen3.5-MoE models, streaming experts from disk"};
  app.set_version_flag("--version", std::string(swiftlet::version()));
  app.require_subcommand(1);
  swiftlet::cli::add_logits_command(app);
  swiftlet::cli::add_generate_command(app);
  swiftlet::cli::add_chat_command(app);
  swiftlet::cli::add_tokenize_command(app);
  swiftlet::cli::add_info_command(app);
  swiftlet::cli::add_verify_command(app);
  swiftlet::cli::add_bench_command(app);
  swiftlet::cli::add_perplexity_command(app);
  swiftlet::cli::add_cachesim_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const swiftlet::Error& e) {
    std::fprintf(stderr, "swiftlet: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
