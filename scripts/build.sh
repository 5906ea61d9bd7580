#!/usr/bin/env bash
# Release build (with debug info) into build/; executables land in build/bin/.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build
