#!/usr/bin/env bash
# Instructions per output element of the NEON products, counted under qemu-aarch64 (user mode):
# builds kernel_driver.cpp against build-arm64/ (scripts/build-arm64.sh first), runs one product
# with `-d in_asm,exec,nochain` restricted (-dfilter) to the kernel's own functions, and adds up
# the instructions of every translated block each time it runs. Independent of the emulator's
# speed; the count is of the code as built (RelWithDebInfo, GCC 12), on one thread.
#   tools/insn_count/count.sh ISA FORMAT ROWS COLS TOKENS     e.g. neon-dotprod q4 512 2048 1
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 5 ] || { echo "usage: $0 ISA q4|q8|bf16 ROWS COLS TOKENS" >&2; exit 2; }
isa=$1 format=$2 rows=$3 cols=$4 n=$5
[ -f build-arm64/libswiftlet.a ] || { echo "build-arm64/libswiftlet.a missing: run scripts/build-arm64.sh" >&2; exit 1; }
bin=build-arm64/bin/kernel_driver
if [ ! "$bin" -nt build-arm64/libswiftlet.a ] || [ ! "$bin" -nt tools/insn_count/kernel_driver.cpp ]; then
  aarch64-linux-gnu-g++ -std=c++20 -O2 -Isrc -Iinclude -no-pie tools/insn_count/kernel_driver.cpp \
    build-arm64/libswiftlet.a -lfmt -lzstd -pthread -o "$bin"
fi
case $isa in neon) cpu=cortex-a53 ;; neon-dotprod) cpu=cortex-a76 ;; *) cpu=max ;; esac
# Address ranges of the functions whose instructions count as the product's, and the preparation's.
ranges() {
  aarch64-linux-gnu-nm -S -C "$bin" | grep -E "$1" |
    awk '{ printf "%s0x%s+0x%s", (n++ ? "," : ""), $1, $2 }'
}
if [ "$format" = bf16 ]; then
  kernel=$(ranges 'neon::matmul_rows_f32|ref::dequant_row|swiftlet::to_f32')
else
  kernel=$(ranges 'neon::.*(row_tokens|rows2_tokens2|matmul_rows_q8)|q8::.*tokens_of<')
fi
prep=$(ranges 'neon::prepare_q8|neon::.*quantize_block')
log=$(mktemp)
trap 'rm -f "$log"' EXIT
count() {  # instructions executed inside the ranges $1
  qemu-aarch64 -cpu "$cpu" -d in_asm,exec,nochain -dfilter "$1" -D "$log" "$bin" "$isa" "$format" "$rows" "$cols" "$n" 1 \
    >/dev/null
  tools/insn_count/sum_trace.py "$log"
}
k=$(count "$kernel")
echo "$isa $format ${rows}x${cols}, $n token(s): $k instructions in the product, $(python3 -c "print(f'{$k / ($rows * $n):.1f}')") per output element, $(python3 -c "print(f'{$k / ($rows * $n * $cols / 64):.2f}')") per 64 weights of an output"
if [ "$format" != bf16 ]; then
  p=$(count "$prep")
  echo "  activations' quantisation: $p instructions, $(python3 -c "print(f'{$p / ($n * $cols):.2f}')") per input value"
fi
