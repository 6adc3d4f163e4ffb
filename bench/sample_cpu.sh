#!/usr/bin/env bash
# Sampling speed on the CPU: Kiln's `sample` with the key/value caches of @decode (the default),
# without them (--no-kv-cache: the whole forward pass over the last seq_len tokens for every new
# token), and PyTorch decoding the same model with a key/value cache (bench/pytorch_sample.py).
#
# The spec (default models/gpt2-mini.toml, the README's demo model) is compiled by kilnc; its
# weights are a fresh initialisation (`train --steps 1 --lr 0 --save`). Every configuration
# continues a prompt of --prompt-len tokens in B rows (the spec's batch_size: one round of rows)
# by --new-tokens tokens, top-k 50, with the same threads and OpenMP wait policy (--wait-policy,
# default passive: on 2 cores PyTorch's spinning OpenMP threads and the BLAS's own threads slow
# its small decoding steps several-fold when active; Kiln's a little). The time per step leaves
# out the start, the weight load and the prompt (the first step): Kiln's as `sample` reports it
# on stderr, PyTorch's the same steps timed in its process. The runs alternate, --rounds times;
# the figure is the median. Prints tokens/s (B tokens per step) and the ratios. Then the prompt:
# Kiln's first step (the prompt into the caches through @prefill and @prefill_short, 64 and 16
# positions per call, or with --no-prefill one per call; then the first token's logits and pick) against PyTorch's prefill
# (one causal forward pass over the prompt that fills its caches, as Hugging Face's `generate`
# does). Writes the numbers to bench/results/sample_cpu.json (git-ignored).
#
# Usage: bench/sample_cpu.sh [--spec FILE] [--prompt-len N] [--new-tokens N] [--rounds N]
#                            [--threads N] [--wait-policy active|passive] [--no-pytorch] [--out FILE]
# Environment: KILN_BUILD (default build), PYTHON (default /usr/bin/python3: Debian's torch).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${KILN_BUILD:-$ROOT/build}
PY=${PYTHON:-/usr/bin/python3}
SPEC=$ROOT/models/gpt2-mini.toml
PROMPT=16
NEW=64
ROUNDS=3
THREADS=$(nproc)
RUN_PYTORCH=1
POLICY=passive
OUT_JSON=$ROOT/bench/results/sample_cpu.json

