// swiftlet-repack: turn a checkpoint into a .qpack container.
#include <CLI/CLI.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"swiftlet-repack: build a .qpack container"};
  CLI11_PARSE(app, argc, argv);
  std::fprintf(stderr, "swiftlet-repack: not implemented yet\n");
  return 2;
}
