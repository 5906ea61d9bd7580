#include "model_flags.h"

#include "core/error.h"

namespace swiftlet::cli {

void ModelFlags::add(CLI::App* cmd, FlagSet set) {
  const char* what = "checkpoint directory or .qpack container";
  if (set == FlagSet::Cli) cmd->add_option("model", model, what)->required();
  else cmd->add_option("--model,-m", model, what)->required();
  cmd->add_option("--backend", backend, "cpu (fast kernels, default) or reference (scalar fp32 oracle)");
  cmd->add_option("--isa", isa,
                  "instruction set of the CPU kernels: auto (the best this CPU runs, default); x86-64: avx2 or "
                  "avx512-vnni; Arm: neon, neon-dotprod or neon-i8mm");
  cmd->add_option("--threads", threads, "worker threads (default: one per physical core this process may use, within a cgroup CPU quota)");
  cmd->add_option("--tokenizer", tokenizer, "tokenizer.json to use instead of the model's own");
  cmd->add_flag("--no-verify", no_verify, "skip checking expert checksums as they are read");
  cmd->add_option("--cache-gb", cache_gb, "expert cache size in GB, or 'all' (default: what the machine can spare less a margin, "
                  "at least one token's experts; a line at start says how much and why)");
  cmd->add_option("--cache-mb", cache_mb, "expert cache size in MB");
  cmd->add_option("--ram-budget", ram_budget,
                  "size the expert cache so the whole process fits in this much RAM, e.g. 4G (refused if it cannot)");
  if (set == FlagSet::Cli)
    cmd->add_option("--context", context, "context length the RAM budget leaves room for (default 4096)");
  cmd->add_option("--io", io, "expert reads: uring (parallel, overlapping compute; default) or serial");
  cmd->add_option("--resident", resident, "dense weights: populate (mapped and read at start, default), map (read lazily) or read (into private memory)");
  cmd->add_flag("--chunked-prefill", chunked_prefill,
                "prompts: run the DeltaNet layers in the chunked form (results differ from token by token by rounding)");
  cmd->add_option("--predict-next", predict_next,
                  "decode: guess the experts of the next N layers with their routers and start reading them early "
                  "(default 1; 0: off)");
  cmd->add_option("--on-miss", on_miss,
                  "a routed expert not in memory: exact (wait for its read; default), skip:W (lossy: leave it out "
                  "when its router weight is below W, never a token's top-1, and renormalise the others) or "
                  "low-bit[:W] (lossy: read its low-bit copy instead, when its router weight is below W; needs a "
                  "container with copies, swiftlet-repack --miss-copy-bits); lossy modes run on the CPU only");
  cmd->add_flag("--gpu", gpu, "decode on an NVIDIA GPU (CUDA builds; falls back to the CPU without one)");
  cmd->add_option("--gpu-cache-gb", gpu_cache_gb,
                  "VRAM for routed experts, in GB (default: all free GPU memory less 2 GiB)");
}

EngineOptions ModelFlags::engine_options() const {
  EngineOptions o;
  o.model = model;
  o.tokenizer = tokenizer;
  o.backend = parse_backend(backend);
  if (isa != "auto") o.isa = parse_isa(isa);
  o.threads = threads;
  o.load.verify_experts = !no_verify;
  apply_cache_flags(o.load, cache_gb, cache_mb, ram_budget, io, context);
  o.load.budget_sessions = sessions;
  o.predict_next = predict_next;
  o.on_miss = parse_miss_policy(on_miss);
  o.chunked_prefill = chunked_prefill;
  o.load.resident = parse_residency(resident);
  if (!gpu_cache_gb.empty() && !gpu) fail("--gpu-cache-gb needs --gpu");
  o.gpu = gpu;
  if (!gpu_cache_gb.empty()) {
    o.gpu_cache_bytes = parse_bytes(gpu_cache_gb + "G", "--gpu-cache-gb");
    if (o.gpu_cache_bytes == 0) fail("--gpu-cache-gb must be positive (leave it out for all free GPU memory)");
  }
  return o;
}

}  // namespace swiftlet::cli
