// swiftlet tokenize MODEL_OR_TOKENIZER_JSON (--text T | --file F) [--special]
// Prints the token ids, space-separated, on one line.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <iterator>
#include <memory>

#include "commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace swiftlet::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string file;
  bool special = false;
};

std::string read_input_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read --file {}: check the path", path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void run_tokenize(const TokenizeOptions& opt) {
  const Tokenizer tokenizer = Tokenizer::from_file(opt.model);
  const std::string text = opt.file.empty() ? opt.text : read_input_file(opt.file);
  const std::vector<int32_t> ids = tokenizer.encode(text, opt.special);
  fmt::print("{}\n", fmt::join(ids, " "));
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto opt = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "print the token ids of a text, space-separated on one line");
  cmd->add_option("model", opt->model, "model directory containing tokenizer.json, or the tokenizer.json itself")
      ->required();
  auto* text = cmd->add_option("--text", opt->text, "text to tokenize");
  auto* file = cmd->add_option("--file", opt->file, "file whose contents (bytes as-is) to tokenize");
  text->excludes(file);
  file->excludes(text);
  cmd->add_flag("--special", opt->special,
                "parse special-token text such as <|im_start|> into its id (default: tokenize it as plain text)");
  cmd->callback([text, file, opt] {
    if (text->count() == 0 && file->count() == 0) fail("tokenize needs --text T or --file F");
    run_tokenize(*opt);
  });
}

}  // namespace swiftlet::cli
