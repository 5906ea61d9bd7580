#include "commands.h"

#include "core/error.h"

namespace swiftlet::cli {

void add_tokenize_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "print the token ids of a text");
  cmd->callback([] { fail("tokenize is not implemented yet"); });
}

}  // namespace swiftlet::cli
