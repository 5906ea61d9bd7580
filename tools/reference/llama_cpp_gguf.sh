#!/usr/bin/env bash
# llama.cpp as the oracle of what a GGUF file means: builds llama.cpp (CPU) from a source tree,
# quantises GGUF models with llama-quantize into each type swiftlet reads, and writes llama.cpp's
# logits for one prompt of every model, for tests/data/gguf (src/convert/gguf_oracle_test.cpp
# compares swiftlet's conversions of the same files with them).
#
#   tools/reference/llama_cpp_gguf.sh LLAMA_SRC OUT MODEL.gguf...
#
# LLAMA_SRC: a llama.cpp source tree (ggml/ src/ include/ common/ tools/quantize/ vendor/ cmake/
# CMakeLists.txt are enough). MODEL.gguf: BF16 or F32 models written by swiftlet_write_gguf (the
# synthetic presets tiny-256 and tiny-256-q35 have rows of 256 values, so that the K-quant types
# apply to every matrix). OUT gets, per model NAME: NAME-TYPE.gguf and NAME-TYPE.llama.f32 (T x V
# float32) for TYPE in $TYPES, and ids.txt (the prompt).
set -euo pipefail
src=$1 out=$2
shift 2
TYPES=${TYPES:-"BF16 Q8_0 Q4_0 Q4_1 Q4_K_M Q5_K_M Q6_K"}
IDS=${IDS:-"1,5,17,42,7,200,3,255,0,99,128,64,17,31,250,17"}
jobs=$(nproc)
build=${BUILD:-$src/build-cpu}
if [ ! -x "$build/bin/llama-quantize" ]; then  # BUILD: an existing build of llama and llama-quantize
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  ninja -C "$build" -j"$jobs" llama llama-quantize >/dev/null
fi
here=$(cd "$(dirname "$0")" && pwd)
lib=$(dirname "$(find "$build" -name 'libllama.so' | head -1)")
g++ -O2 -std=c++17 "$here/llama_logits.cpp" -I"$src/include" -I"$src/ggml/include" -L"$lib" -lllama \
  -Wl,-rpath,"$lib" -o "$build/llama_logits"
ggml_lib=$(dirname "$(find "$build" -name 'libggml.so' | head -1)")
export LD_LIBRARY_PATH="$lib:$ggml_lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
echo "$IDS" > "$out/ids.txt"
for model in "$@"; do
  name=$(basename "$model" .gguf)
  name=${name%-bf16}
  name=${name%-f32}
  for t in $TYPES; do
    f="$out/$name-$t.gguf"
    "$build/bin/llama-quantize" "$model" "$f" "$t" >"$out/$name-$t.quantize.log" 2>&1 ||
      { echo "llama-quantize $t failed: see $out/$name-$t.quantize.log"; exit 1; }
    "$build/llama_logits" "$f" "$IDS" "$out/$name-$t.llama.f32"
  done
done
