#!/usr/bin/env bash
# CPU ranks sharing one machine: two TCP ranks of a compiled spec (default models/gpt2-mini.toml)
# as kiln-run starts them now (each takes half the CPUs: OMP_NUM_THREADS unset) against the same
# two ranks with every CPU each (OMP_NUM_THREADS=$(nproc), what they ran with before), and one
# process for scale. Same data (a synthetic shard), same steps; the runs alternate --rounds times
# and the figure is the median of each run's median step time (the first step left out). Prints
# ms/step and the ratio, and how far apart the two-rank runs' losses are (the BLAS rounds a
# product otherwise with another thread count: the last bits, not the training).
#
# Usage: bench/ranks_cpu_threads.sh [--spec FILE] [--steps N] [--rounds N]   (each N at least 2;
#        the first step of a run is left out of its times)
# Environment: KILN_BUILD (default build), PYTHON (default /usr/bin/python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${KILN_BUILD:-$ROOT/build}
PY=${PYTHON:-/usr/bin/python3}
SPEC=$ROOT/models/gpt2-mini.toml
STEPS=8
ROUNDS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --spec) SPEC=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ranks_cpu_threads.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
for n in "$STEPS" "$ROUNDS"; do
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] || { echo "ranks_cpu_threads.sh: --steps and --rounds need an integer >= 2" >&2; exit 2; }
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kiln-ranks-threads.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
vocab=$(sed -n 's/^vocab_size *= *\([0-9]*\).*/\1/p' "$SPEC" | head -n 1)
"$BUILD/bin/kilnc" "$SPEC" -o "$WORK/gpt2" > /dev/null
"$PY" "$ROOT/scripts/make_synthetic_shard.py" --out "$WORK/data" --vocab-size "$vocab" --tokens 400000 --seed 1 > /dev/null
CPUS=$(nproc)

# run TAG WORLD [VAR=VALUE...]: WORLD ranks (1: one process) of $STEPS steps; rank 0's log in TAG.jsonl
run() {
  local tag=$1 world=$2
  shift 2
  local port=$((20000 + RANDOM % 20000)) pids=()
  rm -f "$WORK/$tag".*.jsonl  # train appends to a log
  for ((r = 0; r < world; r++)); do
    local dp=()
    [ "$world" -gt 1 ] && dp=(RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port)
    env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS "${dp[@]}" "$@" "$WORK/gpt2" train --data "$WORK/data/train_*.bin" \
      --steps "$STEPS" --seed 1 --total-batch $((2 * $(sed -n 's/^batch_size *= *\([0-9]*\).*/\1/p' "$SPEC") * \
      $(sed -n 's/^seq_len *= *\([0-9]*\).*/\1/p' "$SPEC"))) --print-every 1000 \
      --log "$WORK/$tag.$r.jsonl" > "$WORK/$tag.$r.out" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "ranks_cpu_threads.sh: $tag failed:" >&2; cat "$WORK/$tag".*.out >&2; exit 1; }; done
  # The median step time of this run, its first step left out.
  "$PY" -c 'import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]; print(statistics.median(x["dt_ms"] for x in r[1:]))' \
    "$WORK/$tag.0.jsonl" >> "$WORK/$tag.ms"
  cp "$WORK/$tag.0.jsonl" "$WORK/$tag.last.jsonl"
}

for ((i = 0; i < ROUNDS; i++)); do
  run shared 2
  run every_cpu 2 OMP_NUM_THREADS="$CPUS"
  run alone 1
done
"$PY" - "$WORK" "$CPUS" <<'EOF'
import json, statistics, sys
work, cpus = sys.argv[1], int(sys.argv[2])
ms = {t: statistics.median(float(x) for x in open(f"{work}/{t}.ms")) for t in ("shared", "every_cpu", "alone")}
losses = {t: [json.loads(l)["loss"] for l in open(f"{work}/{t}.last.jsonl") if l.strip()] for t in ("shared", "every_cpu")}
rows = [(f"2 ranks, {max(1, cpus // 2)} thread(s) each (the default)", ms["shared"]),
        (f"2 ranks, {cpus} threads each (OMP_NUM_THREADS={cpus})", ms["every_cpu"]),
        (f"1 process, {cpus} threads, the same tokens", ms["alone"])]
width = max(len(name) for name, _ in rows)
for name, value in rows:
    print(f"{name + ':':<{width + 1}} {value:8.1f} ms/step")
dloss = max(abs(a - b) for a, b in zip(losses["shared"], losses["every_cpu"]))
print(f"ratio: sharing the CPUs is {ms['every_cpu'] / ms['shared']:.2f}x the speed of every CPU each; "
      f"max |dloss| between them {dloss:.1e} over {len(losses['shared'])} steps")
sys.exit(0 if dloss < 1e-3 else 1)
EOF
