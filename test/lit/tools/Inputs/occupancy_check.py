"""Checks kiln-inspect's CUDA occupancy figures (--json) against the module's own ptxas numbers,
and the --cuda-resources table against the JSON.

usage: occupancy_check.py REPORT.json RESOURCES.txt
Per SM (CUDA C++ Programming Guide, "Compute Capabilities"): 64K registers allocated per warp in
units of 256, 2048 threads, 32 blocks, and 228 KB of shared memory (sm_80: 164 KB) with 1 KB
reserved per block, allocated in units of 128 bytes. limited_by names every limit that gives the
count. Prints one line of figures when all hold.
"""
import json
import sys

j = json.load(open(sys.argv[1]))
c = j["cuda"]
smem = (164 if c["arch"] == "sm_80" else 228) * 1024
seen = {}
for f in c["functions"]:
    if "block" not in f:
        continue
    warps = -(-f["block"] // 32)
    warp_regs = -(-max(f["registers"], 1) * 32 // 256) * 256
    limits = {"registers": 65536 // warp_regs // warps, "threads": 2048 // (warps * 32), "blocks": 32,
              "shared memory": smem // (-(-f["shared_bytes"] // 128) * 128 + 1024) if f["shared_bytes"] else 32}
    n = min(limits.values())
    why = " and ".join(w for w in ("registers", "shared memory", "threads", "blocks") if limits[w] == n)
    got = (f["blocks_per_sm"], f["warps_per_sm"], f["limited_by"])
    assert got == (n, n * warps, why), (f, (n, n * warps, why))
    seen[why] = seen.get(why, 0) + 1

# The table: one row per function, its spill the stores and loads together.
rows = {l.split()[0]: l.split() for l in open(sys.argv[2]).read().splitlines()[3:]}
assert len(rows) == len(c["functions"]), (len(rows), len(c["functions"]))
for f in c["functions"]:
    row = rows[f["symbol"]]
    spill = f["spill_store_bytes"] + f["spill_load_bytes"]
    want = [str(f.get("block", "-")), str(f["registers"]), str(f["shared_bytes"]), str(f["stack_bytes"]), str(spill),
            str(f.get("blocks_per_sm", "-")), str(f.get("warps_per_sm", "-"))]
    assert row[1:8] == want and " ".join(row[8:]) == f.get("limited_by", ""), (row, want, f)
print("occupancy consistent (%s): %s" % (c["arch"], ", ".join("%s %d" % kv for kv in sorted(seen.items()))))
