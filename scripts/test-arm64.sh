#!/usr/bin/env bash
# The arm64 kernel tests under emulation: builds them (scripts/build-arm64.sh, which installs the
# cross toolchain and qemu-user when missing) and runs them with qemu-aarch64 in user mode on CPU
# models with and without the NEON extensions the kernels choose at run time:
#   cortex-a53  NEON only             -> the widening-multiply form
#   cortex-a76  + dotprod             -> also the sdot form
#   max         + dotprod, i8mm, SVE  -> also the smmla form, and every other unit test built
# The kernel tests iterate over available_isas(), so each model's run checks every form that CPU
# offers against the scalar reference and that the CPU's extensions are found; the long sweep
# (Kernels.Int8ActivationsWithinRoundingBound) runs once, on max, where it covers all three forms.
# Speed means nothing under emulation; docs/log/cpu-kernels.md counts instructions instead.
# ctest also runs the arm64 tests through qemu (the toolchain file's emulator, CPU model max):
#   ctest --test-dir build-arm64 -L unit
#   scripts/test-arm64.sh [-jN]     (build parallelism, default -j1)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-arm64.sh "$@"
qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)
bin=build-arm64/bin/swiftlet_tests
run_model() {  # run_model CPU: the kernel tests and the operation table on one CPU model
  local cpu=$1 filter='Kernels.*:-Kernels.Int8ActivationsWithinRoundingBound' ops=(--op matmul)
  # The operation table: the products' forms on every model, the mixers' one NEON form on max.
  [ "$cpu" = max ] && filter='*' && ops=()
  echo "== qemu-aarch64 -cpu $cpu: $filter"
  "$qemu" -cpu "$cpu" "$bin" --gtest_brief=1 --gtest_filter="$filter" || return 1
  echo "== qemu-aarch64 -cpu $cpu: swiftlet_ops_test ${ops[*]}"
  "$qemu" -cpu "$cpu" build-arm64/bin/swiftlet_ops_test "${ops[@]}" | grep -E "FAIL|cases within"
}
# The three models at once (qemu-user runs these tests on one thread each), printed in order.
logs=$(mktemp -d)
pids=()
for cpu in cortex-a53 cortex-a76 max; do
  run_model "$cpu" >"$logs/$cpu" 2>&1 &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
cat "$logs/cortex-a53" "$logs/cortex-a76" "$logs/max"
rm -rf "$logs"
((failed == 0)) || { echo "test-arm64.sh: a kernel test failed under qemu (above)"; exit 1; }

