#!/usr/bin/env bash
# bench/device/check.sh: the one script a device session runs (an NVIDIA GPU machine with CUDA,
# CMake, ninja and PyTorch, but no MLIR and no network), after bench/device/prepare.sh has
# compiled the modules on the build machine. See bench/device/README.md.
#
# Steps, each time-boxed (timeout) inside one budget (--budget, 470 s: the whole stays under 8
# minutes); a step that no longer fits is skipped and reported as such. They run in the order of
# what matters most when the budget runs short: a, b, d's matmul peak, e at B=16, d's torch.compile
# and eager at B=16, c, t, g, s, n, then the larger batches:
#   a) the machine: nvidia-smi -L, driver, nvcc, cmake, ninja, compiler, python, torch
#   b) the runtime: cmake -DKILN_COMPILER=OFF -DKILN_TESTS=OFF into build-dev, ninja kiln-run (and
#      kiln-inspect in g), which alone needs it); if configuring with the machine's own packages fails, again with
#      the carried dependency bundle (bench/device/deps/kiln-build-deps.tar.gz unpacked into
#      /tmp/kiln-deps)
#   c) parity: each bench/device/modules/NAME.kiln with a spec bench/device/specs/NAME.toml
#      (the gpt2-* benchmark modules aside; tiny-bf16, tiny, awkward-bf16 and long-bf16 first): one
#      training step as a probe until one runs; if the runtime runs it, test/e2e/test_parity.py
#      --exe (a wrapper running kiln-run NAME.kiln) against the PyTorch reference (a mismatch again
#      with KILN_CUBLASLT_EPILOGUES=0: Kiln's epilogue kernels instead of cuBLASLt's), and for
#      tiny-cuda and awkward-bf16-cuda test/e2e/test_decode.py --exe (sampling with the key/value
#      caches and without, against PyTorch's logits); if it refuses, "kiln: not available: <its
#      error line>"
#   d) PyTorch (bench/pytorch_gpu_step.py): peak bf16 matmul, eager and torch.compile at B=16 T=1024
#   e) Kiln: kiln-run gpt2-124m-bf16-cuda.kiln train, MFU against the measured matmul peak
#      then, time allowing, the B=32 and B=64 runs (Kiln, eager, compile; an out-of-memory is a result)
#   t) GPT-2 124M on the demo corpus (SOTU): 40 steps with validation and checkpoints, resumed to
#      60 with --save, then samples from the saved weights (scripts/train-demo.sh's GPU path)
#   g) Kiln's per-kernel profile (kiln-run --profile, 3 steps) against each kernel's roofline bound
#      (kiln-inspect --roofline at the measured rates), and causal attention forward +
#      backward per PyTorch SDPA backend (flash, efficient, cudnn) at the benchmark's shape
#   s) compute-sanitizer racecheck and memcheck on one step of long-bf16-cuda.kiln (cuBLASLt not
#      tuned; a race reported in no Kiln kernel is recorded as "library only")
#   n) NCCL with one rank: 3 steps of tiny-bf16-cuda.kiln with --comm nccl (one GPU: no
#      collectives between ranks)
#   f) the table: summary.md (kiln / torch eager / torch.compile: tok/s, ms/step, TFLOP/s, MFU,
#      peak memory; kiln/compile and kiln/eager ratios), results.json, check.log, work.tar.gz
#
# Usage: bash bench/device/check.sh [--dry-run] [--budget S] [--steps N] [--kiln-steps N]
#                                   [--no-build] [--no-parity] [--no-large-batches] [--compile-mode M]
#   --dry-run        no build and no GPU: uses an existing kiln-run (KILN_RUN, build-dev/ or
#                    build/) for the Kiln steps (the refusal path) and runs PyTorch in its --tiny
#                    CPU smoke configuration; for checking the script on the build machine
#   --budget S       seconds for everything (default 470)
#   --steps N        PyTorch timed steps (default 20, after 5 warm-up steps)
#   --kiln-steps N   Kiln steps (default 30; the first 5 are not counted)
#   --no-build       use an existing kiln-run instead of building
#   --no-parity      skip c)     --no-large-batches   skip the B=32 and B=64 runs
#   --compile-mode M torch.compile mode (default, reduce-overhead, max-autotune, ...)
# Environment: OUT (default ./device-out; created), PYTHON (default: the first of python3,
#   /usr/bin/python3 that imports torch), KILN_RUN, KILN_BUILD_DIR (default build-dev),
#   KILN_DEPS_DIR (default /tmp/kiln-deps).
# Writes only five files to $OUT (the device tool returns at most 8): summary.md, results.json,
# check.log (everything printed), work.tar.gz (every log and raw result: the build logs, the
# PyTorch JSON lines, Kiln's JSONL, the parity outputs) and steps.tsv (the steps' results, kept
# as they come: what is left if the script is killed before its table). Exit status 0 unless the script itself
# breaks: what failed is in the summary.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEV=$ROOT/bench/device
BUILD_DIR=${KILN_BUILD_DIR:-$ROOT/build-dev}
DEPS_ROOT=${KILN_DEPS_DIR:-/tmp/kiln-deps}
BUDGET=470
RESERVE=15            # seconds kept for the table and the archive
PARITY_BUDGET=180     # seconds for all of c)
TORCH_STEPS=20
TORCH_WARMUP=5
KILN_STEPS=30
KILN_WARMUP=5
DRY=0
DO_BUILD=1
DO_PARITY=1
DO_B32=1
COMPILE_MODE=default
BENCH=gpt2-124m-bf16-cuda

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
need_int() {  # need_int OPTION VALUE MIN
  if ! [[ "$2" =~ ^[0-9]+$ ]] || [ "$2" -lt "$3" ]; then
    echo "check.sh: $1 needs an integer >= $3, got '$2'" >&2; exit 2
  fi
}
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY=1; shift ;;
    --budget) need_int "$1" "${2-}" 60; BUDGET=$2; shift 2 ;;
    --steps) need_int "$1" "${2-}" 1; TORCH_STEPS=$2; shift 2 ;;
    --kiln-steps) need_int "$1" "${2-}" $((KILN_WARMUP + 1)); KILN_STEPS=$2; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    --no-parity) DO_PARITY=0; shift ;;
    --no-large-batches|--no-b32) DO_B32=0; shift ;;
    --compile-mode) [ -n "${2-}" ] || { echo "check.sh: --compile-mode needs a mode" >&2; exit 2; }
                    COMPILE_MODE=$2; shift 2 ;;
    *) echo "check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [ -z "${OUT:-}" ]; then
  OUT=./device-out
  mkdir -p "$OUT"
  echo '*' > "$OUT/.gitignore"     # the default lands in the checkout: keep it out of git
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT/summary.md" "$OUT/results.json" "$OUT/check.log" "$OUT/work.tar.gz" "$OUT/steps.tsv"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kiln-device.XXXXXX")
# tee ignores the signals that stop the script (a time limit's TERM reaches the whole process
# group): it outlives the script's last lines, so these never meet a closed pipe (SIGPIPE).
exec > >(trap '' TERM INT HUP; exec tee -a "$OUT/check.log") 2>&1
TEE_PID=$!
STEPS_TSV=$WORK/steps.tsv
PARITY_TSV=$WORK/parity.tsv
: > "$STEPS_TSV"
: > "$PARITY_TSV"
cd "$ROOT"

log() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }
# One line for a table cell: no tabs or newlines, paths relative to the checkout, at most 400 chars.
oneline() { tr '\t\n' '  ' | sed "s|$ROOT/||g; s/  */ /g; s/^ //; s/ \$//" | cut -c1-400; }
record() {  # record STEP STATUS SECONDS NOTE
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(printf '%s' "${4-}" | oneline)" >> "$STEPS_TSV"
  # Kept in $OUT as it grows: a kill that leaves finish() no time still returns the steps.
  cp -f "$STEPS_TSV" "$OUT/steps.tsv" 2> /dev/null || true
  log "$1: $2${4:+ - $(printf '%s' "$4" | oneline)}"
}
left() { echo $((BUDGET - SECONDS - RESERVE)); }
# The line that says why a command failed: its last "error" line, else its last line.
err_line() {
  local l
  l=$(grep -a -i -E '(^|[^a-z_])error' "$1" 2>/dev/null | grep -v -i 'warning' | tail -n 1 || true)
  [ -n "$l" ] || l=$(grep -a -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 || true)
  printf '%s' "${l:-no output}" | oneline
}
cmake_err() {  # the first CMake Error and the two lines after it
  if grep -q 'CMake Error' "$1" 2>/dev/null; then
    grep -A3 -m1 'CMake Error' "$1" | oneline
  else
    err_line "$1"
  fi
}
# boxed STEP MAX MIN LOG CMD...: runs CMD with its output in LOG, under timeout min(MAX, what is
# left of the budget); returns CMD's status (124 or 137: timed out), or 200 without running it
# when less than MIN seconds are left (recorded as skipped). Sets LAST_DT.
LAST_DT=0
boxed() {
  local step=$1 max=$2 min=$3 logf=$4 l lim t0 rc=0
  shift 4
  l=$(left)
  if [ "$l" -lt "$min" ]; then
    record "$step" skipped 0 "out of time: ${l} s of the budget left, needs ${min} s"
    LAST_DT=0
    return 200
  fi
  if [ "$max" -lt "$min" ]; then  # a caller's own share (parity's) used up; timeout 0 would not limit
    record "$step" skipped 0 "out of time: ${max} s of its step's share left, needs ${min} s"
    LAST_DT=0
    return 200
  fi
  lim=$max
  [ "$l" -lt "$lim" ] && lim=$l
  log "$step (time box ${lim} s; log ${logf#"$WORK"/})"
  printf '$ %s\n' "$*" > "$logf"
  printf '%s\t%s\n' "$step" "$logf" >> "$WORK/logs.tsv"  # for the log tails of failed steps in summary.md
  t0=$SECONDS
  # In the background and waited for: bash runs a signal's trap (and so finish()) at once, not
  # after the step. timeout puts itself and CMD in a process group of their own, so a kill of
  # this script's group does not reach them: finish() ends that group (the step's job).
  BOX_STEP=$step BOX_T0=$t0
  timeout -k 10 "$lim" "$@" >> "$logf" 2>&1 < /dev/null &
  wait "$!" || rc=$?
  BOX_STEP=""
  LAST_DT=$((SECONDS - t0))
  return "$rc"
}
BOX_STEP="" BOX_T0=0
timed_out() { [ "$1" = 124 ] || [ "$1" = 137 ]; }
jget() {  # jget FILE KEY: a top-level field of a one-line JSON file ("" when absent)
  [ -s "$1" ] || return 0
  "$PY_ANY" -c 'import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
v = d.get(sys.argv[2], "")
print("" if v is None else v)' "$1" "$2" 2>/dev/null || true
}
spec_int() { sed -n "s/^$2 *= *\([0-9][0-9]*\).*/\1/p" "$1" | head -n 1; }

