#!/usr/bin/env bash
# CPU training-step time with and without Kiln's kernel fusion, against PyTorch eager.
#
# A small GPT-2 (L=2 H=4 C=128, GPT-2's 50257-token vocabulary, B=8 T=128, target cpu; fp32, or
# with --precision bf16 Kiln's bf16 mixed precision against PyTorch under bf16 autocast) is
# compiled twice by kilnc: as it compiles by default (fused) and with --no-fusion (unfused). Both
# executables train on one synthetic llm.c shard (scripts/make_synthetic_shard.py) with a constant
# learning rate; bench/pytorch_cpu_step.py runs the same model, step and batches in PyTorch eager
# (torch.optim.AdamW foreach, grad-norm clipping at 1.0) with the same number of threads.
# The three run alternately, --rounds times (the order rotates every round), each a fresh process
# doing --warmup untimed and --steps timed steps; the figure per configuration is the median of
# all its timed steps (Kiln's per-step dt_ms, PyTorch's time of the same work). Prints a table
# (median ms/step, tok/s, best step, per-round medians) and the ratios unfused/fused and
# pytorch/fused: of the pooled medians (the headline), the median of the per-round ratios (paired:
# a round's runs follow each other, so they share the machine's load) and of the best steps; and
# writes every number to bench/results/fusion_cpu.json (git-ignored).
# Other work on the cores shows up as plateaus of 10-30 s in which every step is slower: many
# short rounds interleave more finely than a few long ones (e.g. --rounds 8 --steps 4).
#
# Builds nothing: needs build/bin/kilnc (and kiln-run beside it; kiln-inspect for kernel counts).
# If `kilnc --help` has no --no-fusion, it warns and compiles both variants the same way.
#
# Usage: bench/fusion_cpu.sh [--precision fp32|bf16] [--steps N] [--warmup N] [--rounds N]
#                            [--threads N] [--vocab V] [--out FILE]
#                            [--no-pytorch] [--keep]
# Environment: KILN_BUILD (default build), PYTHON (default /usr/bin/python3: Debian's torch).
# Takes ~3 minutes with the defaults on an idle 2-core machine (more when other work shares
# the cores: the load average is printed and recorded, and high load makes the ratios noisy).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${KILN_BUILD:-$ROOT/build}
PY=${PYTHON:-/usr/bin/python3}
KILNC=$BUILD/bin/kilnc
INSPECT=$BUILD/bin/kiln-inspect

STEPS=6
WARMUP=2
ROUNDS=5
THREADS=$(nproc)
OUT_JSON=
RUN_PYTORCH=1
KEEP=0
PRECISION=fp32
VOCAB=50257

usage() {
  cat <<EOF
Usage: bench/fusion_cpu.sh [OPTIONS]

CPU step time of a small GPT-2 (L=2 H=4 C=128 V=$VOCAB, B=8 T=128): Kiln fused (kilnc's
default), Kiln unfused (kilnc --no-fusion) and PyTorch eager, run alternately.

Options:
  --precision P  fp32 (default) or bf16: Kiln's bf16 mixed precision (fp32 master weights),
                 PyTorch under torch.autocast("cpu", bfloat16)
  --steps N      timed steps per run (default $STEPS)
  --warmup N     untimed steps at the start of every run (default $WARMUP)
  --rounds N     rounds of (kiln-fused, kiln-unfused, pytorch), order rotated (default $ROUNDS)
  --vocab V      vocabulary size (default $VOCAB, GPT-2's; its classifier dominates the step)
  --threads N    threads for all three: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS for Kiln,
                 torch.set_num_threads for PyTorch (default nproc = $(nproc))
  --out FILE     JSON results (default bench/results/fusion_cpu.json; with bf16, fusion_cpu-bf16.json)
  --no-pytorch   time the two Kiln variants only
  --keep         keep the temporary directory (spec, shard, executables, logs)
  -h, --help     this help

Environment: KILN_BUILD (default build), PYTHON (default /usr/bin/python3).
With the defaults: ~3 minutes on an idle 2-core machine (more under load). On a busy
machine, more and shorter rounds interleave more finely (e.g. --rounds 8 --steps 4).
EOF
}

need_int() {  # need_int OPTION VALUE MIN
  [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] \
    || { echo "fusion_cpu.sh: $1 needs an integer >= $3, got '$2'" >&2; exit 2; }
}
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --steps) need_int "$1" "${2-}" 1; STEPS=$2; shift 2 ;;
    --precision) case "${2-}" in fp32|bf16) PRECISION=$2 ;;
                   *) echo "fusion_cpu.sh: --precision needs fp32 or bf16, got '${2-}'" >&2; exit 2 ;; esac
                 shift 2 ;;
    --warmup) need_int "$1" "${2-}" 0; WARMUP=$2; shift 2 ;;
    --rounds) need_int "$1" "${2-}" 1; ROUNDS=$2; shift 2 ;;
    --threads) need_int "$1" "${2-}" 1; THREADS=$2; shift 2 ;;
    --vocab) need_int "$1" "${2-}" 2; VOCAB=$2; shift 2 ;;
    --out) [ -n "${2-}" ] || { echo "fusion_cpu.sh: --out needs a file" >&2; exit 2; }
           OUT_JSON=$2; shift 2 ;;
    --no-pytorch) RUN_PYTORCH=0; shift ;;
    --keep) KEEP=1; shift ;;
    *) echo "fusion_cpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

