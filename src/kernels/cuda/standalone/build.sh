#!/usr/bin/env bash
# Builds the CUDA kernel tests and the CUDA bench without the engine's dependencies (fmt, gtest,
# json, ...), for GPU machines that have nvcc but none of the engine's dev packages. The tests
# are the same cuda_kernels_test.cpp, compiled against small stand-ins for fmt and GoogleTest
# (shim/). Usage: build.sh OUT_DIR [ARCH...]   e.g.  build.sh /tmp/cu 90
# Outputs OUT_DIR/cuda_kernels_test and OUT_DIR/cuda_bench; ptxas register reports in
# OUT_DIR/ptxas.log.
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR [ARCH...]}
shift
archs=("${@:-80 90}")
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
root=$(cd "$src/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cxx=${CXX:-g++}
cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
mkdir -p "$out"

gencode=()
for a in ${archs[@]}; do gencode+=("-gencode=arch=compute_$a,code=sm_$a"); done

pids=()
for f in runtime matmul ops forward_ops; do
  "$nvcc" -std=c++17 -O2 -lineinfo -I"$src" "${gencode[@]}" -Xptxas -v -c "$src/kernels/cuda/$f.cu" \
    -o "$out/$f.o" 2> "$out/ptxas_$f.log" &
  pids+=($!)
done
cxxflags=(-std=c++20 -O2 -I"$src" -I"$here/shim" -I"$cuda_home/include")
for f in core/dtype core/error core/qmatrix kernels/cpu/ops_ref kernels/cuda/cuda_kernels_test; do
  "$cxx" "${cxxflags[@]}" -c "$src/$f.cpp" -o "$out/$(basename $f).o" &
  pids+=($!)
done
"$cxx" "${cxxflags[@]}" -c "$root/bench/cuda_bench.cpp" -o "$out/cuda_bench.o" &
pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
cat "$out"/ptxas_*.log > "$out/ptxas.log"

libs=(-L"$cuda_home/lib64" -L"$cuda_home/targets/x86_64-linux/lib" -lcudart -lpthread -ldl -lrt)
"$cxx" -o "$out/cuda_kernels_test" "$out"/{cuda_kernels_test,dtype,error,qmatrix,ops_ref,runtime,matmul,ops,forward_ops}.o "${libs[@]}"
"$cxx" -o "$out/cuda_bench" "$out"/{cuda_bench,runtime,matmul,ops,forward_ops}.o "${libs[@]}"
echo "built $out/cuda_kernels_test and $out/cuda_bench"
