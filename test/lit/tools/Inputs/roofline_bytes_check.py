"""Recomputes the bytes of kiln-inspect's roofline rows (--json) from the module itself.

usage: roofline_bytes_check.py SCHEMA MODULE REPORT.json
A Kernel instruction moves every operand once (numel x dtype size); an output holding state the
kernel updates in place without reading it as an input (a gradient, a parameter's value, an AdamW
moment) is read and written: twice; its workspace (cuda_scratch_bytes) once. A kernel's clearing
row moves its zero_operands once, a launch each. Rows add up over micro_step and optimizer_step.
Prints how many rows hold, the read-and-written operands by buffer kind, the clears and the
workspace.
"""
import json
import sys
from collections import Counter

import module_json

schema, module, report = sys.argv[1:4]
d = module_json.load(schema, module)
rows = {r["name"]: r for r in json.load(open(report))["roofline"]["kernels"]}

SIZE = {"F32": 4, "I32": 4, "BF16": 2}
UPDATED = ("Gradient", "Parameter", "AdamM", "AdamV")
kernels, buffers = d["kernels"], d["buffers"]


def operand_bytes(k, i):
    return k["operand_numel"][i] * SIZE[k["operand_dtype"][i]]


want = Counter()
clears = Counter()  # clearing rows' launches
twice = Counter()
scratch = 0
for p in d["programs"]:
    if p["name"] not in ("micro_step", "optimizer_step"):
        continue
    for ins in p["instrs"]:
        if ins.get("op") != "Kernel":
            continue
        k = kernels[ins.get("ints", [0])[0]]
        ins_in, ins_out = ins.get("inputs", []), ins.get("outputs", [])
        b = sum(operand_bytes(k, i) for i in range(len(k["operand_numel"])))
        for o, buf in enumerate(ins_out):
            kind = buffers[buf].get("kind", "Activation")  # flatc leaves a default out
            if kind in UPDATED and buf not in ins_in:
                b += operand_bytes(k, len(ins_in) + o)
                twice[kind] += 1
        b += k.get("cuda_scratch_bytes", 0)
        scratch += k.get("cuda_scratch_bytes", 0)
        want[k["symbol"]] += b
        if k.get("zero_operands"):
            want[k["symbol"] + " (clear)"] += sum(operand_bytes(k, z) for z in k["zero_operands"])
            clears[k["symbol"] + " (clear)"] += len(k["zero_operands"])

for name, b in want.items():
    assert rows[name]["bytes"] == b, (name, rows[name]["bytes"], b)
for name, n in clears.items():
    assert rows[name]["launches"] == n, (name, rows[name]["launches"], n)
print("roofline bytes: %d rows as the operands give; read and written: %s; %d clears in %d rows; workspace %d bytes" %
      (len(want), ", ".join("%s %d" % kv for kv in sorted(twice.items())), sum(clears.values()), len(clears), scratch))
