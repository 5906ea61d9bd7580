#!/usr/bin/env bash
# A fuzz campaign on a machine with many cores (the GPU machine: 16), from fuzz binaries built
# here (scripts/fuzz.sh's configuration) and bundled with tools/device/bundle.sh:
#   tools/device/fuzz_campaign.sh BUNDLE_DIR SECONDS [WORKERS_PER_TARGET] [OUT_DIR]
# Every target of fuzz/ runs WORKERS (default 2) niced processes sharing one corpus
# (build-fz/corpus/<target>, re-read by each worker: -reload=1) for SECONDS; a worker that stops
# on a finding starts again until the time is up. Findings go to build-fz/crashes/, logs to
# build-fz/log_<target>.<worker>.txt; the summary (executions per target, exits, corpus sizes) to
# build-fz/summary.txt, and logs + findings as OUT_DIR/fuzz.tgz.
# FUZZ_TARGETS (names separated by spaces) limits the campaign to some targets.
# The routes, stream and tokenizer_encode targets read the real Qwen3 tokenizer at the path
# compiled into them (SWIFTLET_SOURCE_DIR/tools/oracles/node_modules/...): put it there first.
set -uo pipefail
(($# >= 2)) || { echo "usage: $0 BUNDLE_DIR SECONDS [WORKERS] [OUT_DIR]" >&2; exit 2; }
bundle=$(realpath "$1"); secs=$2; workers=${3:-2}; out=${4:-build-fz}
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$bundle/lib ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:symbolize=0 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
read -ra targets <<< "${FUZZ_TARGETS:-safetensors gguf config qpack tokenizer_load tokenizer_encode chat_template stream routes}"
mkdir -p build-fz/crashes "$out"
end=$((SECONDS + secs))
worker() {  # TARGET INDEX
  local log=build-fz/log_$1.$2.txt
  while ((SECONDS + 5 < end)); do
    nice -n 10 "$bundle/bin/fuzz_$1" -max_total_time=$((end - SECONDS)) -timeout=20 -rss_limit_mb=2048 \
      -max_len=8192 -print_final_stats=1 -print_funcs=0 -reload=1 -artifact_prefix="build-fz/crashes/$1-" \
      "build-fz/corpus/$1" "fuzz/corpus/$1" >> "$log" 2>&1
    echo "=== exit $? at $SECONDS s" >> "$log"
  done
}
pids=()
for t in "${targets[@]}"; do
  mkdir -p "build-fz/corpus/$t"
  for ((w = 0; w < workers; ++w)); do worker "$t" "$w" & pids+=($!); done
done
wait "${pids[@]}"
{
  for t in "${targets[@]}"; do
    execs=$(cat build-fz/log_$t.*.txt | grep -o 'stat::number_of_executed_units: *[0-9]*' | awk '{s += $NF} END {print s + 0}')
    stops=$(cat build-fz/log_$t.*.txt | grep -c '^=== exit [^0]')
    echo "fuzz_$t: $execs executions, $workers x $secs s, $stops stops on a finding"
  done
  du -sh build-fz/corpus/*
  echo "findings:"; ls build-fz/crashes
} > build-fz/summary.txt
tar czf "$out/fuzz.tgz" build-fz/log_*.txt build-fz/crashes build-fz/summary.txt
cat build-fz/summary.txt
