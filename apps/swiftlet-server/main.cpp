// swiftlet-server: OpenAI-compatible HTTP server.
#include <CLI/CLI.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"swiftlet-server: OpenAI-compatible server"};
  CLI11_PARSE(app, argc, argv);
  std::fprintf(stderr, "swiftlet-server: not implemented yet\n");
  return 2;
}
