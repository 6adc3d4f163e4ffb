#!/usr/bin/env bash
# End-to-end test of the generated CUDA kernels without a GPU: compiles the tiny test specs for
# target = "cuda" and "cpu", builds the cuda module's kernels.cu as host C++ over shim.h, and runs
# micro_step + optimizer_step of both (driver.cpp), comparing every state buffer and the loss.
#
#   test/e2e/cuda_emulation/run.sh [BUILD_DIR] [WORK_DIR]     (defaults: build, a temp dir)
#
# Needs BUILD_DIR/bin/kilnc and BUILD_DIR/bin/kiln-cuda-emulator (else libkiln_runtime.a and the
# FlatBuffers header to build the driver) and a host C++20 compiler ($CXX, default c++).
# CONFIGS selects specs of test/e2e/configs (default: all four); STEPS the optimizer steps (2).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
work="${2:-$(mktemp -d "${TMPDIR:-/tmp}/kiln-cuda-emu.XXXXXX")}"
mkdir -p "$work"
CXX="${CXX:-c++}"
configs="${CONFIGS:-tiny tiny-bf16 awkward awkward-bf16}"
steps="${STEPS:-2}"

# The driver is built with the project (kiln-cuda-emulator); without it, build it here.
driver="$build/bin/kiln-cuda-emulator"
if [ ! -x "$driver" ]; then
  blas_dir=/usr/lib/x86_64-linux-gnu/openblas-openmp
  libs=(-lopenblas -lgomp -lfmt -lflatbuffers -lpcre2-8 -ldl -lpthread)
  [ -d "$blas_dir" ] && libs=(-L"$blas_dir" -Wl,-rpath,"$blas_dir" "${libs[@]}")
  driver="$work/driver"
  echo "== driver ($driver)"
  "$CXX" -std=c++20 -O1 -I"$root" -I"$build/runtime" -I"$build" "$here/driver.cpp" \
    "$build/lib/libkiln_runtime.a" "${libs[@]}" -o "$driver"
fi

status=0
for cfg in $configs; do
  spec="$root/test/e2e/configs/$cfg.toml"
  d="$work/$cfg"
  mkdir -p "$d"
  sed -E 's/^target *= *"cpu"/target = "cuda"/' "$spec" > "$d/$cfg-cuda.toml"
  grep -q '^target = "cuda"' "$d/$cfg-cuda.toml" || { echo "$spec: no target line to change"; exit 2; }
  echo "== $cfg: kilnc (cpu, cuda)"
  "$build/bin/kilnc" "$spec" --emit=module -o "$d/cpu.kiln" > /dev/null
  "$build/bin/kilnc" "$d/$cfg-cuda.toml" --emit=module -o "$d/cuda.kiln" --dump-kernels "$d/kernels" > /dev/null
  echo "== $cfg: kernels.cu over the shim"
  "$CXX" -std=c++20 -O1 -U_FORTIFY_SOURCE -fPIC -shared -w -I"$here" \
    -DKILN_KERNELS_CU="\"$d/kernels/kernels.cu\"" "$here/kernels_tu.cpp" -o "$d/kernels.so"
  echo "== $cfg: run"
  if ! "$driver" "$d/cpu.kiln" "$d/cuda.kiln" "$d/kernels.so" --steps "$steps"; then
    status=1
  fi
done
[ $status -eq 0 ] && echo "cuda emulation: all configs pass" || echo "cuda emulation: FAILED"
exit $status
