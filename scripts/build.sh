#!/usr/bin/env bash
# Configures and builds Kiln into build/ (Ninja, two jobs: MLIR translation units are heavy).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "${KILN_JOBS:-2}"
