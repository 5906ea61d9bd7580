#!/usr/bin/env bash
# Instructions per element of the token mixers' and activations' kernels on aarch64, the scalar
# reference against the 8-lane form (simd_f8.h on NEON), counted under qemu-aarch64 (user mode):
# builds mixer_driver.cpp against build-arm64/ (scripts/build-arm64.sh first) and runs each
# operation once and three times with `-d in_asm,exec,nochain`; the difference of the two whole
# runs' counts, halved, is one call's instructions (libm's expf included, the set-up cancelled).
# Independent of the emulator's speed; the code as built (RelWithDebInfo, GCC 12), one thread.
#   tools/insn_count/mixers.sh [OP ...]      default: every OP of mixer_driver.cpp
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f build-arm64/libswiftlet.a ] || { echo "build-arm64/libswiftlet.a missing: run scripts/build-arm64.sh" >&2; exit 1; }
bin=build-arm64/bin/mixer_driver
if [ ! "$bin" -nt build-arm64/libswiftlet.a ] || [ ! "$bin" -nt tools/insn_count/mixer_driver.cpp ]; then
  aarch64-linux-gnu-g++ -std=c++20 -O2 -Isrc -Iinclude -no-pie tools/insn_count/mixer_driver.cpp \
    build-arm64/libswiftlet.a -lfmt -lzstd -pthread -o "$bin"
fi
ops=("$@")
((${#ops[@]})) || ops=(silu_mul sigmoid_gate conv_silu l2_norm gated_rms_norm delta_decode delta_prompt attend_decode)
# What one call's count is divided by: its output elements; for the delta rule, the state's values
# times the tokens; for attention, the cached positions times the query heads.
declare -A per=([silu_mul]=4096 [sigmoid_gate]=4096 [conv_silu]=8192 [l2_norm]=2048 [gated_rms_norm]=4096
                [delta_decode]=65536 [delta_prompt]=$((65536 * 64)) [attend_decode]=$((256 * 16)))
declare -A unit=([delta_decode]="state value and token" [delta_prompt]="state value and token"
                 [attend_decode]="position and query head")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
count() {  # all instructions of a run of form $1, op $2, $3 calls
  qemu-aarch64 -cpu max -d in_asm,exec,nochain -D "$log" "$bin" "$1" "$2" "$3" >/dev/null
  tools/insn_count/sum_trace.py "$log"
}
printf '%-15s %12s %12s %8s  %s\n' op reference neon ratio "instructions per"
for op in "${ops[@]}"; do
  [ -n "${per[$op]:-}" ] || { echo "unknown op $op" >&2; exit 2; }
  r=() 
  for form in reference fast; do
    one=$(count "$form" "$op" 1) three=$(count "$form" "$op" 3)
    r+=("$(python3 -c "print(f'{($three - $one) / 2 / ${per[$op]}:.2f}')")")
  done
  printf '%-15s %12s %12s %8s  %s\n' "$op" "${r[0]}" "${r[1]}" "$(python3 -c "print(f'{${r[0]} / ${r[1]}:.1f}x')")" \
    "${unit[$op]:-element}"
done
