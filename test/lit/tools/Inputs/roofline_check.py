"""Checks kiln-inspect's roofline (--json) against its own figures and the module's buffers.

usage: roofline_check.py REPORT.json
Each row's limit is the slowest of its three times at the report's rates (memory, then tensor,
then vector on a tie); rows come slowest first; the rows' times add up to the step's, which is
its programs' sum; each program's memory- and vector-bound shares are its rows of that limit;
the MFU ceilings divide the model's FLOPs (and the executed products) by the step's time at the
tensor rate; zero_grads writes every gradient once, a clear each, and global_norm reads every
gradient in 2 launches, 2 FLOPs a value; a kernel's row counts its launches and FLOPs. Prints one line of figures when all hold.
"""
import json
import math
import sys

j = json.load(open(sys.argv[1]))
r = j["roofline"]
rates = r["rates"]
T, V, B = rates["tensor_tflops"] * 1e12, rates["vector_tflops"] * 1e12, rates["bandwidth_gbs"] * 1e9


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-18)


rows = r["kernels"]
limits = {}
for k in rows:
    t, v, m = k["tensor_flops"] / T, k["vector_flops"] / V, k["bytes"] / B
    want = "memory" if m >= t and m >= v else "tensor" if t >= v else "vector"
    assert k["limit"] == want, (k, t, v, m)
    # A row of one launch site takes its slowest time (more sites: at least that).
    assert k["bound_ms"] * 1e-3 >= max(t, v, m) * (1 - 1e-9), (k, t, v, m)
    if sum(k["runs"].values()) == 1:
        assert close(k["bound_ms"] * 1e-3, max(t, v, m)), (k, t, v, m)
    limits[k["limit"]] = limits.get(k["limit"], 0) + 1
bounds = [k["bound_ms"] for k in rows]
assert bounds == sorted(bounds, reverse=True), bounds

programs = r["programs"]
assert list(programs) == ["zero_grads", "micro_step", "optimizer_step"], list(programs)
step = sum(p["bound_ms"] for p in programs.values())
assert close(r["step_bound_ms"], step), (r["step_bound_ms"], step)
assert close(sum(bounds), step), (sum(bounds), step)
for name, p in programs.items():
    mine = [k for k in rows if name in k["runs"]]
    assert all(len(k["runs"]) == 1 for k in mine), mine
    assert close(p["bound_ms"], sum(k["bound_ms"] for k in mine)), (name, p)
    assert close(p["tensor_ms"], sum(k["tensor_flops"] for k in mine) / T * 1e3), (name, p)
    assert close(p["memory_ms"], sum(k["bytes"] for k in mine) / B * 1e3), (name, p)
    for limit in ("memory", "vector"):
        share = sum(k["bound_ms"] for k in mine if k["limit"] == limit)
        assert close(p[limit + "_bound_kernels_ms"], share), (name, limit, p, share)

model = j["flops"]["rule_6nd_plus_attention"]
assert r["model_flops_per_micro_step"] == model
step_s = step * 1e-3
assert close(r["mfu_ceiling"], model / (step_s * T)), r["mfu_ceiling"]
assert close(r["mfu_ceiling_micro_step_only"], model / (programs["micro_step"]["bound_ms"] * 1e-3 * T))
assert close(r["tensor_busy_ceiling"], sum(k["tensor_flops"] for k in rows) / (step_s * T))

grads = [b for b in j["buffers"]["list"] if b["kind"] == "Gradient"]
grad_bytes = sum(b["bytes"] for b in grads)
grad_values = sum(math.prod(b["shape"]) for b in grads)
by_name = {k["name"]: k for k in rows}
zero, norm = by_name["zero_grads"], by_name["global_norm"]
assert (zero["launches"], zero["bytes"], zero["vector_flops"]) == (len(grads), grad_bytes, 0), zero
assert (norm["launches"], norm["bytes"], norm["vector_flops"]) == (2, grad_bytes, 2 * grad_values), norm
# A kernel's row: its launches per run and (attention aside: its FLOPs count the products by the
# convention, the tensor cores execute more) its FLOPs, products and the rest, at every run.
kernels = {k["symbol"]: k for k in j["kernels"]}
checked = 0
for k in rows:
    if k["name"] not in kernels:
        continue
    spec, runs = kernels[k["name"]], sum(k["runs"].values())
    assert k["launches"] == spec["launches_per_run"] * runs, (k, spec)
    if not k["kind"].startswith("attention"):
        assert close(k["tensor_flops"] + k["vector_flops"], spec["flops"] * runs), (k, spec)
        checked += 1
print("roofline consistent: %d rows (%s), %d gradients of %d bytes, FLOPs of %d kernels" %
      (len(rows), ", ".join("%s %d" % kv for kv in sorted(limits.items())), len(grads), grad_bytes, checked))
