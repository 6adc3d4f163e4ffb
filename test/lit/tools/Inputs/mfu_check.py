"""Recovers the FLOPs per token behind a training log's MFU column (mfu * peak / tokens_per_s)
and prints them with what llm.c's count gives for the model: 6 N + 12 L C T, N every parameter
(embeddings included), from the model's dimensions alone.
Usage: mfu_check.py LOG PEAK_TFLOPS VOCAB BLOCK N_LAYER N_EMBD SEQ_LEN"""
import json
import sys

log, peak = sys.argv[1], float(sys.argv[2]) * 1e12
V, P, L, C, T = (int(x) for x in sys.argv[3:8])
n = V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C
want = 6 * n + 12 * L * C * T
for line in open(log):
    r = json.loads(line)
    got = r["mfu"] * peak / r["tokens_per_s"]
    # mfu and tokens_per_s are logged to 6 significant digits each.
    print(f"step {r['step']}: {'ok' if abs(got - want) <= 2e-5 * want else 'FAIL'} {got:.6g} FLOPs per token, "
          f"llm.c's count {want}")