finish() {
  local rc=$?
  trap - EXIT
  set +e
  # tee ignores TERM; were it gone anyway (killed outright), the rest goes to check.log directly
  # rather than ending this shell by SIGPIPE before the table is written. A step still running
  # is stopped.
  trap '' PIPE TERM INT HUP  # (a second signal, or the group's while the table is written)
  kill -0 "$TEE_PID" 2> /dev/null || exec >> "$OUT/check.log" 2>&1
  # The job from jobs -p, not a pid kept in a variable: a signal between the '&' and that
  # assignment would leave the step running after the script.
  local job
  for job in $(jobs -p); do kill -TERM -- "-$job" 2> /dev/null || kill -TERM "$job" 2> /dev/null; done
  if [ -n "$BOX_STEP" ]; then
    record "${BOX_STEP:-step}" stopped "$((SECONDS - BOX_T0))" "the script was signalled (status $rc) while it ran"
  fi
  log "f) the table"
  if [ -n "${PY_ANY:-}" ]; then
    "$PY_ANY" - "$WORK" "$OUT" "$DRY" "$BUDGET" "$SECONDS" "$KILN_WARMUP" "$BENCH" <<'EOF'
import glob, json, math, os, re, statistics, sys, time
work, out, dry, budget, elapsed, kwarm, bench = sys.argv[1:]
kwarm = int(kwarm)

def load_json(p):
    try:
        return json.loads(open(p).read().strip().splitlines()[-1])
    except Exception:
        return None

def read_tsv(p, keys):
    rows = []
    if os.path.exists(p):
        for line in open(p):
            parts = line.rstrip("\n").split("\t")
            rows.append(dict(zip(keys, parts + [""] * (len(keys) - len(parts)))))
    return rows

steps = read_tsv(f"{work}/steps.tsv", ["step", "status", "seconds", "note"])
parity = read_tsv(f"{work}/parity.tsv", ["module", "result", "note"])
info = open(f"{work}/info.txt").read() if os.path.exists(f"{work}/info.txt") else ""
torch_runs = {os.path.basename(p)[:-5]: load_json(p) for p in sorted(glob.glob(f"{work}/torch-*.json"))}
peak = (torch_runs.get("torch-peak") or {}).get("peak_tflops")

def spec_int(path, key):
    try:
        for line in open(path):
            k, _, v = line.partition("=")
            if k.strip() == key:
                return int(v.split("#")[0])
    except OSError:
        pass
    return None

def kiln_run(name):
    """Kiln's row from its JSONL (steps after the first kwarm) or its note."""
    note_p, log_p = f"{work}/{name}.note", f"{work}/{name}.jsonl"
    note = open(note_p).read().strip() if os.path.exists(note_p) else "not run"
    r = {"note": note}
    spec = f"{os.environ.get('KILN_DEV_DIR', '')}/specs/{name.replace('kiln-', '', 1)}.toml"
    if os.path.exists(log_p):
        lines = [json.loads(l) for l in open(log_p) if l.strip()]
        timed = lines[kwarm:] if len(lines) > kwarm else lines
        if timed:
            ms = [l["dt_ms"] for l in timed]
            r.update(step_ms=ms, median_ms=statistics.median(ms),
                     loss_first=lines[0].get("loss"), loss_last=lines[-1].get("loss"),
                     steps_logged=len(lines), steps_counted=len(timed))
    r["spec"] = spec
    return r

def planned_arena_gib(module):
    """The arena kiln-inspect planned for a module (prepare.sh's manifest), in GiB."""
    try:
        for line in open(f"{os.environ.get('KILN_DEV_DIR', '')}/modules/manifest.txt"):
            c = line.rstrip("\n").split("\t")
            if c[0] == module and len(c) >= 5:
                v, unit = c[4].split()
                return float(v) / {"KiB": 2**20, "MiB": 2**10, "GiB": 1}[unit]
    except (OSError, ValueError, KeyError):
        pass
    return None

def held_gib(log):
    """What kiln-run said it held on the GPU ("device memory: X MiB held by Kiln ..."), in GiB."""
    try:
        for line in open(log, errors="replace"):
            if line.startswith("device memory: "):
                return float(line.split()[2]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None

rows, ratios = [], []
for B, suffix in ((16, ""), (32, "-b32"), (64, "-b64")):
    k = kiln_run(f"kiln-{bench}{suffix}")
    e = torch_runs.get(f"torch-eager{suffix}")
    c = torch_runs.get(f"torch-compile{suffix}")
    if not (e or c or os.path.exists(f"{work}/kiln-{bench}{suffix}.note")):
        continue
    ref = next((x for x in (e, c) if x and x.get("flops_per_step")), None)
    spec = k["spec"]
    L, C, V, T, Bk = (spec_int(spec, n) for n in ("n_layer", "n_embd", "vocab_size", "seq_len", "batch_size"))
    kflops = None
    if None not in (L, C, V, T, Bk):
        Vp = -(-V // 128) * 128
        Tmax = spec_int(spec, "block_size") or T
        n = Vp * C + Tmax * C + L * (12 * C * C + 13 * C) + 2 * C
        kflops = 6 * n * Bk * T + 12 * L * C * T * Bk * T
    krow = {"config": "kiln", "B": Bk or B, "T": T}
    if "median_ms" in k:
        ms = k["median_ms"]
        krow.update(ms=ms, tok_s=(Bk * T) / (ms / 1e3), tflops=kflops / (ms / 1e3) / 1e12 if kflops else None,
                    loss_first=k.get("loss_first"), loss_last=k.get("loss_last"))
    krow["note"] = k["note"]
    # From random weights the first loss is about ln(V): far from it, the step computed something
    # else (at B = 64 the logits hold 3.3e9 elements, past 32-bit offsets), whatever its speed.
    lf = k.get("loss_first")
    if lf is not None and V and not abs(lf - math.log(V)) < 1.0:
        krow["note"] += f"; SUSPECT: first loss {lf:.4f} is not near ln(V) = {math.log(V):.4f}"
    held = held_gib(f"{work}/kiln-{bench}{suffix}.log")
    arena = planned_arena_gib(f"{bench}{suffix}.kiln")
    if held is not None:
        krow["mem"] = held
        krow["note"] += "; peak mem = all Kiln allocated on the GPU (arena, workspaces, tables)"
    elif arena is not None:
        krow["mem"] = arena
        krow["note"] += "; peak mem = the arena kiln-inspect planned"
    krow["raw"] = k
    rows.append(krow)
    for label, x in (("torch eager", e), ("torch.compile", c)):
        row = {"config": label, "B": (x or {}).get("B", B), "T": (x or {}).get("T")}
        if x and "median_ms" in x:
            row.update(ms=x["median_ms"], tok_s=x["tokens_per_s"], tflops=x["achieved_tflops"],
                       mem=x.get("peak_memory_gib"), loss_first=x.get("loss_first"), loss_last=x.get("loss_last"))
            if x.get("device") == "cpu":
                row["note"] = "CPU smoke test (--tiny), not a measurement"
            elif label == "torch.compile" and x.get("first_step_s"):
                row["note"] = f"first step {x['first_step_s']:.0f} s (compilation)"
            # The events time the GPU alone, steps queued back to back; Kiln's dt_ms is the host's
            # clock around a step that ends reading its loss. The wall figure is PyTorch's alike.
            if x.get("device") != "cpu" and x.get("mean_ms_wall"):
                wall = f"wall clock {x['mean_ms_wall']:.1f} ms/step on average"
                row["note"] = f"{row['note']}; {wall}" if row.get("note") else wall
        elif x:
            row["note"] = x.get("skipped") or x.get("error") or "no result"
        else:
            row["note"] = "not run"
        rows.append(row)
    kt = krow.get("tok_s")
    et = rows[-2].get("tok_s")
    ct = rows[-1].get("tok_s")
    ratios.append({"B": B, "kiln/torch.compile": kt / ct if kt and ct else None,
                   "kiln/torch eager": kt / et if kt and et else None,
                   "torch.compile/torch eager": ct / et if ct and et else None})
for r in rows:
    if peak and r.get("tflops"):
        r["mfu"] = r["tflops"] / peak

def f(x, fmt):
    return "—" if x is None else format(x, fmt)

gpu = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("gpu:")), "no GPU")
md = [f"# Kiln device check: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {gpu}", ""]
if dry == "1":
    md += ["**Dry run**: no build, no GPU steps; PyTorch ran its --tiny CPU smoke configuration and the "
           "Kiln steps used an existing kiln-run. The numbers below are not measurements.", ""]
md += ["## Training step: GPT-2 124M, bf16 (autocast policy, fp32 master weights and AdamW), T=1024", "",
       "| config | B | tok/s | ms/step | TFLOP/s | MFU | peak mem GiB | note |",
       "|---|---:|---:|---:|---:|---:|---:|---|"]
for r in rows:
    md.append(f"| {r['config']} | {r['B']} | {f(r.get('tok_s'), ',.0f')} | {f(r.get('ms'), '.1f')} | "
              f"{f(r.get('tflops'), '.1f')} | {f(r.get('mfu') and 100 * r['mfu'], '.1f')}{'%' if r.get('mfu') else ''} | "
              f"{f(r.get('mem'), '.1f')} | {r.get('note', '')} |")
md.append("")
for q in ratios:
    md.append(f"- B={q['B']} tok/s ratios: kiln / torch.compile = {f(q['kiln/torch.compile'], '.3f')}, "
              f"kiln / torch eager = {f(q['kiln/torch eager'], '.3f')}, "
              f"torch.compile / torch eager = {f(q['torch.compile/torch eager'], '.3f')}")
md.append("- FLOPs per token, for Kiln and torch alike: 6 x every parameter (the tied wte once) + 12 L C T "
          "(full attention: PaLM's and nanoGPT's rule; against the causal 6 L C T, as llm.c counts, "
          "these MFUs read about 8% high at GPT-2 124M, T=1024)")
pk = torch_runs.get("torch-peak")
if pk and pk.get("peak_tflops"):
    md.append(f"- MFU = achieved / measured peak: bf16 torch.matmul {pk['n']}^3, best of {pk['repeats']} "
              f"x {pk['iters']} products: {pk['peak_tflops']:.1f} TFLOP/s (median {pk['median_tflops']:.1f})"
              + (" [CPU smoke]" if pk.get("device") == "cpu" else ""))
elif pk:
    md.append(f"- peak matmul: {pk.get('error', 'no result')}")
if pk and (pk.get("bandwidth_gbs") or pk.get("bandwidth_error")):
    md.append(f"- memory bandwidth: {pk['copy_bytes'] // 2**20} MiB copied on the {'CPU [CPU smoke]' if pk.get('device') == 'cpu' else 'GPU'}, best of {pk['repeats']} x "
              f"{pk['iters']}: {pk['bandwidth_gbs']:.0f} GB/s (read + write)" if pk.get("bandwidth_gbs")
              else f"- memory bandwidth: {pk['bandwidth_error']}")
ref = next((x for x in torch_runs.values() if x and x.get("flops_formula")), None)
if ref:
    md.append(f"- model FLOPs per step = {ref['flops_formula']}; N_params = {ref['parameters']:,} "
              f"-> {ref['flops_per_step']:.4g} at B={ref['B']} T={ref['T']}")
kl = f"{work}/kiln-{bench}.log"
if os.path.exists(kl):  # what the runtime said at load (e.g. how cuBLASLt's algorithms were chosen)
    for line in open(kl, errors="replace"):
        if line.startswith("note: "):
            md.append(f"- Kiln {line.strip()[:600]}")
md.append(f"- ms/step: median over the timed steps (PyTorch: {next((x['steps'] for x in torch_runs.values() if x and 'steps' in x), '?')} "
          f"after warm-up, CUDA events; Kiln: its dt_ms, the first {kwarm} steps not counted)")
# Kiln's profile (print_profile: kernel, total ms, share, calls, GFLOP/s) and the attention comparison.
def read_profile(path):
    """The rows of kiln-run --profile's table (kernel, total ms, share, calls, GFLOP/s; "-" where
    a row does no arithmetic), each row's FLOPs taken back from its rate."""
    rows, seen_header = [], False
    if os.path.exists(path):
        for line in open(path, errors="replace"):
            if line.startswith("kernel") and "total ms" in line:
                seen_header = True
                continue
            parts = line.rsplit(None, 4)
            if seen_header and len(parts) == 5:
                try:
                    ms = float(parts[1])
                    rows.append({"kernel": parts[0].strip(), "total_ms": ms, "share": parts[2],
                                 "calls": int(parts[3]),
                                 "flops": 0.0 if parts[4] == "-" else float(parts[4]) * 1e6 * ms})
                except ValueError:
                    pass
    return rows

prof = read_profile(f"{work}/kiln-profile.log")
prof16 = read_profile(f"{work}/kiln-profile-rows16.log")  # the forward with 16-row warps
# kiln-inspect --roofline --json (the boxed log: the command line, then the JSON).
roof = None
rp = f"{work}/kiln-roofline.json"
if os.path.exists(rp):
    text = open(rp, errors="replace").read()
    try:
        roof = json.loads(text[text.index("\n{") + 1:]).get("roofline")
    except (ValueError, AttributeError):
        roof = None
if roof and not roof.get("recorded"):
    md += ["", "- roofline: the module records no tensor FLOPs (compiled by an older kilnc: rerun prepare.sh); not used"]
    roof = None
bounds = {k["name"]: k for k in (roof or {}).get("kernels", [])}
if roof:
    rt = roof["rates"]
    # kiln-inspect's defaults are the H200's datasheet: say so where d) measured nothing on another GPU.
    src = rt.get("source", "")
    if "H200" in src and not re.search(r"(?<![A-Za-z])H200(?! NVL)", gpu):
        src += f" (not this GPU's: {gpu})" if gpu != "no GPU" else " (this GPU is not known here)"
    md += ["", f"- roofline (kiln-inspect --roofline: matrix products at {rt['tensor_tflops']:.0f} TFLOP/s, memory at "
           f"{rt['bandwidth_gbs']:.0f} GB/s, other arithmetic at {rt['vector_tflops']:.0f} TFLOP/s; rates: {src}): "
           f"a step of one micro-step takes at least "
           f"{roof['step_bound_ms']:.2f} ms, so MFU is at most {100 * roof['mfu_ceiling']:.1f}%"]
if prof:
    # A product's cuBLASLt call and its generated function are two rows of the profile and one
    # kernel of the roofline: merged here.
    steps_profiled = 3
    merged = {}
    for r in prof:
        m = merged.setdefault(r["kernel"].replace(" (cuBLASLt)", ""), {"total_ms": 0.0, "calls": 0, "flops": 0.0})
        m["total_ms"] += r["total_ms"]
        m["calls"] += r["calls"]
        m["flops"] += r["flops"]
    total = sum(m["total_ms"] for m in merged.values()) / steps_profiled
    md += ["", f"## Kiln: time per kernel (kiln-run --profile: {steps_profiled} steps of B=16 run eagerly, each "
           "kernel between CUDA events), against its roofline bound", "",
           f"| kernel | ms per step | share | calls in {steps_profiled} steps | TFLOP/s | bound ms | bound / measured | limit |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, m in sorted(merged.items(), key=lambda kv: -kv[1]["total_ms"])[:30]:
        b = bounds.get(name)
        per = m["total_ms"] / steps_profiled
        m["bound_ms"] = b["bound_ms"] if b else None
        rate = f"{m['flops'] / (m['total_ms'] * 1e9):.1f}" if m["flops"] > 0 and m["total_ms"] > 0 else "—"
        md.append(f"| {name} | {per:.3f} | {100 * per / total if total else 0:.1f}% | {m['calls']} | {rate} | "
                  + (f"{b['bound_ms']:.3f} | {b['bound_ms'] / per:.2f} | {b['limit']} |" if b and per > 0 else "— | — | |"))
    bound = sum(bounds[n]["bound_ms"] for n in merged if n in bounds)
    flops = sum(m["flops"] for m in merged.values())
    all_rate = f"{flops / (total * steps_profiled * 1e9):.1f}" if total > 0 and flops > 0 else "—"
    md.append(f"| all | {total:.3f} | | | {all_rate} | {bound:.3f} | {bound / total if total else 0:.2f} | |")
att = torch_runs.get("torch-attention")
if att:
    md += ["", f"## Attention, forward + backward, B={att.get('B')} H={att.get('H')} T={att.get('T')} "
           f"head size {att.get('head_size')} ({att.get('dtype')}, causal): ms per layer", "",
           "| implementation | median ms | note |", "|---|---:|---|"]
    def by_name(rows):  # the profile names kernels k<N>_<ops>: summed by <ops>, whatever N is
        out = {}
        for r in rows:
            m = out.setdefault(re.sub(r"^k[0-9]+_", "", r["kernel"]), {"total_ms": 0.0, "calls": 0})
            m["total_ms"] += r["total_ms"]
            m["calls"] += r["calls"]
        return out
    by, by16 = by_name(prof), by_name(prof16)
    if "attention" in by and "attention_grad" in by and by["attention"]["calls"]:
        ms = (by["attention"]["total_ms"] + by["attention_grad"]["total_ms"]) / by["attention"]["calls"]
        md.append(f"| kiln (attention + attention_grad kernels) | {ms:.3f} | from the profile above |")
    for label, b in (("32 query rows per warp (the default)", by), ("16 query rows per warp (kilnc "
                     "--cuda-attention-rows 16)", by16)):
        if "attention" in b and b["attention"]["calls"]:
            md.append(f"| kiln forward alone, {label} | {b['attention']['total_ms'] / b['attention']['calls']:.3f} "
                      "| kiln-run --profile |")
    for name, r in (att.get("backends") or {}).items():
        md.append(f"| torch SDPA {name} | {f(r.get('median_ms'), '.3f')} | {r.get('error', '')} |")
    if att.get("skipped") or att.get("error"):
        md.append(f"| torch SDPA | — | {att.get('skipped') or att.get('error')} |")
# t): GPT-2 124M on the demo corpus: the losses, the resume, the samples.
demo_log = f"{work}/demo/train.jsonl"
demo = {}
if os.path.exists(demo_log):
    recs = []
    for line in open(demo_log, errors="replace"):
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass
    demo["steps"] = recs
    md += ["", "## GPT-2 124M on the demo corpus (t: SOTU, GPT-2 BPE; 40 steps, then resumed from the step-40 "
           "checkpoint to 60; B=16 T=1024, lr 6e-4 after 10 warm-up steps)", "",
           "| step | train loss | val loss | ms | tok/s |", "|---:|---:|---:|---:|---:|"]
    for r in recs:
        if r.get("step") in (0, 9, 19, 29, 39, 49, 59) or "val_loss" in r:
            md.append(f"| {r.get('step', 0) + 1} | {f(r.get('loss'), '.4f')} | {f(r.get('val_loss'), '.4f')} | "
                      f"{f(r.get('dt_ms'), '.1f')} | {f(r.get('tokens_per_s'), '.0f')} |")
    rl = f"{work}/demo-resume.log"
    if os.path.exists(rl):
        md += [f"- {line.strip()}" for line in open(rl, errors="replace") if line.startswith("resuming from")][:1]
    # The resumed run samples while it trains (--sample-every 20): logged with their steps.
    during = [(r["step"] + 1, t) for r in recs for t in r.get("samples", [])]
    if during:
        md += ["", "Samples while training (`train --sample-every 20 --sample-tokens 16`):", "", "```"]
        md += [f"step {st}: {t}"[:500] for st, t in during] + ["```"]
sl = f"{work}/demo-sample.log"
if os.path.exists(sl):
    text = "".join(open(sl, errors="replace").readlines()[1:]).strip()  # the command line aside
    demo["samples"] = text
    md += ["", "Samples (`sample --prompt \"The state of the Union is\" --max-new-tokens 40`):", "", "```",
           text[:3000], "```"]
md += ["", "## Parity (test/e2e/test_parity.py --exe: the module against the PyTorch reference)", "",
       "| module | result | note |", "|---|---|---|"]
md += [f"| {p['module']} | {p['result']} | {p['note']} |" for p in parity] or ["| — | not run | |"]
md += ["", "## Steps", "", "| step | status | s | note |", "|---|---|---:|---|"]
md += [f"| {s['step']} | {s['status']} | {s['seconds']} | {s['note']} |" for s in steps]
# The end of each failed step's log (a build error, a refusal, a traceback): what the steps
# table's one line leaves out, here without unpacking work.tar.gz. One tail per status for the
# parity probes' refusals (the same line for every module).
logs = dict(l.rstrip("\n").split("\t", 1) for l in open(f"{work}/logs.tsv") if "\t" in l) \
    if os.path.exists(f"{work}/logs.tsv") else {}
tails, shown, ntails = [], set(), 0
for s in steps:
    if s["status"] not in ("failed", "FAIL", "timed out", "not available", "out of memory", "stopped"):
        continue
    p = logs.get(s["step"])
    if not p or not os.path.exists(p) or ntails >= 8:
        continue
    if s["step"].startswith("parity-probe-"):
        if s["status"] in shown:
            continue
        shown.add(s["status"])
    ntails += 1
    lines = [l.rstrip()[:300].replace(os.getcwd() + "/", "") for l in open(p, errors="replace") if l.strip()]
    tails += ["", f"### {s['step']} ({s['status']}): the last {min(len(lines), 15)} lines of its log", "", "```"]
    tails += [l.replace("```", "` ` `") for l in lines[-15:]] + ["```"]  # (a fence in the log would end the block)
if tails:
    md += ["", "## Failed steps: the end of each log"] + tails
md += ["", f"Elapsed {elapsed} s of a {budget} s budget. Raw results: results.json; logs: work.tar.gz; "
       "everything printed: check.log.", "", "## Machine", "", "```", info.strip(), "```", ""]
open(f"{out}/summary.md", "w").write("\n".join(md))
doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dry_run": dry == "1",
       "budget_s": int(budget), "elapsed_s": int(elapsed), "machine": info, "steps": steps,
       "table": rows, "ratios": ratios, "parity": parity, "torch": torch_runs, "kiln_profile": prof,
       "kiln_roofline": roof, "demo": demo, "peak_matmul_tflops": peak}
with open(f"{out}/results.json", "w") as fh:
    json.dump(doc, fh, indent=1)
    fh.write("\n")
print("\n".join(md))
EOF
  else
    echo "check.sh: no python3: no summary.md" | tee "$OUT/summary.md"
  fi
  tar -C "$WORK" -czf "$OUT/work.tar.gz" --exclude='*.bin' --exclude='*.safetensors' . 2>/dev/null \
    || echo "check.sh: could not write work.tar.gz"
  log "done: $OUT/{summary.md,results.json,check.log,work.tar.gz} ($(du -sh "$OUT" | cut -f1))"
  rm -rf "$WORK"
  exec >&- 2>&-
  # tee ends at the pipe's end of file; a copy of the pipe that bash saved around a redirected
  # command (when a signal ended one) keeps it open until this shell exits: wait 5 s at most.
  for _ in $(seq 50); do kill -0 "$TEE_PID" 2> /dev/null || break; sleep 0.1; done
  exit "$rc"
}
trap finish EXIT
# A signal ends the script through finish(): the table and the archive are still written. Its
# status is 128 + the signal's number, or 2 when the signal lands while bash 5.2 parses a command
# substitution inside a word ("a $(b)"): it then parses the trap's text as part of that
# substitution, reports "unexpected EOF while looking for matching `)'", and exits with 2 (still
# through finish()).
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP
export KILN_DEV_DIR=$DEV

