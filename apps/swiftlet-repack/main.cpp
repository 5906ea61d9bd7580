// swiftlet-repack: build a .qpack container from a checkpoint directory, a Hugging Face repo or a
// synthetic preset (docs/qpack-format.md).
//
//   swiftlet-repack --from-dir DIR --output OUT.qpack [--bits 4|8|16] [--force] [--delete-source]
//   swiftlet-repack --from-hf ORG/REPO [--revision R] --output OUT.qpack
//   swiftlet-repack --from-gguf FILE|DIR --output OUT.qpack [--bits 4|8|16]
//   swiftlet-repack --synthetic PRESET [--tokenizer tokenizer.json] --output OUT.qpack
//   any of the above with --miss-copy-bits 2|3: also low-bit copies of the experts
//   swiftlet-repack --add-miss-copy CONTAINER --miss-copy-bits 2|3
#include "core/error.h"
#include "core/version.h"
#include "convert/hf_source.h"
#include "convert/repack.h"
#include "convert/synthetic.h"

#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>

namespace {

void on_signal(int) { swiftlet::request_repack_interrupt(); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"swiftlet-repack: build a .qpack container (streams layer by layer; the output "
               "appears only when complete)"};
  std::string from_dir, from_hf, from_gguf, revision = "main", synthetic, download_dir, add_copy;
  int miss_copy_bits = 0;
  bool list_presets = false, keep_download = false, quiet = false;
  swiftlet::RepackOptions o;
  app.set_version_flag("--version", std::string(swiftlet::version()));
  auto* src = app.add_option_group("source", "what to convert (exactly one)");
  src->add_option("--from-dir", from_dir, "Hugging Face (bf16: quantised) or MLX-quantised (copied) checkpoint directory");
  src->add_option("--from-hf", from_hf, "ORG/REPO on the Hugging Face hub (converted shard by shard as it "
                  "downloads; a rerun resumes)");
  src->add_option("--from-gguf", from_gguf, "llama.cpp GGUF model (qwen3next or qwen35moe; a file, any "
                  "part of a split model, or a directory holding one): dequantised, then written at --bits");
  src->add_option("--synthetic", synthetic, "random weights of a preset's shapes (see --list-presets)");
  src->add_flag("--list-presets", list_presets, "list the synthetic presets");
  src->add_option("--add-miss-copy", add_copy, "an existing container: add (or replace) the low-bit copies of its "
                  "experts (--miss-copy-bits), in place");
  src->require_option(1);
  app.add_option("--revision", revision, "branch, tag or commit of --from-hf");
  app.add_option("--download-dir", download_dir, "where --from-hf keeps the checkpoint (default OUT.download)");
  app.add_flag("--keep-download", keep_download, "keep the --from-hf checkpoint's shards (by default each is "
               "deleted once converted)");
  app.add_flag("--delete-source", o.delete_source, "--from-dir: convert shard by shard and delete each shard "
               "once converted (the disk then needs the container and about two shards; a rerun resumes)");
  app.add_option("--output,-o", o.output, "the container to write (a directory, e.g. model.qpack)");
  app.add_option("--bits", o.bits, "4 (default), 8, or 16 (bf16, no quantisation); router and "
                 "shared_expert_gate use 8 bits when quantising")->check(CLI::IsMember({4, 8, 16}));
  app.add_option("--miss-copy-bits", miss_copy_bits, "also store a 2- or 3-bit copy of every routed expert, read "
                 "instead of a missed expert with --on-miss low-bit (lossy; about 56% / 78% of a 4-bit expert's "
                 "bytes; ignored by readers of the version-1 format)")->check(CLI::IsMember({2, 3}));
  app.add_flag("--force", o.force, "replace an existing container (after the new one is complete)");
  app.add_option("--tokenizer", o.tokenizer, "--synthetic: tokenizer.json to embed; sizes the vocabulary");
  app.add_option("--seed", o.seed, "--synthetic: random seed");
  app.add_flag("--compress-tokenizer", o.compress_tokenizer,
               "store tokenizer.json zstd-compressed as tokenizer.json.zst (~30% of its size; read by "
               "swiftlet, not by Swiftlet or other tools)");
  app.add_option("--threads", o.threads, "threads filling expert blobs")->check(CLI::PositiveNumber);
  app.add_flag("--quiet,-q", quiet, "no progress lines");
  CLI11_PARSE(app, argc, argv);

  if (list_presets) {
    for (const auto& p : swiftlet::synthetic_presets()) std::printf("%-20s %s\n", p.name.c_str(), p.description.c_str());
    return 0;
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  if (!quiet) o.log = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
  try {
    if (!add_copy.empty()) {
      if (miss_copy_bits == 0) swiftlet::fail("--add-miss-copy needs --miss-copy-bits 2 or 3");
      if (!o.output.empty()) swiftlet::fail("--add-miss-copy changes the container in place: leave out --output");
      const uint64_t bytes = swiftlet::add_miss_copies(add_copy, {miss_copy_bits, o.threads, o.log});
      std::printf("%s: %d-bit copies of the experts, %.3f GB\n", add_copy.c_str(), miss_copy_bits, double(bytes) / 1e9);
      return 0;
    }
    if (o.output.empty()) swiftlet::fail("--output OUT.qpack is required");
    if (o.delete_source && from_dir.empty()) swiftlet::fail("--delete-source applies to --from-dir only");
    swiftlet::RepackStats st;
    if (!synthetic.empty()) st = swiftlet::repack_synthetic(synthetic, o);
    else if (!from_dir.empty()) st = swiftlet::repack_from_dir(from_dir, o);
    else if (!from_gguf.empty()) st = swiftlet::repack_from_gguf(from_gguf, o);
    else st = swiftlet::repack_from_hf(from_hf, revision, download_dir, keep_download, o);
    std::printf("%s: %.3f GB (resident %.3f GB, experts %.3f GB) in %.1f s\n", st.output.c_str(),
                double(st.total_bytes) / 1e9, double(st.resident_bytes) / 1e9,
                double(st.expert_bytes) / 1e9, st.seconds);
    if (miss_copy_bits != 0) {
      const uint64_t bytes = swiftlet::add_miss_copies(st.output, {miss_copy_bits, o.threads, o.log});
      std::printf("%s: %d-bit copies of the experts, %.3f GB\n", st.output.c_str(), miss_copy_bits, double(bytes) / 1e9);
    }
  } catch (const swiftlet::Error& e) {
    std::fprintf(stderr, "swiftlet-repack: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