usage() {
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
}
need_int() {  # need_int OPTION VALUE MIN
  [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] \
    || { echo "sample_cpu.sh: $1 needs an integer >= $3, got '$2'" >&2; exit 2; }
}
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --spec) [ -f "${2-}" ] || { echo "sample_cpu.sh: --spec needs a spec file, got '${2-}'" >&2; exit 2; }
            SPEC=$2; shift 2 ;;
    --prompt-len) need_int "$1" "${2-}" 1; PROMPT=$2; shift 2 ;;
    --new-tokens) need_int "$1" "${2-}" 2; NEW=$2; shift 2 ;;
    --rounds) need_int "$1" "${2-}" 1; ROUNDS=$2; shift 2 ;;
    --threads) need_int "$1" "${2-}" 1; THREADS=$2; shift 2 ;;
    --wait-policy) case "${2-}" in active|passive) POLICY=$2 ;; *) echo "sample_cpu.sh: --wait-policy is active or passive, got '${2-}'" >&2; exit 2 ;; esac
                   shift 2 ;;
    --no-pytorch) RUN_PYTORCH=0; shift ;;
    --out) [ -n "${2-}" ] || { echo "sample_cpu.sh: --out needs a file" >&2; exit 2; }
           OUT_JSON=$2; shift 2 ;;
    *) echo "sample_cpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$BUILD/bin/kilnc" ] || { echo "sample_cpu.sh: $BUILD/bin/kilnc not found; build first (scripts/build.sh)" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-sample.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
start=$SECONDS
read -r L H V B T < <("$PY" - "$SPEC" <<'EOF'
import sys, tomllib
s = tomllib.load(open(sys.argv[1], "rb"))
m, c = s["model"], s["compile"]
print(m["n_layer"], m["n_head"], m["vocab_size"], c["batch_size"], c.get("seq_len", m["block_size"]))
EOF
)
if [ $((PROMPT + NEW - 1)) -gt "$T" ]; then  # the last token is sampled, not fed
  echo "sample_cpu.sh: --prompt-len + --new-tokens - 1 = $((PROMPT + NEW - 1)) exceeds seq_len $T (past it both Kiln runs use the forward pass)" >&2
  exit 2
fi
echo "== sample_cpu.sh: $SPEC (L=$L H=$H V=$V, B=$B rows, T=$T), prompt $PROMPT + $NEW new tokens," \
     "$ROUNDS round(s), $THREADS thread(s), OMP_WAIT_POLICY=$POLICY, load average $(cut -d' ' -f1 /proc/loadavg)"
"$BUILD/bin/kilnc" "$SPEC" -o "$TMP/gpt2" > "$TMP/kilnc.log" 2>&1 || { cat "$TMP/kilnc.log" >&2; exit 1; }
"$PY" "$ROOT/scripts/make_synthetic_shard.py" --out "$TMP/data" --vocab-size "$V" --tokens $((B * T + 1)) > /dev/null
"$TMP/gpt2" train --data "$TMP/data/train_000.bin" --steps 1 --lr 0 --save "$TMP/w.safetensors" > "$TMP/train.log" 2>&1 \
  || { cat "$TMP/train.log" >&2; exit 1; }
PROMPT_IDS=$("$PY" -c "import random; random.seed(3); print(' '.join(str(random.randrange($V)) for _ in range($PROMPT)))")

export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS OMP_WAIT_POLICY=$POLICY
# kiln_run [FLAGS...]: seconds per step after the first, from sample's report on stderr.
kiln_run() {
  "$TMP/gpt2" sample --init "$TMP/w.safetensors" --prompt-ids "$PROMPT_IDS" --max-new-tokens "$NEW" \
    --num-samples "$B" --top-k 50 --seed 7 "$@" 2> "$TMP/sample.err" > /dev/null || { cat "$TMP/sample.err" >&2; exit 1; }
  # Seconds per step after the first, and of a round's first step (reading the prompt).
  echo "$(sed -n 's/.* \([0-9.]*\) ms per step.*/\1/p' "$TMP/sample.err" | awk '{ print $1 / 1000 }')" \
       "$(sed -n 's/.*first step (reading the prompt) \([0-9.]*\) ms.*/\1/p' "$TMP/sample.err" | awk '{ print $1 / 1000 }')"
}
declare -a KV FULL TORCH KVP STEPP TORCHP
for r in $(seq 1 "$ROUNDS"); do
  read -r kv kvp < <(kiln_run)
  read -r full _ < <(kiln_run --no-kv-cache)
  read -r _ stepp < <(kiln_run --no-prefill)
  KV+=("$kv"); FULL+=("$full"); KVP+=("$kvp"); STEPP+=("$stepp")
  line=$(printf "   round %d/%d: kiln %.2f ms/step, kiln --no-kv-cache %.2f ms/step; prompt: kiln %.1f ms, kiln --no-prefill %.1f ms" \
    "$r" "$ROUNDS" "$(echo "$kv * 1000" | bc -l)" "$(echo "$full * 1000" | bc -l)" "$(echo "$kvp * 1000" | bc -l)" \
    "$(echo "$stepp * 1000" | bc -l)")
  if [ "$RUN_PYTORCH" = 1 ]; then
    read -r pt ptp < <("$PY" "$ROOT/bench/pytorch_sample.py" --weights "$TMP/w.safetensors" --n-layer "$L" --n-head "$H" \
           --rows "$B" --context "$T" --prompt-len "$PROMPT" --new-tokens "$NEW" --threads "$THREADS" |
         "$PY" -c "import json, sys; j = json.load(sys.stdin); s = j['step_s'][:-1]; print(sum(s) / len(s), j['prefill_s'])")
    TORCH+=("$pt"); TORCHP+=("$ptp")
    line+=$(printf ", pytorch %.2f ms/step, prompt %.1f ms" "$(echo "$pt * 1000" | bc -l)" "$(echo "$ptp * 1000" | bc -l)")
  fi
  echo "$line"
done

"$PY" - "$OUT_JSON" "$B" "$SPEC" "$PROMPT" "$NEW" "$THREADS" "${KV[*]}" "${FULL[*]}" "${TORCH[*]:-}" \
      "${KVP[*]}" "${STEPP[*]}" "${TORCHP[*]:-}" <<'EOF'
import json, os, statistics, sys
out, B, spec, prompt, new, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
def table(title, unit, series, per, first, other):
    """Prints the medians of `series` (seconds per round), `per` items each, and the ratios of
    `other` (when run) and the slow Kiln variant to `first`; returns (rows, medians)."""
    rows = {k: [float(x) for x in v.split()] for k, v in series.items() if v.strip()}
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\n{title}\n{'config':22s} {unit:>9s} {'tokens/s':>9s}  rounds (ms)")
    for k, v in rows.items():
        print(f"{k:22s} {med[k] * 1e3:9.2f} {per / med[k]:9.1f}  " + ", ".join(f"{x * 1e3:.1f}" for x in v))
    names = list(series)
    print(f"\n{names[1] + ' / ' + first:46s} x{med[names[1]] / med[first]:.2f}")
    if other in med:
        print(f"{other + ' / ' + first:46s} x{med[other] / med[first]:.2f}")
    return rows, med


rows, med = table("decoding (one new token per row and step)", "ms/step",
                  {"kiln": sys.argv[7], "kiln --no-kv-cache": sys.argv[8], "pytorch (kv cache)": sys.argv[9]},
                  B, "kiln", "pytorch (kv cache)")
# The prompt: Kiln's first step (the prompt into the caches, then the first token's logits and
# pick), PyTorch's prefill (one causal forward pass over the prompt, the last position's logits).
prows, pmed = table(f"the prompt ({prompt} tokens x {B} rows)", "ms",
                    {"kiln (@prefill)": sys.argv[10], "kiln --no-prefill": sys.argv[11], "pytorch (one pass)": sys.argv[12]},
                    B * prompt, "kiln (@prefill)", "pytorch (one pass)")
os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump({"spec": spec, "rows": B, "prompt_len": prompt, "new_tokens": new, "threads": threads,
               "seconds_per_step": rows, "median": med, "prompt_seconds": prows, "prompt_median": pmed}, f, indent=1)
os.replace(tmp, out)
print(f"\nwrote {out}")
EOF
echo "sample_cpu.sh: done in $((SECONDS - start)) s"