# --- a) the machine ------------------------------------------------------------------------------
log "a) the machine (dry run: $DRY; budget $BUDGET s; OUT=$OUT)"
PY=""
for c in ${PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && timeout 60 "$c" -c 'import torch' >/dev/null 2>&1; then PY=$c; break; fi
done
PY_ANY=$PY
if [ -z "$PY_ANY" ]; then PY_ANY=$(command -v python3 || command -v /usr/bin/python3 || true); fi
GPU_SMI=0
GPU_TORCH=0
# a) runs outside the steps' time boxes: each probe here has its own (a wedged GPU or driver can
# hang nvidia-smi and CUDA's initialisation, which would leave the whole budget and no table).
SMI_RC=0
timeout -k 5 20 nvidia-smi -L > /dev/null 2>&1 || SMI_RC=$?
[ "$SMI_RC" = 0 ] && GPU_SMI=1
first() { timeout -k 5 20 "$@" 2>&1 | head -n 1 || true; }
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) memory"
  if [ "$GPU_SMI" = 1 ]; then
    { timeout -k 5 20 nvidia-smi -L || echo "(no answer the second time)"; } | sed 's/^/nvidia-smi -L: /'
    echo "nvidia-smi: $(first nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader)"
  elif [ "$SMI_RC" = 124 ] || [ "$SMI_RC" = 137 ]; then
    echo "nvidia-smi: timed out after 20 s (nvidia-smi -L): the GPU or its driver does not answer"
  elif command -v nvidia-smi > /dev/null; then
    echo "nvidia-smi: $(first nvidia-smi -L)"
  else
    echo "nvidia-smi: not found"
  fi
  echo "nvcc: $(if command -v nvcc >/dev/null; then nvcc --version | tail -n 1; elif [ -x /usr/local/cuda/bin/nvcc ]; then /usr/local/cuda/bin/nvcc --version | tail -n 1; else echo not found; fi)"
  echo "cmake: $(first cmake --version)"
  echo "ninja: $(first ninja --version)"
  echo "c++: $(first c++ --version)"
  echo "python: ${PY:-none with torch} ($(first "$PY_ANY" --version))"
  if [ -n "$PY" ]; then
    timeout -k 5 60 "$PY" - <<'EOF' 2>&1 || echo "torch: the probe failed or timed out after 60 s (status $?)"
