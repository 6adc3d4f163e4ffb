"""Checks train --profile --log's record: LOG ERR INSPECT_JSON FIRST LAST WARM."""
import json
import re
import sys

log, err, inspect, first, last, warm = sys.argv[1:]
records = [json.loads(line) for line in open(log) if line.strip()]
assert "profile" in records[-1] and "step" not in records[-1], records[-1]
assert all("profile" not in r for r in records[:-1]), "a profile record before the last line"
p = records[-1]["profile"]
assert p["steps"] == [int(first), int(last)], p["steps"]
assert p["warm_up_included"] == (warm == "true"), p["warm_up_included"]
# The table on stderr: its rows, in its order, with the same calls and times (each rounded to the
# microsecond on its own: %.3f of the binary value and the record's rounding may differ by one unit).
text = open(err).read().split("GFLOP/s\n", 1)[1]
table = [l.split() for l in text.splitlines() if re.match(r"^\S+ +[0-9.]+ +[0-9.]+% +[0-9]+ +\S+$", l)]
assert [r[0] for r in table] == [k["kernel"] for k in p["kernels"]], (table, p["kernels"])
for row, k in zip(table, p["kernels"]):
    assert int(row[3]) == k["calls"] and abs(float(row[1]) - k["total_ms"]) <= 1e-3 + 1e-9, (row, k)
    # GFLOP/s: the record's FLOPs over the row's time (3 significant digits, at most; "-": none)
    if k["flops"] == 0:
        assert row[4] == "-", (row, k)
    else:
        # (the record's time is rounded to the microsecond: the rate lies between those of its ends)
        low = k["flops"] / ((k["total_ms"] + 5e-4) * 1e6)
        high = k["flops"] / ((k["total_ms"] - 5e-4) * 1e6) if k["total_ms"] > 5e-4 else float("inf")
        assert 0.99 * low - 0.05 <= float(row[4]) <= 1.01 * high + 0.05, (row, k, low, high)
# Every k<N>_<ops> row is a symbol kiln-inspect --json names.
symbols = set()
def walk(v):
    if isinstance(v, dict):
        for key, x in v.items():
            if key == "symbol" and isinstance(x, str): symbols.add(x)
            walk(x)
    elif isinstance(v, list):
        for x in v: walk(x)
walk(json.load(open(inspect)))
kernels = [k["kernel"] for k in p["kernels"] if re.match(r"^k[0-9]+_", k["kernel"])]
assert kernels and all(k in symbols for k in kernels), (kernels, sorted(symbols))
# A kernel's FLOPs: kiln-inspect's count for it, times its launches in the training programs,
# times the steps profiled (one micro-step each). The built-in products count 2MNK a call.
count = {k["symbol"]: k for k in json.load(open(inspect))["kernels"]}
steps = int(last) - int(first) + 1
for row in p["kernels"]:
    if row["kernel"] in count:
        c = count[row["kernel"]]
        launches = sum(n for prog, n in c["launches"].items() if prog in ("micro_step", "optimizer_step"))
        assert row["flops"] == c["flops"] * launches * steps and row["calls"] == launches * steps, (row, c, steps)
matmul = next(k for k in p["kernels"] if k["kernel"] == "Matmul")
assert matmul["flops"] > 0 and matmul["flops"] % (2 * matmul["calls"]) == 0, matmul
print(f"profile record: steps [{first}, {last}], warm-up {warm}, rows as the table's, kernels named as kiln-inspect's")
