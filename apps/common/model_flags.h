// The flags that choose and load a model, shared by `swiftlet` (generate, chat, bench) and
// swiftlet-server: one registration, one translation into EngineOptions.
#pragma once

#include "runtime/engine.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace swiftlet::cli {

// Where the flags go. Cli: the model is the positional MODEL and --context sets the context the
// RAM budget leaves room for. Server: the model is --model/-m and there is no --context (the
// server sets `context` from --ctx and `sessions` from --parallel before engine_options()).
enum class FlagSet { Cli, Server };

// MODEL, --backend, --isa, --threads, --tokenizer, --no-verify; the expert cache and IO flags
// --cache-gb, --cache-mb, --ram-budget, --io, --resident, --predict-next, --on-miss, --chunked-prefill;
// --gpu, --gpu-cache-gb.
struct ModelFlags {
  std::string model, backend = "cpu", isa = "auto", tokenizer;
  int threads = 0;
  bool no_verify = false;
  std::string cache_gb, cache_mb, ram_budget, io = "uring", resident = "populate";
  int64_t context = 4096;
  int sessions = 1;  // session states the RAM budget leaves room for
  int predict_next = 1;
  std::string on_miss = "exact";  // --on-miss: exact or skip:W (model/miss_policy.h)
  bool chunked_prefill = false;
  bool gpu = false;          // --gpu
  std::string gpu_cache_gb;  // --gpu-cache-gb
  void add(CLI::App* cmd, FlagSet set = FlagSet::Cli);
  // Throws Error naming the flag whose value is wrong.
  EngineOptions engine_options() const;
};

}  // namespace swiftlet::cli
