#!/usr/bin/env bash
# CPU evaluation time per batch (the forward pass and its mean loss, no backward): Kiln's `eval`
# against PyTorch eager under torch.no_grad(), on the same model and batches.
#
# The spec is the small GPT-2 of bench/fusion_cpu.sh (L=2 H=4 C=128, GPT-2's 50257-token
# vocabulary, B=8 T=128, target cpu), or --spec FILE. kilnc compiles it twice, as it compiles by
# default and with --no-fusion; one training step of the first writes the weights both evaluate
# (the time of a forward pass does not depend on the values). bench/pytorch_cpu_step.py --eval
# runs the same model's forward under torch.no_grad(). --exe NAME=PATH adds an executable
# compiled elsewhere from the same spec (by an older kilnc, say) as one more configuration.
# The configurations run alternately, --rounds times (the order rotates every round), each a
# fresh process evaluating --batches batches; its figure is the mean ms per batch over all of
# them (the first, cold one included, for every configuration alike: Kiln's `eval --json`
# seconds, PyTorch's per-batch times). Prints the median over the rounds per configuration and
# the ratios to Kiln's default, and writes every number to bench/results/eval_cpu.json
# (git-ignored).
#
# Usage: bench/eval_cpu.sh [--precision fp32|bf16] [--spec FILE] [--batches N] [--rounds N]
#                          [--threads N] [--exe NAME=PATH]... [--out FILE] [--no-pytorch] [--keep]
# Environment: KILN_BUILD (default build), PYTHON (default /usr/bin/python3: Debian's torch).
# About 2 minutes with the defaults on an idle 2-core machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${KILN_BUILD:-$ROOT/build}
PY=${PYTHON:-/usr/bin/python3}
KILNC=$BUILD/bin/kilnc

PRECISION=fp32
SPEC_IN=
BATCHES=10
ROUNDS=5
THREADS=$(nproc)
OUT_JSON=$ROOT/bench/results/eval_cpu.json
RUN_PYTORCH=1
KEEP=0
EXTRA=()

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
need_int() {  # need_int OPTION VALUE MIN
  [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] \
    || { echo "eval_cpu.sh: $1 needs an integer >= $3, got '$2'" >&2; exit 2; }
}
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --precision) case "${2-}" in fp32|bf16) PRECISION=$2 ;;
                   *) echo "eval_cpu.sh: --precision needs fp32 or bf16, got '${2-}'" >&2; exit 2 ;; esac
                 shift 2 ;;
    --spec) [ -f "${2-}" ] || { echo "eval_cpu.sh: --spec: '${2-}' is not a file" >&2; exit 2; }
            SPEC_IN=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    --batches) need_int "$1" "${2-}" 1; BATCHES=$2; shift 2 ;;
    --rounds) need_int "$1" "${2-}" 1; ROUNDS=$2; shift 2 ;;
    --threads) need_int "$1" "${2-}" 1; THREADS=$2; shift 2 ;;
    --exe) [[ "${2-}" =~ ^[A-Za-z0-9_.-]+=.+ ]] && [ -x "${2#*=}" ] \
             || { echo "eval_cpu.sh: --exe needs NAME=PATH of an executable, got '${2-}'" >&2; exit 2; }
           case "${2%%=*}" in kiln|kiln-unfused|pytorch|data|w.safetensors|weights.log|shard.log|gpt2-eval-bench.toml)
             echo "eval_cpu.sh: --exe: the name '${2%%=*}' is taken (kiln, kiln-unfused, pytorch and the run's files)" >&2
             exit 2 ;; esac
           EXTRA+=("$2"); shift 2 ;;
    --out) [ -n "${2-}" ] || { echo "eval_cpu.sh: --out needs a file" >&2; exit 2; }
           OUT_JSON=$2; shift 2 ;;
    --no-pytorch) RUN_PYTORCH=0; shift ;;
    --keep) KEEP=1; shift ;;
    *) echo "eval_cpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$KILNC" ] || { echo "eval_cpu.sh: $KILNC not found; build first (scripts/build.sh)" >&2; exit 1; }
if [ "$RUN_PYTORCH" = 1 ]; then
  "$PY" -c 'import torch' 2>/dev/null \
    || { echo "eval_cpu.sh: $PY cannot import torch (apt-get install python3-torch, or --no-pytorch)" >&2; exit 1; }
fi
mkdir -p "$(dirname "$OUT_JSON")"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-eval.XXXXXX")
if [ "$KEEP" = 1 ]; then trap 'echo "eval_cpu.sh: kept $TMP" >&2' EXIT; else trap 'rm -rf "$TMP"' EXIT; fi
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== eval_cpu.sh: $ROUNDS round(s) x $BATCHES batches, $THREADS thread(s), load average $LOAD_BEFORE"

# 1. The spec and the data (enough tokens that no run wraps around the shard).
SPEC=$TMP/gpt2-eval-bench.toml
if [ -n "$SPEC_IN" ]; then
  cp "$SPEC_IN" "$SPEC"
else
  cat > "$SPEC" <<EOF
# bench/eval_cpu.sh: a small GPT-2, $PRECISION on the CPU.
[model]
name = "gpt2-eval-bench"
n_layer = 2
n_head = 4
n_embd = 128
vocab_size = 50257
block_size = 128

