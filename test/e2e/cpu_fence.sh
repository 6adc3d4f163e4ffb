#!/usr/bin/env bash
# The CPU path's generated kernels under AddressSanitizer and UndefinedBehaviorSanitizer, each call
# fenced to its operands' bytes (the executor's KILN_CPU_FENCE=1, runtime/executor.cpp
# run_fenced): the arena is one allocation, so without the fence a kernel running from one
# operand into the neighbouring buffer goes unseen.
#
#   test/e2e/cpu_fence.sh [BUILD_DIR] [WORK_DIR]     (defaults: build, a temp dir)
#
# For each config of test/e2e/configs (CONFIGS, default tiny-bf16 awkward; a word ending in .toml is
# a spec file's path) and kilnc variant
# (VARIANTS, default: the fused module and --fuse-single-ops; "-" stands for the default;
# --no-fusion modules have no generated kernels), kilnc compiles the kernels with -fsanitize=address,undefined (KILN_CXX names a
# wrapper around $CXX, default c++; the kernel cache off, so that no plain library is reused),
# and the executable runs `train` (STEPS steps, default 2, with a validation pass and a sample),
# `eval` and `sample` with the ASan runtime preloaded. Any report fails the run (UBSan halts on
# its first error).
# PROBE=1: KILN_CPU_FENCE_PROBE=1 (the last byte of each kernel's first operand stays fenced) on
# the first config and variant, whose `train` must then fail with ASan's use-after-poison report
# in a generated kernel (kN_...): the check that the kernels are instrumented and the fence is up
# (ctest's e2e.cpu-fence.probe); the run passes when it is reported.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
work="${2:-$(mktemp -d "${TMPDIR:-/tmp}/kiln-cpu-fence.XXXXXX")}"
mkdir -p "$work"
configs="${CONFIGS:-tiny-bf16 awkward}"
variants="${VARIANTS:-- --fuse-single-ops}"
steps="${STEPS:-2}"
cxx="${CXX:-c++}"
libasan="$("$cxx" -print-file-name=libasan.so)"
[ -f "$libasan" ] || { echo "cpu_fence.sh: $cxx has no ASan runtime (libasan.so)"; exit 2; }
wrapper="$work/sanitizing-cxx"
printf '#!/bin/sh\nexec %q "$@" -fsanitize=address,undefined -fno-omit-frame-pointer -g1\n' "$cxx" > "$wrapper"
chmod +x "$wrapper"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
sanitized=(KILN_CPU_FENCE=1 "LD_PRELOAD=$libasan" "ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}"
           "UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}")
[ "${PROBE:-0}" = 1 ] && sanitized+=(KILN_CPU_FENCE_PROBE=1)

status=0
run() {  # run LOG COMMAND...: sanitized, its output also in LOG; a failure fails the test
  local log=$1
  shift
  echo "== ${*#"$work/"}"
  local rc=0
  env "${sanitized[@]}" "$@" > "$log" 2>&1 || rc=$?
  if [ $rc != 0 ]; then
    status=1
    echo "exit $rc"
  fi
  grep -E "runtime error|SUMMARY|error:" "$log" || true
}
for cfg in $configs; do
  spec="$root/test/e2e/configs/$cfg.toml"
  case $cfg in *.toml) spec=$cfg; cfg=$(basename "$cfg" .toml) ;; esac  # (a spec file's path)
  vocab=$(sed -nE 's/^vocab_size *= *([0-9]+).*/\1/p' "$spec")
  mkdir -p "$work/$cfg/data"
  python3 "$root/scripts/make_synthetic_shard.py" --out "$work/$cfg/data" --vocab-size "$vocab" --tokens 20000 \
    --seed 1 > /dev/null
  for variant in $variants; do
    name=${variant#--}
    name=${name:-fused}
    name=${name//=/-}  # (env would read a path holding "=" as an assignment)
    [ "$variant" = - ] && name=fused && variant=
    d="$work/$cfg/$name"
    mkdir -p "$d"
    echo "== $cfg ($name): kilnc, kernels under ASan/UBSan"
    KILN_CXX="$wrapper" KILN_KERNEL_CACHE=off "$build/bin/kilnc" "$spec" -o "$d/gpt2" $variant > "$d/kilnc.log" 2>&1 ||
      { cat "$d/kilnc.log"; status=1; continue; }
    run "$d/train.log" "$d/gpt2" train --data "$work/$cfg/data/train_*.bin" --val-data "$work/$cfg/data/val_*.bin" \
      --steps "$steps" --val-every "$steps" --val-steps 1 --sample-every "$steps" --sample-tokens 4 \
      --save "$d/weights.safetensors"
    if [ "${PROBE:-0}" = 1 ]; then
      if [ $status = 1 ] && grep -q "SUMMARY: AddressSanitizer: use-after-poison" "$d/train.log" &&
         kernel=$(grep -m1 -oE "#[0-9]+ 0x[0-9a-f]+ in k[0-9]+_[A-Za-z0-9_]+" "$d/train.log"); then
        echo "cpu fence probe: reported (${kernel##* in })"
        exit 0
      fi
      cat "$d/train.log"
      echo "cpu fence probe: FAILED (no use-after-poison report in a generated kernel)"
      exit 1
    fi
    run "$d/eval.log" "$d/gpt2" eval --init "$d/weights.safetensors" --data "$work/$cfg/data/val_*.bin" --batches 2
    run "$d/sample.log" "$d/gpt2" sample --init "$d/weights.safetensors" --prompt-ids "1 2 3" --max-new-tokens 8 \
      --num-samples 2 --top-k 5 --seed 1
  done
done
[ $status -eq 0 ] && echo "cpu fence: all runs clean" || echo "cpu fence: FAILED"
exit $status
