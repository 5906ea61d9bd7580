#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, in build-fuzz/ or the tree SWIFTLET_FUZZ_BUILD
# names) and runs each for a while from its seed corpus in fuzz/corpus/<target>/; new inputs go to
# <tree>/corpus/<target>/, crashes to <tree>/crashes/. Exits non-zero when a target finds a crash,
# leak, timeout or OOM.
#   scripts/fuzz.sh [SECONDS_PER_TARGET (default 60)] [TARGET ...]
# SWIFTLET_FUZZ_SEED fixes libFuzzer's seed (default 0: a new one each run). The test script's
# short run fixes it, so CI replays the same inputs each time and stays a regression check;
# campaigns meant to find new bugs run without it.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(safetensors gguf config qpack tokenizer_load tokenizer_encode chat_template stream routes)

# SWIFTLET_FUZZ_BUILD names a build tree configured with -DSWIFTLET_FUZZ=ON to take the targets
# from (scripts/test.sh: its sanitizer tree); otherwise build-fuzz/ is configured here, -O1 with
# line tables: what libFuzzer + ASan want, and the quickest to compile.
build=${SWIFTLET_FUZZ_BUILD:-build-fuzz}
if [[ -z ${SWIFTLET_FUZZ_BUILD:-} ]]; then
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -gline-tables-only" \
        -DCMAKE_CXX_COMPILER=clang++ -DSWIFTLET_FUZZ=ON -DSWIFTLET_TESTS=OFF -DSWIFTLET_CUDA=OFF \
        ${SWIFTLET_FUZZ_CMAKE_ARGS:-} >/dev/null
elif ! grep -q '^SWIFTLET_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "fuzz.sh: $build is not a build tree configured with -DSWIFTLET_FUZZ=ON" >&2
  exit 2
fi
ninja -C "$build" -j "$(nproc)" $(printf 'fuzz_%s ' "${targets[@]}")

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p $build/crashes
# Each target runs on one core: as many at once as there are cores.
run_target() {  # run_target NAME: exits 0 when nothing was found
  local t=$1 log="$build/fuzz_$1.log"
  mkdir -p "$build/corpus/$t"
  $build/bin/fuzz_$t -max_total_time="$secs" -seed="${SWIFTLET_FUZZ_SEED:-0}" -timeout=20 -rss_limit_mb=2048 -max_len=8192 \
    -print_final_stats=1 -artifact_prefix="$build/crashes/$t-" \
    "$build/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1
}
declare -A pid_of
failed=()
finish() {  # finish NAME: waits for its run and reports it
  local t=$1 log="$build/fuzz_$1.log"
  if wait "${pid_of[$t]}"; then
    echo "fuzz_$t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') executions in ${secs} s, nothing found"
  else
    echo "fuzz_$t: FAILED (see $log; the input is in $build/crashes/)"
    tail -n 40 "$log"
    failed+=("$t")
  fi
}
width=$(nproc)
running=()
for t in "${targets[@]}"; do
  if ((${#running[@]} >= width)); then
    finish "${running[0]}"
    running=("${running[@]:1}")
  fi
  run_target "$t" &
  pid_of[$t]=$!
  running+=("$t")
done
for t in "${running[@]}"; do finish "$t"; done
((${#failed[@]} == 0)) || { echo "fuzz targets that failed: ${failed[*]}"; exit 1; }
