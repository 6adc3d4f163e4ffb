"""Checks weights a run initialised itself (saved before any update) against the semantics doc:
every weight matrix and both embeddings ~ N(0, 0.02), the residual projections ~ N(0, 0.02 /
sqrt(2 L)), biases 0, layernorm weights 1 and biases 0. Each normal tensor's standard deviation
must be within 5% of the doc's (the tensors here have at least 4096 values: a standard error of
at most 1.1%), its mean within 4 standard errors of 0, and its excess kurtosis within 0.3 of a
normal's 0 (a uniform one has -1.2). Prints one line per kind; exit 1 on any failure.
Usage: init_stats.py WEIGHTS.safetensors N_LAYER"""
import json
import math
import struct
import sys

import numpy as np

path, L = sys.argv[1], int(sys.argv[2])
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
header.pop("__metadata__", None)
tensors = {k.removeprefix("transformer."): np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], "<f4")
           for k, v in header.items() if k != "lm_head.weight"}
failed = 0


def report(kind, ok, what):
    global failed
    failed += not ok
    print(("ok   " if ok else "FAIL ") + kind + ": " + what)


proj = 0.02 / math.sqrt(2 * L)
groups = {"normal 0.02": [], "normal 0.02/sqrt(2L)": [], "ones": [], "zeros": []}
for name, t in tensors.items():
    if name.endswith("c_proj.weight"):
        groups["normal 0.02/sqrt(2L)"].append(name)
    elif name.endswith(".weight") and (name.startswith("ln_") or ".ln_" in name):
        groups["ones"].append(name)
    elif name.endswith(".weight"):
        groups["normal 0.02"].append(name)
    else:
        groups["zeros"].append(name)
for kind, want in (("normal 0.02", 0.02), ("normal 0.02/sqrt(2L)", proj)):
    stds, worst = [], ""
    for name in groups[kind]:
        t = tensors[name].astype(np.float64)
        std, mean = t.std(), t.mean()
        kurt = ((t - mean) ** 4).mean() / std ** 4 - 3
        stds.append(std / want)
        if not (abs(std / want - 1) <= 0.05 and abs(mean) <= 4 * want / math.sqrt(t.size) and abs(kurt) <= 0.3):
            worst = f"; {name}: std {std:.5f}, mean {mean:.2e}, excess kurtosis {kurt:.2f}"
    report(kind, bool(groups[kind]) and not worst,
           f"{len(groups[kind])} tensors, std/{want:.5f} in [{min(stds, default=0):.3f}, {max(stds, default=0):.3f}]{worst}")
for kind, value in (("ones", 1.0), ("zeros", 0.0)):
    bad = [name for name in groups[kind] if not np.all(tensors[name] == value)]
    report(kind, bool(groups[kind]) and not bad, f"{len(groups[kind])} tensors all {value:g}" + (f"; not: {bad}" if bad else ""))
sys.exit(1 if failed else 0)
