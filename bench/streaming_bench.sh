#!/usr/bin/env bash
# Expert-streaming benchmark on the real model shapes (issue 4; end-to-end figures of issue 6).
#
#   bench/streaming_bench.sh [--quick] [DIR]
#
# Creates (or reuses) the synthetic Qwen3-Next-80B-A3B- and Qwen3.5-35B-A3B-shaped containers in
# DIR (default: models/bench; 45 GB + 20 GB of disk), then runs `swiftlet bench` on each:
#   80B: default cache, a 3 GB RAM budget; parallel reads with and without next-layer prediction,
#        and serial synchronous reads;
#   35B: default cache, the same comparisons;
# each prints one table (peak RSS, prefill and decode tok/s, hit rate, MB read per token, read
# GB/s, IO wait share, and the disk-bound decode rate measured in the same run) plus a profile of
# a decoded token. Random-weight models route almost uniformly: their hit rates are a worst case.
# --quick decodes 16 tokens instead of 64.
set -euo pipefail
cd "$(dirname "$0")/.."

decode=64
if [[ "${1:-}" == "--quick" ]]; then
  decode=16
  shift
fi
dir="${1:-models/bench}"
bin=build/bin
[[ -x $bin/swiftlet && -x $bin/swiftlet-repack ]] || scripts/build.sh
mkdir -p "$dir"

make_model() {  # preset name
  local out="$dir/$2.qpack"
  if [[ ! -f "$out/manifest.json" ]]; then
    echo "== creating $out (synthetic $1)"
    "$bin/swiftlet-repack" --synthetic "$1" --output "$out"
  fi
}
make_model qwen3-next-80b-a3b next80b
make_model qwen3.5-35b-a3b q35b

echo
echo "== Qwen3-Next-80B-A3B shape"
"$bin/swiftlet" bench "$dir/next80b.qpack" --cache default,budget:3G --io-modes uring,serial --predict off,1 \
  --prompt-tokens 32 --decode "$decode"
echo
echo "== Qwen3.5-35B-A3B shape"
"$bin/swiftlet" bench "$dir/q35b.qpack" --cache default --io-modes uring,serial --predict off,1 \
  --prompt-tokens 32 --decode "$decode"
