#!/usr/bin/env bash
# Copies programs built here, with the shared libraries they need beyond glibc, into one folder
# that can travel to another Linux machine (the GPU machine runs a newer glibc and has none of
# the project's Debian libraries):
#   tools/device/bundle.sh OUT_DIR BINARY...
# On the other machine: LD_LIBRARY_PATH=OUT_DIR/lib OUT_DIR/bin/NAME ...
# glibc itself (libc, libm, the loader, libpthread, libdl, librt, libresolv, libutil) and the CUDA driver stay
# behind: a binary linked against an older glibc runs on a newer one.
set -euo pipefail
(($# >= 2)) || { echo "usage: $0 OUT_DIR BINARY..." >&2; exit 2; }
out=$1
shift
mkdir -p "$out/bin" "$out/lib"
for bin in "$@"; do
  [[ -x $bin ]] || { echo "$0: $bin is not an executable file" >&2; exit 1; }
  cp -f "$bin" "$out/bin/"
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | while read -r lib; do
    case $(basename "$lib") in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*|ld-linux*|libcuda.so.*) ;;
      *) cp -fL "$lib" "$out/lib/" ;;
    esac
  done
done
du -sh "$out/bin" "$out/lib"