# With the CLI built (scripts/test-arm64.sh --cli): models/toy.qpack's greedy continuations of
# the trained model's reference prompts, on each form: cpu-f32 must give transformers' ids
# (tests/data/trained/reference.json, as TrainedModel does on x86). The int8 cpu backend must give
# the ids of the x86 build's AVX2 form (build/bin/swiftlet, when built) up to a near-tie: the int8
# forms (AVX2, AVX-512 VNNI, NEON) add their blocks' floats in different orders and can split
# where the model's two best tokens are closer than that noise (on the two prompts here, x86's
# own AVX2 and AVX-512 forms split twice, at fp32 gaps of 0.006 and 0.012). So where the ids part,
# the two picks' fp32 logits (x86, cpu-f32) after the common prefix must lie within 0.05.
cli=build-arm64-cli/bin/swiftlet
[ -x "$cli" ] || exit 0
x86=build/bin/swiftlet
fail=0
# near_tie PROMPT ARM_IDS X86_IDS: succeeds when the ids are equal, or first part where x86's fp32
# logits put the two picks within 0.05 of each other.
near_tie() {
  local common
  common=$(python3 -c 'import sys; a, b = sys.argv[1].split(), sys.argv[2].split()
i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
print("" if i is None else ",".join(a[:i]) + "|" + a[i] + "|" + b[i])' "$2" "$3")
  [ -z "$common" ] && return 0
  local prefix=${common%%|*} picks=${common#*|} out tokens
  tokens="$1${prefix:+,$prefix}"
  out=$(mktemp)
  "$x86" logits models/toy.qpack --tokens "$tokens" --out "$out" --backend cpu-f32 --decode >/dev/null 2>&1
  python3 - "$out" "$tokens" "${picks%%|*}" "${picks#*|}" <<'PY'
import array, sys
v = array.array("f")
v.frombytes(open(sys.argv[1], "rb").read())
V = len(v) // len(sys.argv[2].split(","))
last = v[-V:]
a, b = int(sys.argv[3]), int(sys.argv[4])
gap = abs(last[a] - last[b])
print(f"  the ids part at {a} / {b}: fp32 logits {last[a]:.4f} / {last[b]:.4f}, gap {gap:.4f}")
sys.exit(0 if gap < 0.05 else 1)
PY
  local rc=$?
  rm -f "$out"
  return $rc
}
while IFS='|' read -r prompt want n; do
  x86_ids=""
  [ -x "$x86" ] && x86_ids=$("$x86" generate models/toy.qpack --ids "$prompt" --max-new "$n" --greedy --print-ids --isa avx2)
  for pair in cortex-a53:neon cortex-a76:neon-dotprod max:neon-i8mm; do
    cpu=${pair%%:*} isa=${pair#*:}
    gen=("$qemu" -cpu "$cpu" "$cli" generate models/toy.qpack --ids "$prompt" --max-new "$n" --greedy --print-ids
         --isa "$isa")
    got=$("${gen[@]}" --backend cpu-f32)
    [ "$got" = "$want" ] || { echo "FAIL $isa cpu-f32: $got, want $want"; fail=1; }
    got=$("${gen[@]}")
    if [ -n "$x86_ids" ] && ! near_tie "$prompt" "$got" "$x86_ids"; then
      echo "FAIL $isa cpu: $got, x86 gives $x86_ids"
      fail=1
    fi
    echo "$isa: ${got:0:60}..."
  done
done < <(python3 -c '
import json
for p in json.load(open("tests/data/trained/reference.json"))["prompts"][:2]:
    print(",".join(map(str, p["prompt_ids"])) + "|" + " ".join(map(str, p["greedy_ids"])) + "|" + str(len(p["greedy_ids"])))')

# The held-out fixtures (tests/data/fixtures): prefill and decode logits of the arm64 CLI on each
# backend against transformers' fp32 references, within the x86 tests' bound (FixtureTest: 1e-3;
# the int8 cpu backend only on fixtures without quantised weights, where it is exact, as there).
for dir in tests/data/fixtures/*/; do
  name=$(basename "$dir")
  tokens=$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["tokens"])))' \
    "$dir/reference.json")
  backends="cpu-f32 reference"
  [[ $name == *mlx* ]] || backends+=" cpu"
  for backend in $backends; do
    for mode in prefill decode; do
      out=$(mktemp)
      flags=(--backend "$backend")
      [ $mode = decode ] && flags+=(--decode)
      "$qemu" -cpu max "$cli" logits "$dir" --tokens "$tokens" --out "$out" "${flags[@]}" >/dev/null 2>&1 ||
        echo "FAIL $name $backend $mode: swiftlet logits failed"
      if ! python3 - "$out" "$dir/${mode}_logits.f32" "$name $backend $mode" <<'PY'; then fail=1; fi
import array, sys
got, want = array.array("f"), array.array("f")
got.frombytes(open(sys.argv[1], "rb").read())
want.frombytes(open(sys.argv[2], "rb").read())
diff = max(abs(a - b) for a, b in zip(got, want)) if len(got) == len(want) else float("inf")
print(f"{sys.argv[3]}: max |arm64 - transformers| = {diff:.2e}")
sys.exit(0 if diff < 1e-3 else 1)
PY
      rm -f "$out"
    done
  done
done
exit $fail
