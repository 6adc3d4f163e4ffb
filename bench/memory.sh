#!/usr/bin/env bash
# Activation memory of one GPT-2 124M training micro-step (B=16, T=1024): Kiln's planned arena
# (fp32, bf16, each with and without --recompute=cheap) against PyTorch eager on the same model
# (test/e2e/gpt2_reference.py), with eager attention and with a FlashAttention-style attention.
#
# Builds nothing: needs build/bin/kilnc and build/bin/kiln-inspect (scripts/build.sh).
# Writes bench/results/ (git-ignored): kiln-<precision>-<recompute>.json (kiln-inspect --json),
# pytorch.json (bench/pytorch_activation_memory.py) and memory.json (everything, with the table).
# Extra arguments go to pytorch_activation_memory.py, e.g. --batches 1,2,3 (adds a third batch size
# as an out-of-fit linearity check) or --configs fp32:eager,fp32:flash,fp32:fused,bf16:eager,... (adds
# the fused-ops variant; ~2 more minutes).
# Environment: KILN_BUILD (default build), SPEC (default models/gpt2-124m.toml), PYTHON
# (default /usr/bin/python3: Debian's torch).  Takes ~3.5 minutes on an idle 2-core machine
# (more when other work shares the cores).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${KILN_BUILD:-$ROOT/build}
SPEC=${SPEC:-$ROOT/models/gpt2-124m.toml}
PY=${PYTHON:-/usr/bin/python3}
OUT=$ROOT/bench/results
KILNC=$BUILD/bin/kilnc
INSPECT=$BUILD/bin/kiln-inspect
for b in "$KILNC" "$INSPECT"; do
  [ -x "$b" ] || { echo "memory.sh: $b not found; build first (scripts/build.sh)" >&2; exit 1; }
done
mkdir -p "$OUT"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-memory.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
start=$SECONDS

# The bf16 variant: the same spec with precision = "bf16", in a temporary directory.
BF16_SPEC=$TMP/$(basename "$SPEC" .toml)-bf16.toml
sed -E 's/^([[:space:]]*precision[[:space:]]*=[[:space:]]*)"fp32"/\1"bf16"/' "$SPEC" > "$BF16_SPEC"
grep -Eq '^[[:space:]]*precision[[:space:]]*=[[:space:]]*"bf16"' "$BF16_SPEC" \
  || { echo "memory.sh: could not set precision = \"bf16\" in a copy of $SPEC" >&2; exit 1; }

kiln_args=()
for prec in fp32 bf16; do
  spec=$SPEC; [ "$prec" = bf16 ] && spec=$BF16_SPEC
  for rc in none cheap; do
    mod=$TMP/gpt2-$prec-$rc.kiln
    echo "== kilnc $(basename "$spec") --emit=module --recompute=$rc"
    "$KILNC" "$spec" --emit=module --recompute="$rc" -o "$mod"
    "$INSPECT" --json "$mod" > "$OUT/kiln-$prec-$rc.json"
    kiln_args+=(--kiln "$prec:$rc=$OUT/kiln-$prec-$rc.json")
  done
done

echo "== PyTorch: $PY bench/pytorch_activation_memory.py --spec $SPEC $*"
"$PY" "$ROOT/bench/pytorch_activation_memory.py" --spec "$SPEC" --json "$OUT/pytorch.json" "$@"

echo
"$PY" "$ROOT/bench/memory_report.py" "${kiln_args[@]}" --pytorch "$OUT/pytorch.json" \
  --json "$OUT/memory.json"
echo "memory.sh: done in $((SECONDS - start)) s"
