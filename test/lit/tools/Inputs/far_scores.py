"""Writes two variants of a GPT-2's weights whose attention scores differ by one constant per row,
for sample-far-scores.test: in every layer q is c_attn's bias alone (its weight columns 0, the bias
A in every channel), so that a score is (A / sqrt(hs)) times the sum of k's channels; k's bias is
-K in every channel (FAR: every score lowered by A K sqrt(hs)) or 0 (NEAR). k's weights and v are
left as they are. Softmax does not see the shift: both give the same logits.
Usage: far_scores.py IN FAR NEAR A K"""
import sys

from safetensors_edit import Weights

src, far, near, a, k = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
for out, kb in ((far, -k), (near, 0.0)):
    w = Weights(src)
    layers = sorted({n.split(".")[2] for n in w.header if n.startswith("transformer.h.")})
    for i in layers:
        name = f"transformer.h.{i}.attn.c_attn."
        C = w.header[name + "bias"]["shape"][0] // 3
        for r in range(C):
            for c in range(C):
                w.put(name + "weight", r * 3 * C + c, 0.0)
        for c in range(C):
            w.put(name + "bias", c, a)
            w.put(name + "bias", C + c, kb)
    w.write(out)