for f in "$KILNC" "$BUILD/bin/kiln-run"; do
  [ -x "$f" ] || { echo "fusion_cpu.sh: $f not found; build first (scripts/build.sh)" >&2; exit 1; }
done
[ -x "$PY" ] || { echo "fusion_cpu.sh: $PY not found (set PYTHON)" >&2; exit 1; }
if [ "$RUN_PYTORCH" = 1 ]; then
  "$PY" -c 'import torch' 2>/dev/null \
    || { echo "fusion_cpu.sh: $PY cannot import torch (apt-get install python3-torch, or --no-pytorch)" >&2; exit 1; }
fi

if [ -z "$OUT_JSON" ]; then
  OUT_JSON=$ROOT/bench/results/fusion_cpu.json
  [ "$PRECISION" = fp32 ] || OUT_JSON=$ROOT/bench/results/fusion_cpu-$PRECISION.json
fi
mkdir -p "$(dirname "$OUT_JSON")"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-fusion.XXXXXX")
if [ "$KEEP" = 1 ]; then
  trap 'echo "fusion_cpu.sh: kept $TMP" >&2' EXIT
else
  trap 'rm -rf "$TMP"' EXIT
fi
start=$SECONDS
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== fusion_cpu.sh: $PRECISION, $ROUNDS round(s) x ($WARMUP warm-up + $STEPS timed steps), $THREADS thread(s), nproc $(nproc), load average $LOAD_BEFORE"
if awk -v l="${LOAD_BEFORE%% *}" -v n="$(nproc)" 'BEGIN { exit !(l > 0.5 * n) }'; then
  echo "fusion_cpu.sh: warning: the machine is busy (load average ${LOAD_BEFORE%% *} on $(nproc) cores); times will be noisy" >&2
fi

# 1. The spec and the data.
SPEC=$TMP/gpt2-fusion-bench.toml
cat > "$SPEC" <<EOF
# bench/fusion_cpu.sh: a small GPT-2, $PRECISION on the CPU.
[model]
name = "gpt2-fusion-bench"
n_layer = 2
n_head = 4
n_embd = 128
vocab_size = $VOCAB
block_size = 128

[compile]
batch_size = 8
seq_len = 128
precision = "$PRECISION"
target = "cpu"
EOF
B=8; T=128
TOKENS=$(( (WARMUP + STEPS + 1) * B * T + 1 ))   # no run wraps around the shard
DATA=$TMP/data
"$PY" "$ROOT/scripts/make_synthetic_shard.py" --out "$DATA" --vocab-size "$VOCAB" --tokens "$TOKENS" \
  --seed 1337 > "$TMP/shard.log"
DATA_GLOB="$DATA/train_*.bin"

# 2. The two Kiln executables.
FUSION_FLAG=1
KILNC_HELP=$("$KILNC" --help 2>&1 || true)   # captured: grep -q on a pipe could SIGPIPE kilnc
if ! grep -q -- '--no-fusion' <<< "$KILNC_HELP"; then
  FUSION_FLAG=0
  echo "fusion_cpu.sh: warning: '$KILNC --help' has no --no-fusion; kiln-unfused is compiled exactly like kiln-fused" >&2
fi
# compile NAME [FLAGS...]: compile and smoke-test (one step) an executable.
compile() {
  local name=$1; shift
  echo "== kilnc $(basename "$SPEC")${*:+ $*} -o $name"
  if ! "$KILNC" "$SPEC" "$@" -o "$TMP/$name" > "$TMP/$name.compile.log" 2>&1 \
     || ! "$TMP/$name" train --data "$DATA_GLOB" --steps 1 > "$TMP/$name.smoke.log" 2>&1; then
    { cat "$TMP/$name.compile.log" "$TMP/$name.smoke.log" 2>/dev/null || true; } | tail -n 5 >&2
    echo "fusion_cpu.sh: could not compile and run $name" >&2
    exit 1
  fi
}
compile kiln-fused
if [ "$FUSION_FLAG" = 1 ]; then
  compile kiln-unfused --no-fusion
else
  compile kiln-unfused   # no --no-fusion yet: the same as fused
