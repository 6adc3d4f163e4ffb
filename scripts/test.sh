#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every suite under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
start=$(date +%s)
scripts/build.sh
echo "build: $(( $(date +%s) - start )) s"
cd build
ctest --output-on-failure -j 2 --timeout 900
