// The tokenizer and chat template of a GGUF model, rebuilt from its metadata
// (tokenizer.ggml.*) as the Hugging Face files swiftlet reads: tokenizer.json (byte-level BPE:
// vocabulary, merges, added tokens, the pre-tokenizer of tokenizer.ggml.pre) and the template.
#pragma once

#include "format/gguf.h"

#include <string>

namespace swiftlet {

// tokenizer.json text. Throws Error, naming the key, for a tokenizer swiftlet cannot rebuild
// (not byte-level BPE "gpt2", a pre-tokenizer other than qwen2 / qwen35, missing arrays).
std::string gguf_tokenizer_json(const GgufFile& f);

// tokenizer.chat_template, or "" when the file has none.
std::string gguf_chat_template(const GgufFile& f);

// tokenizer_config.json text: the template and the names of the eos and padding tokens.
std::string gguf_tokenizer_config(const GgufFile& f);

}  // namespace swiftlet