fi
for v in fused unfused; do
  if [ -x "$INSPECT" ]; then
    "$INSPECT" --json "$TMP/kiln-$v" > "$TMP/inspect-$v.json" 2>/dev/null || rm -f "$TMP/inspect-$v.json"
  fi
done
IDENTICAL=0
cmp -s "$TMP/kiln-fused" "$TMP/kiln-unfused" && IDENTICAL=1

# 3. The rounds: kiln-fused, kiln-unfused, pytorch, the starting one rotating.
CONFIGS=(kiln-fused kiln-unfused)
[ "$RUN_PYTORCH" = 1 ] && CONFIGS+=(pytorch)
NC=${#CONFIGS[@]}
run_one() {  # run_one CONFIG ROUND
  local cfg=$1 r=$2 res
  case "$cfg" in
    kiln-*)
      res=$TMP/$cfg-$r.jsonl
      rm -f "$res"
      OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS \
        "$TMP/$cfg" train --data "$DATA_GLOB" --steps $((WARMUP + STEPS)) --lr-schedule constant \
        --log "$res" --print-every $((WARMUP + STEPS)) > "$TMP/$cfg-$r.log" 2>&1 \
        || { echo "fusion_cpu.sh: $cfg failed:" >&2; tail -n 20 "$TMP/$cfg-$r.log" >&2; exit 1; }
      ;;
    pytorch)
      res=$TMP/pytorch-$r.json
      OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS \
        "$PY" "$ROOT/bench/pytorch_cpu_step.py" --spec "$SPEC" --data "$DATA_GLOB" --steps "$STEPS" \
        --warmup "$WARMUP" --threads "$THREADS" --json "$res" > "$TMP/pytorch-$r.log" 2>&1 \
        || { echo "fusion_cpu.sh: pytorch_cpu_step.py failed:" >&2; tail -n 20 "$TMP/pytorch-$r.log" >&2; exit 1; }
      ;;
  esac
  "$PY" - "$cfg" "$res" "$WARMUP" <<'EOF'
import json, statistics, sys
cfg, path, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
if cfg == "pytorch":
    ms = json.load(open(path))["step_ms"]
else:
    ms = [json.loads(l)["dt_ms"] for l in open(path) if l.strip()][warmup:]
print(f"   {cfg:<13} median {statistics.median(ms):8.1f} ms/step over {len(ms)} steps "
      f"(min {min(ms):.1f}, max {max(ms):.1f})")
EOF
}
for r in $(seq 1 "$ROUNDS"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "$load" >> "$TMP/round-loads"
  echo "== round $r/$ROUNDS (load average $load)"
  for i in $(seq 0 $((NC - 1))); do
    run_one "${CONFIGS[$(( (i + r - 1) % NC ))]}" "$r"
  done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# 4. The table and the JSON.
echo
GIT_REV=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
GIT_STATUS=$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null || true)
GIT_DIRTY=0; [ -n "$GIT_STATUS" ] && GIT_DIRTY=1
"$PY" - "$TMP" "$OUT_JSON" "$ROUNDS" "$WARMUP" "$STEPS" "$THREADS" "$FUSION_FLAG" "$IDENTICAL" \
  "$LOAD_BEFORE" "$LOAD_AFTER" "$GIT_REV" "$GIT_DIRTY" "$RUN_PYTORCH" "$SPEC" "$((SECONDS - start))" \
  "$PRECISION" <<'EOF'
import json, os, statistics, sys, time
(tmp, out, rounds, warmup, steps, threads, flag, identical, load_before, load_after, git_rev,
 git_dirty, run_pytorch, spec_path, elapsed, precision) = sys.argv[1:]
rounds, warmup, steps, threads = int(rounds), int(warmup), int(steps), int(threads)
configs = ["kiln-fused", "kiln-unfused"] + (["pytorch"] if run_pytorch == "1" else [])
tokens_per_step = 8 * 128
res, pytorch_meta = {}, None
for c in configs:
    runs = []
    for r in range(1, rounds + 1):
        if c == "pytorch":
            d = json.load(open(f"{tmp}/pytorch-{r}.json"))
            pytorch_meta = {k: v for k, v in d.items() if k not in ("step_ms", "median_ms", "tokens_per_s")}
            runs.append({"step_ms": d["step_ms"], "loss_first": d["loss_first"], "loss_last": d["loss_last"]})
        else:
            lines = [json.loads(l) for l in open(f"{tmp}/{c}-{r}.jsonl") if l.strip()]
            runs.append({"step_ms": [l["dt_ms"] for l in lines[warmup:]],
                         "warmup_ms": [l["dt_ms"] for l in lines[:warmup]],
                         "loss_first": lines[0]["loss"], "loss_last": lines[-1]["loss"]})
    allms = [x for run in runs for x in run["step_ms"]]
    med = statistics.median(allms)
    res[c] = {"median_ms": med, "tokens_per_s": tokens_per_step / (med / 1e3),
              "min_ms": min(allms), "max_ms": max(allms), "timed_steps": len(allms),
              "round_medians_ms": [statistics.median(run["step_ms"]) for run in runs],
              "runs": runs}
