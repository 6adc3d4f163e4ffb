#!/usr/bin/env bash
# Installs everything Kiln needs from Debian's packages, skipping what is already there.
# Run as root on Debian 12 (bookworm). Safe to run again.
set -euo pipefail

packages=(
  # build
  cmake ninja-build g++ ccache lld git pkg-config
  # compiler: MLIR/LLVM 19, lit's FileCheck/not
  libmlir-19-dev mlir-19-tools llvm-19-dev llvm-19-tools
  zlib1g-dev libzstd-dev libedit-dev libffi-dev libxml2-dev libcurl4-openssl-dev
  # runtime: module format, BLAS (also PyTorch's, via libblas.so.3), MPI, libraries
  flatbuffers-compiler libflatbuffers-dev libopenblas-dev libopenmpi-dev openmpi-bin
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  # tests: GoogleTest, and PyTorch as the oracle (run with /usr/bin/python3)
  libgtest-dev python3 python3-torch python3-numpy
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${#missing[@]} package(s): ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages present"
fi

# PyTorch and Kiln must use the same real BLAS: make OpenBLAS the system libblas.so.3.
if update-alternatives --query libblas.so.3-x86_64-linux-gnu >/dev/null 2>&1; then
  current=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu | awk '/^Value:/{print $2}')
  case "$current" in
    *openblas*) ;;
    *) ${SUDO:-} update-alternatives --set libblas.so.3-x86_64-linux-gnu \
         /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ;;
  esac
fi
