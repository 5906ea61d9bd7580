#!/usr/bin/env bash
# On the GPU machine: the GPU tests of a bundle (tools/device/bundle.sh, packed as NEW.tar.xz with
# bin/ and lib/), then the synthetic 35B decode figures of NEW and of BASE (a packed bin/swiftlet,
# run with NEW's lib/) one after the other: one stream every expert in VRAM, then 1 and 8 streams.
#   [SOURCE_DIR=/folder/the/bundle/was/built/from] tools/device/gpu_check.sh NEW.tar.xz BASE.tar.xz
# Made here (release builds with -DCMAKE_CUDA_ARCHITECTURES=90; without debug info they pack to
# ~27 MB, with it to ~100, past what travels):
#   tools/device/bundle.sh /tmp/b build/bin/{swiftlet,swiftlet-repack,swiftlet_tests}
#   strip --strip-debug /tmp/b/bin/* /tmp/b/lib/*; tar -cJf build-dev/new.tar.xz -C /tmp/b bin lib
# and BASE likewise from the base commit's bin/swiftlet alone. The working tree travels too (64 MiB
# with the carried files): the trained model (models/toy.qpack, 30 MB) can stay behind for the call.
# Writes $OUT/log.txt (the summary) and $OUT/all.tgz (every program's output). Each step has a
# time limit so that a short lease still brings back the steps before it.
set -u
(($# == 2)) || { echo "usage: $0 NEW.tar.xz BASE.tar.xz" >&2; exit 2; }
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out" /tmp/new /tmp/base
log=$out/log.txt
t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$log"; }
nvidia-smi -L | tee -a "$log"
tar -xJf "$1" -C /tmp/new && tar -xJf "$2" -C /tmp/base || { say "cannot unpack $1 / $2"; exit 1; }
export LD_LIBRARY_PATH=/tmp/new/lib
# The tests find their data (tests/data/fixtures) under the source folder the build was made in,
# which this copy of the tree is not: SOURCE_DIR (that folder, e.g. /work/wt) is linked to it.
# Without the fixtures the parameterised GPU tests have no instances and nothing says so.
if [[ -n ${SOURCE_DIR:-} && ! -e $SOURCE_DIR ]]; then
  mkdir -p "$(dirname "$SOURCE_DIR")" && ln -s "$PWD" "$SOURCE_DIR"
fi
filter='CudaKernels.*:CudaPrefill.*:GpuForward.*:*/GpuFixture.*:*StateCacheFamily*:*Gemm*'
say "GPU tests on the fixtures: $(/tmp/new/bin/swiftlet_tests --gtest_list_tests --gtest_filter='*/GpuFixture.*' |
  grep -c '^  ') (none: set SOURCE_DIR to the folder the bundle was built from)"
timeout 180 /tmp/new/bin/swiftlet_tests --gtest_brief=1 --gtest_filter="$filter" > "$out/tests.txt" 2>&1
say "GPU tests: exit $?"
tail -4 "$out/tests.txt" | tee -a "$log"
timeout 120 /tmp/new/bin/swiftlet-repack --synthetic qwen3.5-35b-a3b --output /tmp/35b.qpack > "$out/repack.txt" 2>&1
say "synthetic 35B: exit $?"
common=(/tmp/35b.qpack --gpu --cache all --io-modes uring --predict off --warm)
for v in new base; do
  timeout 80 /tmp/$v/bin/swiftlet bench "${common[@]}" --decode 64 > "$out/one_$v.txt" 2>&1
  say "$v, one stream: exit $?"
  grep -i "tok/s" "$out/one_$v.txt" | tail -3 | tee -a "$log"
done
for v in new base; do
  timeout 100 /tmp/$v/bin/swiftlet bench "${common[@]}" --streams 1,8 --decode 32 > "$out/streams_$v.txt" 2>&1
  say "$v, 1 and 8 streams: exit $?"
  grep -i "tok/s" "$out/streams_$v.txt" | tail -4 | tee -a "$log"
done
(cd "$out" && tar -czf all.tgz ./*.txt)
