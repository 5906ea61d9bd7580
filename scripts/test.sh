#!/usr/bin/env bash
# The whole test suite: an AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/,
# then every test through ctest, then a short run of every fuzz target (scripts/fuzz.sh, clang,
# build-fuzz/). GPU tests skip themselves where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSWIFTLET_SANITIZE=ON >/dev/null
ninja -C build-asan -j "$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 900
SWIFTLET_FUZZ_SEED=${SWIFTLET_FUZZ_SEED:-1} scripts/fuzz.sh "${SWIFTLET_FUZZ_SECONDS:-30}"