fused = res["kiln-fused"]["median_ms"]
ratios = {"unfused/fused": res["kiln-unfused"]["median_ms"] / fused}
if "pytorch" in res:
    ratios["pytorch/fused"] = res["pytorch"]["median_ms"] / fused
kernels = {}
for v in ("fused", "unfused"):
    p = f"{tmp}/inspect-{v}.json"
    if os.path.exists(p):
        kernels[f"kiln-{v}"] = {q["name"]: q["instrs"] for q in json.load(open(p))["programs"]}
spec = open(spec_path).read()
loss_diff = max(abs(a["loss_first"] - b["loss_first"]) for a, b in
                zip(res["kiln-fused"]["runs"], res["kiln-unfused"]["runs"]))

def paired(c):
    return [a / b for a, b in zip(res[c]["round_medians_ms"], res["kiln-fused"]["round_medians_ms"])]
ratios_paired = {"unfused/fused": statistics.median(paired("kiln-unfused"))}
ratios_best = {"unfused/fused": res["kiln-unfused"]["min_ms"] / res["kiln-fused"]["min_ms"]}
if "pytorch" in res:
    ratios_paired["pytorch/fused"] = statistics.median(paired("pytorch"))
    ratios_best["pytorch/fused"] = res["pytorch"]["min_ms"] / res["kiln-fused"]["min_ms"]

rw = max(18, len(", ".join("0000" for _ in range(rounds))))
print(f"precision      {precision}" + (" (Kiln: bf16 mixed precision; PyTorch: bf16 autocast)" if precision == "bf16" else ""))
print(f"{'config':<13} {'median ms/step':>14} {'tok/s':>7} {'best ms':>8}  {'round medians (ms)':<{rw}} {'vs fused':>8}")
for c in configs:
    r = res[c]
    rm = ", ".join(f"{x:.0f}" for x in r["round_medians_ms"])
    print(f"{c:<13} {r['median_ms']:14.1f} {r['tokens_per_s']:7.0f} {r['min_ms']:8.1f}  {rm:<{rw}} "
          f"{r['median_ms'] / fused:7.2f}x")
print()
print(f"{'ratio':<14} {'of medians':>10} {'paired/round':>13} {'of best':>8}")
for k, v in ratios.items():
    print(f"{k:<14} {v:10.3f} {ratios_paired[k]:13.3f} {ratios_best[k]:8.3f}")
if kernels:
    print("kernels        " + "; ".join(
        f"{c}: micro_step {k.get('micro_step', '?')}, optimizer_step {k.get('optimizer_step', '?')}"
        for c, k in kernels.items()))
print(f"step-0 loss    |fused - unfused| = {loss_diff:.2e}"
      + (f"; pytorch {res['pytorch']['runs'][0]['loss_first']:.4f} (its own initialisation)" if "pytorch" in res else ""))
if pytorch_meta:
    b = pytorch_meta["blas"]
    print(f"pytorch        torch {pytorch_meta['torch']}, {pytorch_meta['threads']} thread(s), "
          f"BLAS {'OpenBLAS' if b.get('openblas') else b.get('blas_info')}, oneDNN {b.get('mkldnn')}, "
          f"attention: {pytorch_meta['attention']}")
if flag != "1":
    print("note           kilnc has no --no-fusion yet: kiln-unfused is the same executable as kiln-fused")
elif identical == "1":
    print("note           kilnc --no-fusion produced a byte-identical executable")

doc = {
    "benchmark": "bench/fusion_cpu.sh",
    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "git": {"rev": git_rev, "dirty": git_dirty == "1"},
    "host": {"nproc": os.cpu_count(), "load_before": load_before, "load_after": load_after,
             "load_at_round_start": [float(x) for x in open(f"{tmp}/round-loads").read().split()]},
    "spec": spec,
    "precision": precision,
    "tokens_per_step": tokens_per_step,
    "rounds": rounds, "warmup": warmup, "steps": steps, "threads": threads,
    "no_fusion_flag": flag == "1", "kiln_executables_identical": identical == "1",
    "kernels": kernels,
    "results": res,
    "ratios": ratios,
    "ratios_paired_median_over_rounds": ratios_paired,
    "ratios_of_best_steps": ratios_best,
    "pytorch": pytorch_meta,
    "elapsed_s": int(elapsed),
}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print(f"\nwrote {out}")
EOF
echo "fusion_cpu.sh: done in $((SECONDS - start)) s"