import torch
print(f"torch: {torch.__version__}, CUDA {torch.version.cuda}, cuda available {torch.cuda.is_available()}, "
      f"compile {hasattr(torch, 'compile')}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"gpu: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, sm_{p.major}{p.minor}")
EOF
  fi
  echo "tree: git $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '(no .git here)')"
  if [ -f "$DEV/modules/manifest.txt" ]; then
    echo "modules: $(head -n 1 "$DEV/modules/manifest.txt" | sed 's/^# //')"
    want=$(sed -n 's/^# schema .* sha256 //p' "$DEV/modules/manifest.txt")
    have=$(sha256sum runtime/schema/module.fbs | cut -d' ' -f1)
    [ "$want" = "$have" ] || echo "modules: WARNING: compiled against another runtime/schema/module.fbs: rerun bench/device/prepare.sh"
  else
    echo "modules: none (run bench/device/prepare.sh on the build machine, and carry bench/device/{specs,modules,data,deps})"
  fi
} > "$WORK/info.txt" 2>&1
grep -q '^torch: .*cuda available True' "$WORK/info.txt" && GPU_TORCH=1
sed 's/^/  /' "$WORK/info.txt"
record info ok "$SECONDS" "GPU: nvidia-smi $GPU_SMI, torch $GPU_TORCH"
GPU_STEPS=1
if [ "$DRY" = 1 ]; then
  GPU_STEPS=0
