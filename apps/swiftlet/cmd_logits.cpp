#include "commands.h"

#include "core/error.h"

namespace swiftlet::cli {

void add_logits_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "logits (not yet)");
  cmd->callback([] { fail("logits is not implemented yet"); });
}

}  // namespace swiftlet::cli
