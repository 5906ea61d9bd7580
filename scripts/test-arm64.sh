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
for cpu in cortex-a53 cortex-a76 max; do
  filter='Kernels.*:-Kernels.Int8ActivationsWithinRoundingBound'
  [ "$cpu" = max ] && filter='*'
  echo "== qemu-aarch64 -cpu $cpu: $filter"
  "$qemu" -cpu "$cpu" "$bin" --gtest_brief=1 --gtest_filter="$filter"
done

# With the CLI built (scripts/test-arm64.sh --cli): models/toy.qpack's greedy continuations of
# the trained model's reference prompts, on each form: cpu-f32 must give transformers' ids
# (tests/data/trained/reference.json, as TrainedModel does on x86); the int8 cpu backend the ids
# the x86 build gives (build/bin/swiftlet, when built).
cli=build-arm64-cli/bin/swiftlet
[ -x "$cli" ] || exit 0
x86=build/bin/swiftlet
fail=0
while IFS='|' read -r prompt want n; do
  x86_ids=""
  [ -x "$x86" ] && x86_ids=$("$x86" generate models/toy.qpack --ids "$prompt" --max-new "$n" --greedy --print-ids)
  for pair in cortex-a53:neon cortex-a76:neon-dotprod max:neon-i8mm; do
    cpu=${pair%%:*} isa=${pair#*:}
    gen=("$qemu" -cpu "$cpu" "$cli" generate models/toy.qpack --ids "$prompt" --max-new "$n" --greedy --print-ids
         --isa "$isa")
    got=$("${gen[@]}" --backend cpu-f32)
    [ "$got" = "$want" ] || { echo "FAIL $isa cpu-f32: $got, want $want"; fail=1; }
    got=$("${gen[@]}")
    if [ -n "$x86_ids" ]; then
      [ "$got" = "$x86_ids" ] || { echo "FAIL $isa cpu: $got, x86 gives $x86_ids"; fail=1; }
    fi
    echo "$isa: ${got:0:60}..."
  done
done < <(python3 -c '
import json
for p in json.load(open("tests/data/trained/reference.json"))["prompts"][:2]:
    print(",".join(map(str, p["prompt_ids"])) + "|" + " ".join(map(str, p["greedy_ids"])) + "|" + str(len(p["greedy_ids"])))')
exit $fail
