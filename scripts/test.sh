#!/usr/bin/env bash
# The whole test suite: an AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/,
# then every test through ctest, then a short run of every fuzz target (scripts/fuzz.sh, built in
# the same tree) with the arm64 kernel tests under emulation (build-arm64/) beside it. GPU tests skip
# themselves where no GPU is present. Each phase prints its time.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
t_start=$SECONDS
t_phase=$SECONDS
phase() {  # phase NAME: the time since the previous phase ended
  printf 'test.sh: %-24s %4d s (total %d s)\n' "$1" $((SECONDS - t_phase)) $((SECONDS - t_start))
  t_phase=$SECONDS
}

scripts/install-deps.sh
phase "install-deps"
# -O1 -g1: the sanitizers run the tests several times faster than at -O0 and the line tables
# name every frame of a report; clang: it compiles this tree in ~30% less CPU time than g++ under
# the sanitizers (the test sources about half), and scripts/fuzz.sh needs it anyway; CUDA (host
# code by g++) for one architecture (sm_90) checks that the kernels compile (no GPU runs them
# here; scripts/build.sh builds every architecture). The fuzz targets are built here too
# (SWIFTLET_FUZZ: libFuzzer's coverage in the layers they exercise), not in a tree of their own.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSWIFTLET_SANITIZE=ON -DSWIFTLET_FUZZ=ON \
      -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CUDA_HOST_COMPILER=g++ \
      -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DCMAKE_CUDA_ARCHITECTURES=90-real >/dev/null
ninja -C build-asan -j "$jobs"
phase "asan build"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 900
phase "ctest"
# The CPU kernels for aarch64, cross-built and tested under qemu-aarch64 on CPU models with and
# without the NEON extensions (scripts/test-arm64.sh), beside the fuzzers and below their priority:
# each fuzz target runs for a fixed time and keeps its share of the cores, and the arm64 build and
# qemu take what they leave (the last round of targets leaves a core idle), then finish alone.
arm_log=build-asan/test-arm64.log
nice -n 10 scripts/test-arm64.sh -j"$jobs" >"$arm_log" 2>&1 &
arm_pid=$!
trap 'kill "$arm_pid" 2>/dev/null || true' EXIT
fuzz_status=0
SWIFTLET_FUZZ_BUILD=build-asan SWIFTLET_FUZZ_SEED=${SWIFTLET_FUZZ_SEED:-1} scripts/fuzz.sh "${SWIFTLET_FUZZ_SECONDS:-30}" ||
  fuzz_status=$?
phase "fuzz"
arm_status=0
wait "$arm_pid" || arm_status=$?
trap - EXIT
cat "$arm_log"
phase "arm64 kernels (qemu), after"
((fuzz_status == 0)) || { echo "test.sh: a fuzz target failed (above)"; exit 1; }
((arm_status == 0)) || { echo "test.sh: the arm64 kernel tests failed (above)"; exit 1; }