elif [ "$GPU_SMI" = 0 ] && [ "$GPU_TORCH" = 0 ]; then
  GPU_STEPS=0
  log "no GPU here (nvidia-smi and torch see none): the GPU-only steps are skipped"
fi

# --- b) the runtime -----------------------------------------------------------------------------
log "b) the runtime"
KENV=(env)          # the environment of cmake, ninja and kiln-run (+ the bundle's paths if used)
CONFIGURE=(cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DKILN_COMPILER=OFF -DKILN_TESTS=OFF -DCMAKE_BUILD_TYPE=Release)
use_deps_bundle() {
  rm -rf "$DEPS_ROOT"
  mkdir -p "$DEPS_ROOT"
  tar -xzf "$DEV/deps/kiln-build-deps.tar.gz" -C "$DEPS_ROOT"
  find "$DEPS_ROOT" -name '*.pc' -exec sed -i "s|^prefix=/usr\$|prefix=$DEPS_ROOT/usr|" {} +
  local lib=$DEPS_ROOT/usr/lib/x86_64-linux-gnu
  KENV=(env "PATH=$DEPS_ROOT/usr/bin:$PATH"
            "LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            "PKG_CONFIG_PATH=$lib/pkgconfig:$DEPS_ROOT/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}")
  CONFIGURE+=("-DCMAKE_PREFIX_PATH=$DEPS_ROOT/usr" "-DCMAKE_LIBRARY_PATH=$lib/openblas-pthread")
}
existing_kiln_run() {
  local c
  for c in "${KILN_RUN:-}" "$BUILD_DIR/bin/kiln-run" "$ROOT/build/bin/kiln-run"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
  done
}
# NCCL is not part of the CUDA toolkit. Where the machine has it only inside PyTorch's wheels
# (nvidia/nccl: include/nccl.h and lib/libnccl.so.2, no unversioned libnccl.so for find_library),
# CMake is pointed there; the runtime opens the library by that path.
if [ -n "${PY:-}" ] && [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
  nccl_dir=$(timeout 30 "$PY" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2> /dev/null || true)
  if [ -n "$nccl_dir" ] && [ -f "$nccl_dir/include/nccl.h" ] && [ -f "$nccl_dir/lib/libnccl.so.2" ]; then
    CONFIGURE+=("-DNCCL_INCLUDE_DIR=$nccl_dir/include" "-DNCCL_LIBRARY=$nccl_dir/lib/libnccl.so.2")
    log "NCCL: PyTorch's, in $nccl_dir"
  fi
fi
KILN_RUN_BIN=""
INSPECT_PENDING=0
if [ "$DRY" = 1 ] || [ "$DO_BUILD" = 0 ]; then
  KILN_RUN_BIN=$(existing_kiln_run || true)
  record build skipped 0 "$([ "$DRY" = 1 ] && echo "dry run" || echo "--no-build"): would run: ${CONFIGURE[*]#"$ROOT"/} && ninja -C ${BUILD_DIR#"$ROOT"/} -j$(nproc) kiln-run; kiln-run used: ${KILN_RUN_BIN:-none}"
elif ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  record build failed 0 "cmake or ninja not found"
else
  rc=0
  boxed build-configure 90 20 "$WORK/build-configure.log" "${KENV[@]}" "${CONFIGURE[@]}" || rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != 200 ]; then
    why=$(cmake_err "$WORK/build-configure.log")
    if [ -f "$DEV/deps/kiln-build-deps.tar.gz" ]; then
      record build-configure failed "$LAST_DT" "with this machine's packages: $why; retrying with the carried bundle"
      use_deps_bundle
      rm -rf "$BUILD_DIR"
      rc=0
      boxed build-configure-bundle 90 20 "$WORK/build-configure-bundle.log" "${KENV[@]}" "${CONFIGURE[@]}" || rc=$?
      [ "$rc" = 0 ] || why=$(cmake_err "$WORK/build-configure-bundle.log")
    else
      why="$why (no bench/device/deps/kiln-build-deps.tar.gz carried to retry with)"
    fi
  fi
  if [ "$rc" = 0 ]; then
    cuda_line=$(cat "$WORK"/build-configure*.log 2>/dev/null | grep -a -E -m1 'CUDA backend:|runs cpu modules only' | sed 's/^-- //')
    record build-configure ok "$LAST_DT" "$([ ${#KENV[@]} -gt 1 ] && echo "with the dependency bundle in $DEPS_ROOT" || echo "with this machine's packages"); ${cuda_line:-no CUDA line}"
    rc=0
    boxed build-ninja 300 30 "$WORK/build-ninja.log" "${KENV[@]}" ninja -C "$BUILD_DIR" -j "$(nproc)" kiln-run || rc=$?
    if [ "$rc" = 0 ] && [ -x "$BUILD_DIR/bin/kiln-run" ]; then
      KILN_RUN_BIN=$BUILD_DIR/bin/kiln-run
      record build-ninja ok "$LAST_DT" "$KILN_RUN_BIN"
      INSPECT_PENDING=1  # kiln-inspect is built in g), which alone needs it: the benchmarks first
    elif [ "$rc" != 200 ]; then
      record build-ninja "$(timed_out "$rc" && echo "timed out" || echo failed)" "$LAST_DT" "$(err_line "$WORK/build-ninja.log")"
    fi
  elif [ "$rc" != 200 ]; then
    record build-configure "$(timed_out "$rc" && echo "timed out" || echo failed)" "$LAST_DT" "$why"
  fi
fi
# kiln_refusal LOG: "kiln: not available: <why>" for a run that failed
kiln_refusal() { echo "kiln: not available: $(err_line "$1")"; }
CPU_ONLY_RUNTIME=""   # set to the refusal line once a runtime says it cannot run cuda modules here

# --- d) PyTorch ---------------------------------------------------------------------------------
BENCH_DATA=$DEV/data/gpt2-124m/train_000.bin
DATA_ARGS=()
[ -f "$BENCH_DATA" ] && DATA_ARGS=(--data "$BENCH_DATA")
PEAK=""
PEAK_ARGS=()
# torch_run NAME MAX MIN ARGS...: bench/pytorch_gpu_step.py ARGS --json WORK/NAME.json
torch_run() {
  local name=$1 max=$2 min=$3 rc=0 why
  shift 3
  boxed "$name" "$max" "$min" "$WORK/$name.log" env PYTHONUNBUFFERED=1 "$PY" bench/pytorch_gpu_step.py "$@" \
    --json "$WORK/$name.json" || rc=$?
  [ "$rc" = 200 ] && return 0
  if timed_out "$rc"; then
    record "$name" "timed out" "$LAST_DT" "$(tail -n 1 "$WORK/$name.log" | oneline)"
    printf '{"error": "timed out after %s s"}\n' "$LAST_DT" > "$WORK/$name.json"
  elif [ -n "$(jget "$WORK/$name.json" skipped)" ]; then
    record "$name" skipped "$LAST_DT" "$(jget "$WORK/$name.json" skipped)"
  elif [ "$rc" = 0 ]; then
    if [ -n "$(jget "$WORK/$name.json" peak_tflops)" ] && [ "$name" = torch-peak ]; then
      record "$name" ok "$LAST_DT" "$(printf '%.1f TFLOP/s' "$(jget "$WORK/$name.json" peak_tflops)")"
    else
      record "$name" ok "$LAST_DT" "$(printf '%.1f ms/step, %.0f tok/s' "$(jget "$WORK/$name.json" median_ms)" "$(jget "$WORK/$name.json" tokens_per_s)")"
    fi
  else
    why=$(jget "$WORK/$name.json" error)
    record "$name" "$([ "$rc" = 3 ] && echo "out of memory" || echo failed)" "$LAST_DT" "${why:-$(err_line "$WORK/$name.log")}"
  fi
}
# The steps run in the order of what the issues ask for most, so that a short budget loses the
# least: the matmul peak (for every MFU), Kiln's B=16 step, torch.compile's and eager's, parity,
# the demo corpus, the profile, the sanitizer, then the larger batches.
log "d) PyTorch: the peak bf16 matrix-product rate (every MFU's denominator)"
TORCH_GPU=0   # PyTorch's GPU benchmarks can run here
if [ -z "$PY" ]; then
  record pytorch skipped 0 "no python3 here imports torch (set PYTHON)"
elif [ "$GPU_STEPS" = 0 ]; then
  if [ "$DRY" = 1 ]; then
    log "dry run: PyTorch in its CPU smoke configuration (--device cpu --tiny), not a measurement"
    torch_run torch-peak 60 10 --device cpu --peak-matmul --matmul-size 512 --matmul-iters 2 --matmul-repeats 2
  else
    record pytorch skipped 0 "no GPU: the PyTorch GPU benchmarks need one"
  fi
elif [ "$GPU_TORCH" = 0 ]; then
  record pytorch skipped 0 "torch sees no CUDA device (nvidia-smi does)"
else
  TORCH_GPU=1
  torch_run torch-peak 90 20 --peak-matmul
  PEAK=$(jget "$WORK/torch-peak.json" peak_tflops)
  PEAK_ARGS=()
  [ -n "$PEAK" ] && PEAK_ARGS=(--peak-tflops "$PEAK")
fi

