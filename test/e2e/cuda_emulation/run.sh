#!/usr/bin/env bash
# End-to-end test of the runtime's GPU path without a GPU: compiles the test specs for target =
# "cuda" and "cpu" and runs micro_step + optimizer_step of both (driver.cpp: the cuda module on
# kiln::Executor over the emulated device, emulated_device.cpp), comparing every state buffer
# and the loss.
#
#   test/e2e/cuda_emulation/run.sh [BUILD_DIR] [WORK_DIR]     (defaults: build, a temp dir)
#
# Needs BUILD_DIR/bin/kilnc and BUILD_DIR/bin/kiln-cuda-emulator (built with the tests) and a
# host C++20 compiler ($CXX, default c++) for the emulated kernels (cached in $KILN_EMU_CACHE).
# CONFIGS selects specs of test/e2e/configs (a word ending in .toml: a spec file's path, which
# the lists below then name by its file name without .toml; default: the parity four, long / long-bf16 for
# sequences of several attention tiles, hs96-bf16 and wide-bf16 for larger heads, one-token-bf16
# for B T = 1, rows-bf16 for bias-gradient column sums in several chunks); STEPS the optimizer steps (2);
# CONFIGS_PLAIN those run again on a cuBLASLt without fused epilogues (default tiny-bf16 awkward),
# CONFIGS_SIMT with SIMT attention (long-bf16), CONFIGS_RACE on the race-exposing schedules
# (long-bf16 hs96-bf16 wide-bf16: two tile buffers and one; dq in the dk/dv kernel or its own;
# long: the SIMT kernels over several key tiles).
# SANITIZE=1 runs the kernels under AddressSanitizer and UndefinedBehaviorSanitizer (emulated_device.cpp
# KEMU_SANITIZE; the ASan runtime preloaded into the driver; about 10-20 s a config). The arena
# is one allocation, so around each launch the device memory is poisoned but for the byte ranges
# of that launch's operands (and its kernel's workspace): a kernel reading or writing outside its
# operands, even into the neighbouring buffer, is reported (use-after-poison; KEMU_FENCE=0 turns
# that off, for runs whose communicator thread reads the arena while kernels run). A report
# fails the run (UBSan halts on its first error). Off by default; ctest's
# e2e.cuda-emulation.sanitized runs them all so, and e2e.cuda-emulation.fence-probe checks
# that the fence reports a kernel reading past its operand (KEMU_PROBE=1; test/CMakeLists.txt).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
work="${2:-$(mktemp -d "${TMPDIR:-/tmp}/kiln-cuda-emu.XXXXXX")}"
mkdir -p "$work"
configs="${CONFIGS:-tiny tiny-bf16 awkward awkward-bf16 long long-bf16 hs96-bf16 wide-bf16 one-token-bf16 rows-bf16}"
steps="${STEPS:-2}"
export KILN_EMU_CACHE="${KILN_EMU_CACHE:-$work/kernel-cache}"
driver="$build/bin/kiln-cuda-emulator"
[ -x "$driver" ] || { echo "run.sh: $driver is missing (build the tests)"; exit 2; }
sanitize=()
if [ "${SANITIZE:-0}" = 1 ]; then
  sanitize=(KEMU_SANITIZE=1 "LD_PRELOAD=$("${CXX:-c++}" -print-file-name=libasan.so)"
            "ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}"
            "UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}")
fi

status=0
# check CFG CUDA_MODULE WHAT [VAR=VALUE...]: the driver on CFG's cpu module and CUDA_MODULE (with
# those variables), its output also in CUDA_MODULE.log; a failure fails the test.
check() {
  local cfg=$1 mod=$2 what=$3
  shift 3
  echo "== $cfg: run$what"
  env ${sanitize[@]+"${sanitize[@]}"} "$@" "$driver" "$work/$cfg/cpu.kiln" "$mod" --steps "$steps" 2>&1 | tee "$mod.log" || status=1
}
for cfg in $configs; do
  spec="$root/test/e2e/configs/$cfg.toml"
  case $cfg in *.toml) spec=$cfg; cfg=$(basename "$cfg" .toml) ;; esac  # (a spec file's path)
  d="$work/$cfg"
  mkdir -p "$d"
  sed -E 's/^target *= *"cpu"/target = "cuda"/' "$spec" > "$d/$cfg-cuda.toml"
  grep -q '^target = "cuda"' "$d/$cfg-cuda.toml" || { echo "$spec: no target line to change"; exit 2; }
  echo "== $cfg: kilnc (cpu, cuda)"
  "$build/bin/kilnc" "$spec" --emit=module -o "$d/cpu.kiln" > /dev/null
  "$build/bin/kilnc" "$d/$cfg-cuda.toml" --emit=module -o "$d/cuda.kiln" > /dev/null
  check "$cfg" "$d/cuda.kiln" ""
done
# A cuBLASLt that fuses no epilogue: the runtime runs them as a support kernel after the product.
if [ -z "${CONFIGS_PLAIN+x}" ]; then CONFIGS_PLAIN="tiny-bf16 awkward"; fi
for cfg in $CONFIGS_PLAIN; do
  [ -f "$work/$cfg/cuda.kiln" ] || continue
  check "$cfg" "$work/$cfg/cuda.kiln" ", cuBLASLt without fused epilogues" KILN_EMU_PLAIN_CUBLASLT=1
  grep -q "run their epilogue as a separate kernel" "$work/$cfg/cuda.kiln.log" ||
    { echo "$cfg: the fallback did not run"; status=1; }
done
# The SIMT attention kernels on a bf16 module (kilnc --cuda-simt-attention; the tensor-core ones
# are the default there).
if [ -z "${CONFIGS_SIMT+x}" ]; then CONFIGS_SIMT="long-bf16"; fi
for cfg in $CONFIGS_SIMT; do
  [ -f "$work/$cfg/$cfg-cuda.toml" ] || continue
  "$build/bin/kilnc" "$work/$cfg/$cfg-cuda.toml" --emit=module -o "$work/$cfg/cuda-simt.kiln" --cuda-simt-attention > /dev/null
  check "$cfg" "$work/$cfg/cuda-simt.kiln" ", SIMT attention"
done
# Shared-memory races (shim.h): each warp runs as far as it can before the next starts, with the
# asynchronous copies landing as late as the GPU may let them, then as early.
if [ -z "${CONFIGS_RACE+x}" ]; then CONFIGS_RACE="long long-bf16 hs96-bf16 wide-bf16"; fi
for cfg in $CONFIGS_RACE; do
  [ -f "$work/$cfg/cuda.kiln" ] || continue
  for copies in deferred eager; do
    check "$cfg" "$work/$cfg/cuda.kiln" ", a warp at a time, $copies copies" KEMU_SCHEDULE=warps KEMU_CP_ASYNC=$copies
  done
done
[ $status -eq 0 ] && echo "cuda emulation: all configs pass" || echo "cuda emulation: FAILED"
exit $status