[compile]
batch_size = 8
seq_len = 128
precision = "$PRECISION"
target = "cpu"
EOF
fi
read -r B T V < <("$PY" -c 'import sys, tomllib; s = tomllib.load(open(sys.argv[1], "rb")); m, c = s["model"], s.get("compile", {})
print(c.get("batch_size", 1), c.get("seq_len", m["block_size"]), m["vocab_size"])' "$SPEC")
DATA=$TMP/data
"$PY" "$ROOT/scripts/make_synthetic_shard.py" --out "$DATA" --vocab-size "$V" --tokens $(((BATCHES + 2) * B * T + 1)) \
  --seed 1337 > "$TMP/shard.log"
DATA_GLOB="$DATA/train_*.bin"

# 2. The executables and the weights.
for v in "kiln:" "kiln-unfused:--no-fusion"; do
  name=${v%%:*} flags=${v#*:}
  echo "== kilnc $(basename "$SPEC") $flags -o $name"
  # shellcheck disable=SC2086  # (flags: none or one word)
  "$KILNC" "$SPEC" $flags -o "$TMP/$name" > "$TMP/$name.compile.log" 2>&1 \
    || { tail -n 5 "$TMP/$name.compile.log" >&2; echo "eval_cpu.sh: kilnc failed" >&2; exit 1; }
done
"$TMP/kiln" train --data "$DATA_GLOB" --steps 1 --save "$TMP/w.safetensors" > "$TMP/weights.log" 2>&1 \
  || { tail -n 5 "$TMP/weights.log" >&2; echo "eval_cpu.sh: could not write the weights" >&2; exit 1; }
CONFIGS=(kiln kiln-unfused)
for e in "${EXTRA[@]}"; do
  ln -s "$(cd "$(dirname "${e#*=}")" && pwd)/$(basename "${e#*=}")" "$TMP/${e%%=*}"
  CONFIGS+=("${e%%=*}")
done
[ "$RUN_PYTORCH" = 1 ] && CONFIGS+=(pytorch)

# 3. The rounds: one process per configuration, the starting one rotating.
NC=${#CONFIGS[@]}
for ((r = 0; r < ROUNDS; r++)); do
  for ((i = 0; i < NC; i++)); do
    cfg=${CONFIGS[$(((r + i) % NC))]}
    if [ "$cfg" = pytorch ]; then
      OMP_NUM_THREADS=$THREADS "$PY" "$ROOT/bench/pytorch_cpu_step.py" --eval --spec "$SPEC" --data "$DATA_GLOB" \
        --steps "$BATCHES" --warmup 0 --threads "$THREADS" --json "$TMP/pytorch-$r.json" > "$TMP/pytorch-$r.log" 2>&1 \
        || { tail -n 10 "$TMP/pytorch-$r.log" >&2; echo "eval_cpu.sh: pytorch_cpu_step.py --eval failed" >&2; exit 1; }
    else
      OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS "$TMP/$cfg" eval --init "$TMP/w.safetensors" \
        --data "$DATA_GLOB" --batches "$BATCHES" --json > "$TMP/$cfg-$r.json" 2> "$TMP/$cfg-$r.log" \
        || { tail -n 10 "$TMP/$cfg-$r.log" >&2; echo "eval_cpu.sh: $cfg eval failed" >&2; exit 1; }
    fi
  done
  echo "   round $((r + 1))/$ROUNDS done"
done

# 4. The table and the JSON.
"$PY" - "$TMP" "$OUT_JSON" "$ROUNDS" "$BATCHES" "$THREADS" "$LOAD_BEFORE" "$B" "$T" "${CONFIGS[@]}" <<'EOF'
import json, statistics, sys
tmp, out, rounds, batches, threads, load, B, T, *configs = sys.argv[1:]
rounds, batches, B, T = int(rounds), int(batches), int(B), int(T)
res = {}
for c in configs:
    per = []
    for r in range(rounds):
        d = json.loads(open(f"{tmp}/{c}-{r}.json").read().strip().splitlines()[-1])
        per.append({"ms": statistics.mean(d["step_ms"]), "loss": d["loss_first"]} if c == "pytorch"
                   else {"ms": 1e3 * d["seconds"] / d["batches"], "loss": d["loss"]})
    res[c] = {"ms_per_batch_rounds": [p["ms"] for p in per], "ms_per_batch": statistics.median(p["ms"] for p in per),
              "loss": per[-1]["loss"]}
base = res["kiln"]["ms_per_batch"]
print(f"\n{'config':<14} {'ms/batch':>9} {'tok/s':>9} {'vs kiln':>8}  rounds (ms/batch)")
for c, x in res.items():
    x["tokens_per_s"] = B * T / (x["ms_per_batch"] / 1e3)
    x["ratio_to_kiln"] = x["ms_per_batch"] / base
    print(f"{c:<14} {x['ms_per_batch']:>9.1f} {x['tokens_per_s']:>9.0f} {x['ratio_to_kiln']:>7.2f}x  "
          + " ".join(f"{m:.1f}" for m in x["ms_per_batch_rounds"]))
print(f"(vs kiln: ms per batch over Kiln's default; PyTorch's loss is of its own random weights)")
json.dump({"rounds": rounds, "batches": batches, "threads": int(threads), "load_before": load, "B": B, "T": T,
           "configs": res}, open(out, "w"), indent=1)
print(f"wrote {out}")
EOF
