#include "commands.h"

#include "core/error.h"

namespace swiftlet::cli {

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "generate (not yet)");
  cmd->callback([] { fail("generate is not implemented yet"); });
}

}  // namespace swiftlet::cli