# --- e) Kiln ------------------------------------------------------------------------------------
# kiln_bench NAME MIN: kiln-run bench/device/modules/NAME.kiln train, JSONL in WORK/kiln-NAME.jsonl,
# its row's note in WORK/kiln-NAME.note
kiln_bench() {
  local name=$1 min=$2 mod=$DEV/modules/$1.kiln note=$WORK/kiln-$1.note rc=0 data
  if [ ! -f "$mod" ]; then
    record "kiln-$name" skipped 0 "no $mod (run prepare.sh; carry bench/device/modules)"
    echo "not run: no module" > "$note"; return
  fi
  if [ -z "$KILN_RUN_BIN" ]; then
    record "kiln-$name" skipped 0 "no kiln-run (see the build step)"
    echo "not run: no kiln-run" > "$note"; return
  fi
  if [ -n "$CPU_ONLY_RUNTIME" ] && [ "$name" != "$BENCH" ]; then
    record "kiln-$name" skipped 0 "this runtime cannot run cuda modules here (see kiln-$BENCH)"
    echo "$CPU_ONLY_RUNTIME" > "$note"; return
  fi
  data="$DEV/data/gpt2-124m/train_*.bin"
  if [ ! -f "$BENCH_DATA" ]; then
    data="$WORK/data/train_*.bin"
    # (Guarded: under set -e a failure here would end the script at its first benchmark.)
    [ -f "$WORK/data/train_000.bin" ] || "$PY_ANY" scripts/make_synthetic_shard.py --out "$WORK/data" \
      --vocab-size 50257 --tokens $((16 * 1024 * 10 + 1)) --seed 1337 > "$WORK/shard.log" 2>&1 || true
    if [ ! -f "$WORK/data/train_000.bin" ]; then
      record "kiln-$name" skipped 0 "no data: no $BENCH_DATA carried, and no shard made: $(err_line "$WORK/shard.log")"
      echo "not run: no data" > "$note"; return
    fi
  fi
  local args=(train --data "$data" --steps "$KILN_STEPS" --lr-schedule constant --log "$WORK/kiln-$name.jsonl"
              --print-every 10)
  [ -n "$PEAK" ] && args+=(--peak-tflops "$PEAK")
  boxed "kiln-$name" 150 "$min" "$WORK/kiln-$name.log" "${KENV[@]}" "$KILN_RUN_BIN" "$mod" "${args[@]}" || rc=$?
  if [ "$rc" = 200 ]; then
    echo "not run: out of time" > "$note"
  elif [ "$rc" = 0 ]; then
    echo "$KILN_STEPS steps" > "$note"
    record "kiln-$name" ok "$LAST_DT" "$(grep -a 'tok/s' "$WORK/kiln-$name.log" | tail -n 1)"
  elif timed_out "$rc"; then
    echo "timed out after $LAST_DT s" > "$note"
    record "kiln-$name" "timed out" "$LAST_DT" "$(tail -n 1 "$WORK/kiln-$name.log")"
  elif grep -a -q 'cannot allocate .*: out of memory' "$WORK/kiln-$name.log"; then
    # A batch that does not fit this GPU (B=64 on an 80 GB card, say) is a result, as PyTorch's.
    echo "out of memory: $(err_line "$WORK/kiln-$name.log")" > "$note"
    record "kiln-$name" "out of memory" "$LAST_DT" "$(cat "$note") (exit $rc)"
  else
    kiln_refusal "$WORK/kiln-$name.log" > "$note"
    grep -Eq 'no CUDA GPU is usable|built without CUDA|runs only CPU kernels' "$WORK/kiln-$name.log" && CPU_ONLY_RUNTIME=$(cat "$note")
    record "kiln-$name" "not available" "$LAST_DT" "$(cat "$note") (exit $rc)"
  fi
}
log "e) Kiln"
kiln_bench "$BENCH" 20

# --- d) PyTorch at B=16: torch.compile (the ratio the issue sets a goal for) before eager --------
log "d) PyTorch: torch.compile and eager at B=16"
if [ "$TORCH_GPU" = 1 ]; then
  torch_run torch-compile 300 120 --mode compile --compile-mode "$COMPILE_MODE" -B 16 -T 1024 \
    --steps "$TORCH_STEPS" --warmup "$TORCH_WARMUP" "${DATA_ARGS[@]}" "${PEAK_ARGS[@]}"
  torch_run torch-eager 150 40 --mode eager -B 16 -T 1024 --steps "$TORCH_STEPS" --warmup "$TORCH_WARMUP" \
    "${DATA_ARGS[@]}" "${PEAK_ARGS[@]}"
elif [ -n "$PY" ] && [ "$DRY" = 1 ]; then
  torch_run torch-compile 120 10 --device cpu --tiny --mode compile
  torch_run torch-eager 60 10 --device cpu --tiny --mode eager
fi

# --- c) parity ----------------------------------------------------------------------------------
log "c) parity"
parity_row() { printf '%s\t%s\t%s\n' "$1" "$2" "$(printf '%s' "$3" | oneline)" >> "$PARITY_TSV"; log "parity $1: $2 - $3"; }
# parity_result STEP ROW RC LOG PASS_NOTE: a boxed test's exit status as a step and a parity row
# (its first FAIL line, else its error line, when it failed).
parity_result() {
  local why
  case "$3" in
    0) record "$1" ok "$LAST_DT" "PASS"; parity_row "$2" PASS "$5" ;;
    200) parity_row "$2" skipped "out of time" ;;
    124|137) record "$1" "timed out" "$LAST_DT" ""; parity_row "$2" "timed out" "after $LAST_DT s" ;;
    *) why=$(grep -a -m1 '^FAIL' "$4" || err_line "$4")
       record "$1" FAIL "$LAST_DT" "$why"; parity_row "$2" FAIL "$why" ;;
  esac
}
if [ "$DO_PARITY" = 0 ]; then
  record parity skipped 0 "--no-parity"
elif ! compgen -G "$DEV/specs/*.toml" > /dev/null; then
  record parity skipped 0 "no bench/device/specs/*.toml (run bench/device/prepare.sh; carry bench/device/specs)"
