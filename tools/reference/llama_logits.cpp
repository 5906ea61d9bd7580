// llama_logits: the logits llama.cpp computes for a GGUF model and a list of token ids (one
// prompt, every position), as little-endian float32 T x V, for comparing with swiftlet's
// conversion of the same file (tools/reference/llama_cpp_gguf.sh). Built against llama.cpp's
// libllama; not part of swiftlet's build.
//   llama_logits MODEL.gguf IDS OUT.f32      (IDS: comma-separated token ids)
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: llama_logits MODEL.gguf IDS OUT.f32\n");
    return 2;
  }
  std::vector<llama_token> ids;
  std::stringstream ss(argv[2]);
  for (std::string t; std::getline(ss, t, ',');) ids.push_back(llama_token(std::atoi(t.c_str())));
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "llama_logits: cannot load %s\n", argv[1]);
    return 1;
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 256;
  cp.n_batch = 256;
  cp.n_ubatch = 256;
  cp.n_threads = 4;
  cp.n_threads_batch = 4;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "llama_logits: cannot create a context\n");
    return 1;
  }
  llama_batch batch = llama_batch_init(int32_t(ids.size()), 0, 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = llama_pos(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = int32_t(ids.size());
  if (llama_decode(ctx, batch) != 0) {
    std::fprintf(stderr, "llama_logits: decode failed\n");
    return 1;
  }
  const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  FILE* out = std::fopen(argv[3], "wb");
  if (!out) return 1;
  for (size_t i = 0; i < ids.size(); ++i) std::fwrite(llama_get_logits_ith(ctx, int32_t(i)), 4, size_t(n_vocab), out);
  std::fclose(out);
  std::printf("%s: %zu tokens x %d logits\n", argv[1], ids.size(), n_vocab);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
