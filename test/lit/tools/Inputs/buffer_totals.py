"""Checks kiln-inspect's buffer totals against its own buffer list (--json) and prints them.

usage: buffer_totals.py REPORT.json VERIFY.txt REPORT.txt
The totals by kind and by dtype count every buffer that is not an activation, and the activations
live in the program whose live buffers add up to the most bytes (activations_of); the plan check
names the same buffer count; the text report's "by dtype" line shows the JSON's bytes.
"""
import json
import re
import sys

j = json.load(open(sys.argv[1]))
b = j["buffers"]
lst = b["list"]
assert b["count"] == len(lst), (b["count"], len(lst))

# The program whose live buffers take the most bytes (the first of equals).
per_program = {}
for buf in lst:
    for live in buf["live"]:
        per_program[live["program"]] = per_program.get(live["program"], 0) + buf["bytes"]
most = None
for name, total in per_program.items():
    if most is None or total > per_program[most]:
        most = name
assert b["activations_of"] == most, (b["activations_of"], most, per_program)

by_kind, by_dtype = {}, {}
for i, buf in enumerate(lst):
    if buf["kind"] != "Activation" or any(l["program"] == most for l in buf["live"]):
        by_kind[buf["kind"]] = by_kind.get(buf["kind"], 0) + buf["bytes"]
        by_dtype[buf["dtype"]] = by_dtype.get(buf["dtype"], 0) + buf["bytes"]
assert b["bytes_by_kind"] == by_kind, (b["bytes_by_kind"], by_kind)
assert b["bytes_by_dtype"] == by_dtype, (b["bytes_by_dtype"], by_dtype)

verify = open(sys.argv[2]).read()
m = re.fullmatch(r"plan verified: (\S+), (\d+) buffers, no two live buffers overlap\n", verify)
assert m and int(m.group(2)) == len(lst), verify

units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
text = open(sys.argv[3]).read()
m = re.search(r"^  by dtype, the state and (\w+)'s activations before reuse:((?: \w+ [0-9.]+ \w+)+)$", text, re.M)
assert m and m.group(1) == most, text
shown = re.findall(r" (\w+) ([0-9.]+) (\w+)", m.group(2))
assert [d for d, _, _ in shown] == sorted(by_dtype), shown
for d, v, u in shown:
    assert abs(float(v) * units[u] - by_dtype[d]) <= 0.006 * by_dtype[d], (d, v, u, by_dtype[d])

print("buffers", len(lst), "activations of", most)
print("by kind", " ".join(f"{k}={v}" for k, v in sorted(by_kind.items())))
print("by dtype", " ".join(sorted(by_dtype)), "total", sum(by_dtype.values()) == sum(by_kind.values()))
