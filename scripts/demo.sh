#!/usr/bin/env bash
# The main job on the default model: asks models/toy.qpack, the small model trained for this
# project (Qwen3-Next architecture, 256 experts, 8 a token, the real Qwen3 tokenizer and chat
# template; docs/trained-model.md), a question, streaming the answer and printing the statistics.
# It is a toy trained in minutes on a few tens of MB of public-domain and free text (mostly
# dictionary definitions), not an assistant: it answers in English, often wrongly.
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/toy.qpack
build/bin/swiftlet info "$model" || true
build/bin/swiftlet generate "$model" --chat --prompt "${1:-What is a computer?}" --max-new 64 --seed 7
