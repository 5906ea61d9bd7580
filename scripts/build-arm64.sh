#!/usr/bin/env bash
# Cross-builds swiftlet for arm64 (aarch64) Linux on an x86-64 Debian 12 machine. Installs what it
# needs first (once): the aarch64 cross compiler, qemu-user, and the libraries as :arm64 multiarch
# packages. scripts/test-arm64.sh runs the results under qemu.
#   scripts/build-arm64.sh [-jN]         the core and CPU kernel layers and their unit tests
#                                        (SWIFTLET_KERNELS_ONLY) into build-arm64/ (default -j1)
#   scripts/build-arm64.sh --cli [-jN]   also the whole engine and the swiftlet CLI into
#                                        build-arm64-cli/ (CUDA off, no benchmarks; every library)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=-j1 cli=0
for a in "$@"; do
  case $a in
    -j*) jobs=$a ;;
    --cli) cli=1 ;;
    *) echo "usage: $0 [--cli] [-jN]" >&2; exit 2 ;;
  esac
done

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "adding the arm64 architecture to dpkg"
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -q
fi
pkgs=(g++-aarch64-linux-gnu qemu-user cmake ninja-build pkg-config libfmt-dev:arm64 libzstd-dev:arm64 libgtest-dev:arm64)
if ((cli)); then
  pkgs+=(nlohmann-json3-dev libcli11-dev libpcre2-dev:arm64 libsimdjson14:arm64 libxxhash-dev:arm64 liburing-dev:arm64
         libcpp-httplib-dev:arm64 libcurl4-openssl-dev:arm64 libicu-dev:arm64 libreadline-dev:arm64)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

flags=(--no-warn-unused-cli -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
       -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWIFTLET_BENCH=OFF)
command -v ccache >/dev/null && flags+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build-arm64 "${flags[@]}" -DSWIFTLET_KERNELS_ONLY=ON >/dev/null
ninja -C build-arm64 "$jobs" swiftlet_tests swiftlet_ops_test
if ((cli)); then
  # libsimdjson-dev:arm64 cannot be installed beside the host's (both own /usr/include/simdjson.h:
  # apt would remove the x86-64 one and break the native build), so its package is unpacked into
  # the build tree instead, with the library's, and CMake pointed at it.
  sj=$PWD/build-arm64-cli/simdjson
  if [ ! -f "$sj/usr/lib/aarch64-linux-gnu/cmake/simdjson/simdjson-config.cmake" ]; then
    debs=$(mktemp -d)
    (cd "$debs" && apt-get download -q libsimdjson-dev:arm64 libsimdjson14:arm64)
    for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$sj"; done
    rm -rf "$debs"
  fi
  cmake -S . -B build-arm64-cli "${flags[@]}" -DSWIFTLET_CUDA=OFF -DSWIFTLET_TESTS=OFF \
    -Dsimdjson_DIR="$sj/usr/lib/aarch64-linux-gnu/cmake/simdjson" >/dev/null
  ninja -C build-arm64-cli "$jobs" swiftlet-cli
fi
