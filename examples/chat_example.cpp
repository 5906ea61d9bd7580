// A minimal program on the public API only: load a model, hold a two-turn conversation with
// streamed output, print the statistics.
//   build/bin/swiftlet-example MODEL.qpack
#include <swiftlet/swiftlet.h>

#include <cstdio>
#include <iostream>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [question]\n", argv[0]);
    return 2;
  }
  try {
    swiftlet::api::EngineOptions opts;  // every other option at its default
    opts.model = argv[1];
    auto engine = swiftlet::api::Engine::open(opts);
    std::cout << engine->describe() << "\n";
    swiftlet::api::Chat chat(*engine, {.system = "You are a helpful assistant."});
    swiftlet::api::GenerationOptions gen;
    gen.max_new_tokens = 32;
    gen.greedy = true;
    for (const char* q : {argc > 2 ? argv[2] : "What is a mixture of experts?", "Say it shorter."}) {
      std::cout << "> " << q << "\n";
      chat.send(q, [](std::string_view piece) {
        std::cout << piece << std::flush;
        return true;
      }, gen);
      const auto& s = chat.last_stats();
      std::cout << "\n[" << s.prefilled_tokens << " tokens prefilled, " << s.reused_tokens << " reused, "
                << s.generated_tokens << " generated at " << s.decode_tok_s << " tok/s, finish: " << s.finish_reason
                << "]\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