else
  parity_end=$((SECONDS + PARITY_BUDGET))
  # The small configs first, bf16 (the benchmark's precision) before fp32; the rest as they come.
  specs=()
  for name in tiny-bf16-cuda tiny-cuda awkward-bf16-cuda long-bf16-cuda; do
    [ -f "$DEV/specs/$name.toml" ] && specs+=("$DEV/specs/$name.toml")
  done
  for spec in "$DEV"/specs/*.toml; do
    case " ${specs[*]} " in *" $spec "*) ;; *) specs+=("$spec") ;; esac
  done
  probed=0   # the module whose one-step probe ran: the runtime runs cuda modules here, the later ones need none
  for spec in "${specs[@]}"; do
    name=$(basename "$spec" .toml)
    case "$name" in gpt2-*) continue ;; esac          # the benchmark modules: step e)
    mod=$DEV/modules/$name.kiln
    if [ ! -f "$mod" ]; then
      if [ -f "$DEV/modules/$name.kilnc-error" ]; then
        parity_row "$name" "no module" "kilnc failed on the build machine: $(grep -m1 'error' "$DEV/modules/$name.kilnc-error" | sed 's/^loc([^)]*)[^:]*: //')"
      else
        parity_row "$name" "no module" "not in bench/device/modules (run prepare.sh; carry bench/device/modules)"
      fi
      continue
    fi
    if [ -z "$KILN_RUN_BIN" ]; then parity_row "$name" "not run" "no kiln-run (see the build step)"; continue; fi
    d=$WORK/parity-$name
    mkdir -p "$d"
    vocab=$(spec_int "$spec" vocab_size)
    "$PY_ANY" scripts/make_synthetic_shard.py --out "$d/data" --vocab-size "$vocab" --tokens 20000 --seed 1 \
      > "$d/shard.log" 2>&1 || true
    probe_note="probe ran"
    if [ "$probed" != 0 ]; then
      probe_note="not probed ($probed's probe ran)"
    else
      rc=0
      boxed "parity-probe-$name" 60 10 "$d/probe.log" "${KENV[@]}" "$KILN_RUN_BIN" "$mod" train \
        --data "$d/data/train_*.bin" --steps 1 || rc=$?
      if [ "$rc" = 200 ]; then parity_row "$name" skipped "out of time"; continue; fi
      if [ "$rc" != 0 ]; then
        refusal=$(kiln_refusal "$d/probe.log")
        grep -Eq 'no CUDA GPU is usable|built without CUDA|runs only CPU kernels' "$d/probe.log" && CPU_ONLY_RUNTIME=$refusal
        record "parity-probe-$name" "not available" "$LAST_DT" "$refusal"
        parity_row "$name" "kiln: not available" "${refusal#kiln: not available: } (one-step probe, exit $rc)"
        continue
      fi
      record "parity-probe-$name" ok "$LAST_DT" "one training step ran"
      probed=$name
    fi
    if [ "$GPU_STEPS" = 0 ] || [ -z "$PY" ]; then
      parity_row "$name" "$probe_note" "test_parity.py not run ($([ "$DRY" = 1 ] && echo "dry run" || echo "no GPU or no torch"))"
      continue
    fi
    printf '#!/bin/sh\nexec %q %q "$@"\n' "$KILN_RUN_BIN" "$mod" > "$d/kiln-exe"
    chmod +x "$d/kiln-exe"
    max=$((parity_end - SECONDS))
    [ "$max" -gt 150 ] && max=150
    rc=0
    boxed "parity-$name" "$max" 30 "$d/parity.log" "${KENV[@]}" PYTHONUNBUFFERED=1 "$PY" test/e2e/test_parity.py \
      --exe "$d/kiln-exe" --spec "$spec" --workdir "$d/work" --steps 10 || rc=$?
    parity_result "parity-$name" "$name" "$rc" "$d/parity.log" "$(tail -n 1 "$d/parity.log")"
    # A failure again with cuBLASLt's fused epilogues off (Kiln's own bias and GELU kernels): it
    # tells a difference in cuBLASLt's GELU from one in Kiln's kernels. (In bf16 that path rounds
    # each product twice, before and after its epilogue: a near miss may fail there too.)
    if [ "$rc" != 0 ] && grep -a -q '^FAIL' "$d/parity.log"; then  # a numerical mismatch, not an error
      max=$((parity_end - SECONDS))
      [ "$max" -gt 90 ] && max=90
      rc=0
      boxed "parity-$name-plain" "$max" 30 "$d/parity-plain.log" "${KENV[@]}" KILN_CUBLASLT_EPILOGUES=0 \
        PYTHONUNBUFFERED=1 "$PY" test/e2e/test_parity.py --exe "$d/kiln-exe" --spec "$spec" --workdir "$d/work-plain" \
        --steps 10 || rc=$?
      parity_result "parity-$name-plain" "$name (KILN_CUBLASLT_EPILOGUES=0)" "$rc" "$d/parity-plain.log" \
        "$(tail -n 1 "$d/parity-plain.log")"
    fi
    # Sampling with @decode's caches (the decode_attention kernel) and without, against PyTorch.
    case "$name" in tiny-cuda|awkward-bf16-cuda) ;; *) continue ;; esac
    max=$((parity_end - SECONDS))
    [ "$max" -gt 60 ] && max=60
    rc=0
    boxed "decode-$name" "$max" 15 "$d/decode.log" "${KENV[@]}" PYTHONUNBUFFERED=1 "$PY" test/e2e/test_decode.py \
      --exe "$d/kiln-exe" --spec "$spec" --workdir "$d/decode" || rc=$?
    parity_result "decode-$name" "$name sample (kv cache)" "$rc" "$d/decode.log" "$(grep -a '^ok' "$d/decode.log" | head -n 1)"
  done
  record parity finished "" "$(cut -f2 "$PARITY_TSV" | sort | uniq -c | awk '{ $1 = $1 " x"; print }' | paste -sd ';' -)"
fi

# --- t) the training product on the GPU (#8; scripts/train-demo.sh's GPU path, which needs kilnc,
# with the same model compiled on the build machine): GPT-2 124M on the demo corpus (SOTU, GPT-2
# BPE) with validation, checkpoints, a resume from the last one, saved weights, then samples from
# them. The losses, the resume line and the samples go to summary.md.
log "t) GPT-2 124M on the demo corpus"
demo=$WORK/demo
if [ "$GPU_STEPS" = 0 ] || [ -z "$KILN_RUN_BIN" ] || [ -n "$CPU_ONLY_RUNTIME" ]; then
  record demo skipped 0 "no kiln-run that runs cuda modules on a GPU here"
elif [ ! -f "$DEV/data/sotu/train_000.bin" ] || [ ! -f "$DEV/data/tokenizer/vocab.bpe" ] || [ ! -f "$DEV/modules/$BENCH.kiln" ]; then
  record demo skipped 0 "no demo corpus, tokenizer or $BENCH.kiln carried (rerun prepare.sh)"
else
  rm -rf "$demo"
  mkdir -p "$demo"
  targs=(train --data "$DEV/data/sotu/train_*.bin" --val-data "$DEV/data/sotu/val_*.bin" --val-every 20
         --val-steps 4 --lr 6e-4 --warmup-steps 10 --checkpoint-dir "$demo/checkpoints" --checkpoint-every 20
         --print-every 10 --log "$demo/train.jsonl")
  [ -n "$PEAK" ] && targs+=(--peak-tflops "$PEAK")
  rc=0
  boxed demo-train 90 30 "$WORK/demo-train.log" "${KENV[@]}" "$KILN_RUN_BIN" "$DEV/modules/$BENCH.kiln" \
    "${targs[@]}" --steps 40 || rc=$?
  if [ "$rc" = 0 ]; then
    record demo-train ok "$LAST_DT" "40 steps, checkpoints at 20 and 40"
    rc=0
    boxed demo-resume 90 20 "$WORK/demo-resume.log" "${KENV[@]}" "$KILN_RUN_BIN" "$DEV/modules/$BENCH.kiln" \
      "${targs[@]}" --steps 60 --resume --save "$demo/gpt2-124m.safetensors" \
      --sample-every 20 --sample-tokens 16 --tokenizer "$DEV/data/tokenizer" --sample-prompt "The state of the Union is" || rc=$?
    if [ "$rc" = 0 ]; then
      record demo-resume ok "$LAST_DT" "$(grep -a -m1 '^resuming from' "$WORK/demo-resume.log" | oneline)"
      rc=0
      boxed demo-sample 60 10 "$WORK/demo-sample.log" "${KENV[@]}" "$KILN_RUN_BIN" "$DEV/modules/$BENCH.kiln" \
        sample --init "$demo/gpt2-124m.safetensors" --tokenizer "$DEV/data/tokenizer" \
        --prompt "The state of the Union is" --max-new-tokens 40 --num-samples 2 --seed 7 || rc=$?
      if [ "$rc" = 0 ]; then record demo-sample ok "$LAST_DT" "2 samples in summary.md"
      elif [ "$rc" != 200 ]; then
        record demo-sample "$(timed_out "$rc" && echo "timed out" || echo failed)" "$LAST_DT" "$(err_line "$WORK/demo-sample.log") (exit $rc)"
      fi
    elif [ "$rc" != 200 ]; then
      record demo-resume "$(timed_out "$rc" && echo "timed out" || echo failed)" "$LAST_DT" "$(err_line "$WORK/demo-resume.log") (exit $rc)"
    fi
  elif [ "$rc" != 200 ]; then
    record demo-train "$(timed_out "$rc" && echo "timed out" || echo failed)" "$LAST_DT" "$(err_line "$WORK/demo-train.log") (exit $rc)"
  fi
  rm -rf "$demo/checkpoints" "$demo/gpt2-124m.safetensors"  # gigabytes: not for work.tar.gz
fi

# --- g) where Kiln's step goes; attention against PyTorch's SDPA backends -----------------------
# kiln-run --profile: 3 steps of the benchmark module run eagerly, each kernel's GPU time taken
# between CUDA events (summary.md lists the largest rows, each against its roofline bound from
# kiln-inspect); pytorch_gpu_step.py --attention: causal SDPA forward + backward per backend
# (flash, efficient, cudnn) at the same shape, the numbers for choosing between Kiln's attention
# kernels and cuDNN's.
log "g) Kiln's per-kernel profile; attention backends"
pdata="$DEV/data/gpt2-124m/train_*.bin"
[ -f "$BENCH_DATA" ] || pdata="$WORK/data/train_*.bin"
if [ -n "$KILN_RUN_BIN" ] && [ -z "$CPU_ONLY_RUNTIME" ] && [ -f "$DEV/modules/$BENCH.kiln" ]; then
  rc=0
  boxed kiln-profile 90 25 "$WORK/kiln-profile.log" "${KENV[@]}" "$KILN_RUN_BIN" "$DEV/modules/$BENCH.kiln" \
    train --data "$pdata" --steps 3 --lr-schedule constant --profile || rc=$?
  if [ "$rc" = 0 ]; then record kiln-profile ok "$LAST_DT" "3 steps, per-kernel table in summary.md"
  elif timed_out "$rc"; then record kiln-profile "timed out" "$LAST_DT" "$(tail -n 1 "$WORK/kiln-profile.log" | oneline)"
  elif [ "$rc" != 200 ]; then record kiln-profile failed "$LAST_DT" "$(err_line "$WORK/kiln-profile.log") (exit $rc)"; fi
else
  record kiln-profile skipped 0 "no kiln-run that runs cuda modules here"
fi
# kiln-inspect (no MLIR either) is built here, not in b): the steps before need only kiln-run.
if [ "$INSPECT_PENDING" = 1 ] && [ -f "$DEV/modules/$BENCH.kiln" ]; then
  rc=0
  boxed build-inspect 120 20 "$WORK/build-inspect.log" "${KENV[@]}" ninja -C "$BUILD_DIR" -j "$(nproc)" kiln-inspect || rc=$?
  if [ "$rc" = 0 ]; then record build-inspect ok "$LAST_DT" "$BUILD_DIR/bin/kiln-inspect"
  elif [ "$rc" != 200 ]; then record build-inspect failed "$LAST_DT" "$(err_line "$WORK/build-inspect.log")"; fi
fi
# Each kernel's least time at this GPU's measured rates (matmul peak and copy bandwidth from d)),
# for the profile's "bound / measured" column.
inspect=${KILN_RUN_BIN:+$(dirname "$KILN_RUN_BIN")/kiln-inspect}
if [ -n "$inspect" ] && [ -x "$inspect" ] && [ -f "$DEV/modules/$BENCH.kiln" ]; then
  rates=()
  [ -n "$PEAK" ] && rates+=(--peak-tflops "$PEAK")
  bw=$(jget "$WORK/torch-peak.json" bandwidth_gbs)
  [ -n "$bw" ] && rates+=(--bandwidth-gbs "$bw")
  rc=0
  boxed kiln-roofline 30 5 "$WORK/kiln-roofline.json" "$inspect" "$DEV/modules/$BENCH.kiln" --roofline --json \
    "${rates[@]}" || rc=$?
  if [ "$rc" = 0 ]; then record kiln-roofline ok "$LAST_DT" "kiln-inspect --roofline ${rates[*]}"
  elif [ "$rc" != 200 ]; then record kiln-roofline failed "$LAST_DT" "$(err_line "$WORK/kiln-roofline.json") (exit $rc)"; fi
else
  record kiln-roofline skipped 0 "no kiln-inspect beside kiln-run, or no $BENCH.kiln"
fi
if [ -n "$PY" ] && [ "$GPU_TORCH" = 1 ] && [ "$GPU_STEPS" = 1 ]; then
  torch_run torch-attention 90 20 --attention -B 16 -T 1024
elif [ -n "$PY" ] && [ "$DRY" = 1 ]; then
  torch_run torch-attention 60 10 --device cpu --tiny --attention
fi
# The attention forward with 16-row warps (prepare.sh's -rows16 module), for its profile row
# beside the default's 32: the numbers behind kilnc's choice.
if [ -n "$KILN_RUN_BIN" ] && [ -z "$CPU_ONLY_RUNTIME" ] && [ "$GPU_STEPS" = 1 ] && [ -f "$DEV/modules/$BENCH-rows16.kiln" ]; then
  rc=0
  boxed kiln-profile-rows16 60 20 "$WORK/kiln-profile-rows16.log" "${KENV[@]}" "$KILN_RUN_BIN" \
    "$DEV/modules/$BENCH-rows16.kiln" train --data "$pdata" --steps 3 --lr-schedule constant --profile || rc=$?
  if [ "$rc" = 0 ]; then record kiln-profile-rows16 ok "$LAST_DT" "the attention row in summary.md's attention table"
  elif [ "$rc" != 200 ]; then
    record kiln-profile-rows16 "$(timed_out "$rc" && echo "timed out" || echo failed)" "$LAST_DT" "$(err_line "$WORK/kiln-profile-rows16.log") (exit $rc)"
  fi
fi

# --- s) compute-sanitizer on the real GPU: racecheck (shared-memory hazards between threads, e.g.
# in the attention kernels' cp.async pipeline, which the CPU emulation can only provoke) and
# memcheck (out-of-bounds and misaligned accesses), one eager step of long-bf16-cuda.kiln (several
# attention tiles) on the shard its parity probe used.
log "s) compute-sanitizer"
SAN=$(command -v compute-sanitizer || true)
[ -z "$SAN" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && SAN=/usr/local/cuda/bin/compute-sanitizer
san_mod=$DEV/modules/long-bf16-cuda.kiln
san_data="$WORK/parity-long-bf16-cuda/data/train_*.bin"
if ! compgen -G "$san_data" > /dev/null && [ -f "$DEV/specs/long-bf16-cuda.toml" ] && [ -n "$PY_ANY" ]; then
  "$PY_ANY" scripts/make_synthetic_shard.py --out "$WORK/parity-long-bf16-cuda/data" --tokens 20000 --seed 1 \
    --vocab-size "$(spec_int "$DEV/specs/long-bf16-cuda.toml" vocab_size)" > /dev/null 2>&1 || true
fi
if [ "$GPU_STEPS" = 0 ] || [ -z "$KILN_RUN_BIN" ] || [ -n "$CPU_ONLY_RUNTIME" ]; then
  record sanitizer skipped 0 "no kiln-run that runs cuda modules on a GPU here"
elif [ -z "$SAN" ]; then
  record sanitizer skipped 0 "no compute-sanitizer on PATH or in /usr/local/cuda/bin"
elif [ ! -f "$san_mod" ] || ! compgen -G "$san_data" > /dev/null; then
  record sanitizer skipped 0 "no long-bf16-cuda module or shard (see parity)"
else
  for tool in racecheck memcheck; do
    rc=0
    # KILN_CUBLASLT_TUNE=0: no timing of cuBLASLt's candidates at load (each one instrumented too).
    boxed "sanitizer-$tool" 60 20 "$WORK/sanitizer-$tool.log" "${KENV[@]}" KILN_CUDA_GRAPHS=0 KILN_CUBLASLT_TUNE=0 \
      "$SAN" --tool "$tool" --error-exitcode 9 "$KILN_RUN_BIN" "$san_mod" train --data "$san_data" --steps 1 || rc=$?
    summary=$(grep -a -E '(ERROR|RACECHECK) SUMMARY' "$WORK/sanitizer-$tool.log" | tail -n 1 | oneline || true)
    # Kiln's kernels are k<N>_<ops> (generated) and kiln_<what> (support); a race reported in none
    # of them is inside a library's kernel (cuBLASLt's), not Kiln's. (A bad access there is still
    # a FAIL: the descriptors and buffers it was given are Kiln's.)
    ours=$(grep -a -c -E '^=+ .*(k[0-9]+_[a-z0-9_]+|kiln_[a-z_]+)' "$WORK/sanitizer-$tool.log" || true)
    case "$rc" in
      0) record "sanitizer-$tool" ok "$LAST_DT" "${summary:-no summary line}" ;;
      200) ;;
      124|137) record "sanitizer-$tool" "timed out" "$LAST_DT" "${summary:-}" ;;
      9) if [ "$tool" = racecheck ] && [ "${ours:-0}" = 0 ]; then
           record "sanitizer-$tool" "library only" "$LAST_DT" "${summary:-} (no report names a Kiln kernel: see sanitizer-$tool.log in work.tar.gz)"
         else
           record "sanitizer-$tool" FAIL "$LAST_DT" "${summary:-} ($ours report lines name Kiln kernels; sanitizer-$tool.log in work.tar.gz)"
         fi ;;
      *) record "sanitizer-$tool" FAIL "$LAST_DT" "${summary:-$(err_line "$WORK/sanitizer-$tool.log")} (exit $rc; the hazards are in work.tar.gz: sanitizer-$tool.log)" ;;
    esac
  done
fi

# --- n) NCCL, one rank: the runtime opens NCCL, makes a one-rank communicator over the TCP
# bootstrap and trains 3 steps of tiny-bf16-cuda.kiln through it. (One GPU: NCCL refuses two ranks
# on one device, so the collectives between ranks cannot run here.)
log "n) NCCL, one rank"
nccl_mod=$DEV/modules/tiny-bf16-cuda.kiln
if [ "$GPU_STEPS" = 0 ] || [ -z "$KILN_RUN_BIN" ] || [ -n "$CPU_ONLY_RUNTIME" ]; then
  record nccl-one-rank skipped 0 "no kiln-run that runs cuda modules on a GPU here"
elif [ ! -f "$nccl_mod" ] || [ ! -f "$DEV/specs/tiny-bf16-cuda.toml" ] || [ -z "$PY_ANY" ]; then
  record nccl-one-rank skipped 0 "no tiny-bf16-cuda module and spec (run prepare.sh), or no python3"
elif grep -a -q 'NCCL not found' "$WORK"/build-configure*.log 2> /dev/null; then
  record nccl-one-rank skipped 0 "the runtime was built without NCCL: CMake found no nccl.h and libnccl (not in the CUDA toolkit, nor in PyTorch's nvidia/nccl)"
else
  "$PY_ANY" scripts/make_synthetic_shard.py --out "$WORK/nccl/data" --tokens 20000 --seed 1 \
    --vocab-size "$(spec_int "$DEV/specs/tiny-bf16-cuda.toml" vocab_size)" > /dev/null 2>&1 || true
  rc=0
  boxed nccl-one-rank 60 15 "$WORK/nccl-one-rank.log" "${KENV[@]}" NCCL_DEBUG=VERSION RANK=0 WORLD_SIZE=1 \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$((30000 + RANDOM % 20000)) "$KILN_RUN_BIN" "$nccl_mod" train \
    --data "$WORK/nccl/data/train_*.bin" --steps 3 --print-every 1 --comm nccl || rc=$?
  case "$rc" in
    0) record nccl-one-rank ok "$LAST_DT" "$(grep -a -m 1 -o 'NCCL version [^ ]*' "$WORK/nccl-one-rank.log" || echo "NCCL"); $(grep -a 'step *3/3' "$WORK/nccl-one-rank.log" | cut -d'|' -f1-2 | oneline)" ;;
    200) ;;
    124|137) record nccl-one-rank "timed out" "$LAST_DT" "$(tail -n 1 "$WORK/nccl-one-rank.log" | oneline)" ;;
    *) record nccl-one-rank FAIL "$LAST_DT" "$(err_line "$WORK/nccl-one-rank.log") (exit $rc)" ;;
  esac
fi

# --- the B=32 and B=64 runs, time allowing: Kiln's first (short), then PyTorch eager, then compile
if [ "$DO_B32" = 0 ]; then
  record large-batches skipped 0 "--no-large-batches"
elif [ "$GPU_STEPS" = 0 ]; then
  record large-batches skipped 0 "$([ "$DRY" = 1 ] && echo "dry run" || echo "no GPU")"
else
  log "B=32 and B=64, time allowing"
  for b in 32 64; do kiln_bench "$BENCH-b$b" 20; done
  if [ -n "$PY" ] && [ "$GPU_TORCH" = 1 ]; then
    for b in 32 64; do
      torch_run "torch-eager-b$b" 150 60 --mode eager -B "$b" -T 1024 --steps "$TORCH_STEPS" \
        --warmup "$TORCH_WARMUP" "${DATA_ARGS[@]}" "${PEAK_ARGS[@]}"
    done
    for b in 32 64; do
      torch_run "torch-compile-b$b" 300 150 --mode compile --compile-mode "$COMPILE_MODE" -B "$b" -T 1024 \
        --steps "$TORCH_STEPS" --warmup "$TORCH_WARMUP" "${DATA_ARGS[@]}" "${PEAK_ARGS[@]}"
    done
  fi
fi
# f) in finish(), on exit.
