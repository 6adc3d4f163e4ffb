#!/usr/bin/env bash
# The main job: compile a small GPT-2 and train it on CPU for a few minutes, with progress.
# Until the corpus lands it trains on a generated token shard with learnable structure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
out=build/demo
mkdir -p "$out"
spec=models/gpt2-mini.toml
vocab=$(awk -F= '/^vocab_size/{gsub(/ /,"",$2); print $2}' "$spec")
[ -f "$out/data/train_000.bin" ] ||
  /usr/bin/python3 scripts/make_synthetic_shard.py --out "$out/data" --vocab-size "$vocab" \
    --tokens 2000000 --seed 1
build/bin/kilnc "$spec" -o "$out/gpt2"
build/bin/kiln-inspect "$out/gpt2"
"$out/gpt2" train --data "$out/data/train_*.bin" --steps "${STEPS:-300}" --lr 1e-3 \
  --warmup-steps 20 --log "$out/train.jsonl" --save "$out/gpt2-mini.safetensors" --print-every 10
echo "log: $out/train.jsonl   weights: $out/gpt2-mini.safetensors"
