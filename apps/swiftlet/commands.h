// Subcommands of the `swiftlet` executable, one file each (cmd_<name>.cpp).
// Each function registers its subcommand and options on the app; the work runs in the
// subcommand's callback. Recoverable errors are thrown as swiftlet::Error and reported by main().
#pragma once

#include <CLI/CLI.hpp>

namespace swiftlet::cli {

void add_logits_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_cachesim_command(CLI::App& app);

}  // namespace swiftlet::cli
