"""Checks a GPU run's --profile FLOPs: PROFILE_JSONL INSPECT_JSON STEPS.

Each kernel's rows (its cuBLASLt product, its functions, its clearing) add up to kiln-inspect's
count for it times its launches in the training programs and the steps profiled; a product's row
holds its 2MNK and the rest of the kernel's count goes to its function (to the product's row
where cuBLASLt's epilogue does it all)."""
import json
import re
import sys

log, inspect, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = json.loads(open(log).read().splitlines()[-1])["profile"]
count = {k["symbol"]: k for k in json.load(open(inspect))["kernels"]}
def training_launches(k):
    """The kernel's launches in the profiled steps (its training programs' runs)."""
    return sum(n for prog, n in k["launches"].items() if prog in ("micro_step", "optimizer_step")) * steps

merged, parts, checked = {}, {}, 0
for row in p["kernels"]:
    name, part = re.match(r"^(\S+)(?: \((cuBLASLt|clear|epilogue)\))?$", row["kernel"]).groups()
    merged[name] = merged.get(name, 0) + row["flops"]
    parts.setdefault(name, {})[part] = row
for name, rows in parts.items():
    if name not in count:
        continue
    k = count[name]
    launches = training_launches(k)
    if "cuBLASLt" in rows:
        m, n, kk = (int(re.search(f" {d}=([0-9]+)", k["cublaslt"]).group(1)) for d in "MNK")
        alone = set(rows) <= {"cuBLASLt", "clear"}
        want = k["flops"] * launches if alone else 2 * m * n * kk * launches
        assert rows["cuBLASLt"]["flops"] == want, (rows, k)
    if "clear" in rows:
        assert rows["clear"]["flops"] == 0, rows
for name, flops in merged.items():
    if name in count:
        k = count[name]
        launches = training_launches(k)
        assert flops == k["flops"] * launches, (name, flops, k["flops"], launches)
        checked += 1
    else:
        assert name in ("reduce_gradients", "wait_gradients", "global_norm"), name
print(f"flops of {checked} kernels as kiln-inspect counts them")
