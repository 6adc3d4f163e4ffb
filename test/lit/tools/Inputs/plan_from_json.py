# plan_from_json.py INSPECT.json: checks a module's memory plan from `kiln-inspect --json` alone:
# within each program, no two activations live at once (kept ones: always; a program's result: past its last instr) share bytes, except an
# output written at the offset of an input whose last use is that instr (an in-place kernel).
# Prints the programs and live ranges checked, and the arena bytes in use at micro_step's busiest instr.
import json
import sys

j = json.load(open(sys.argv[1]))
by_program = {}
for b in j["buffers"]["list"]:
    for live in b["live"]:
        first, last = (-1, 1 << 62) if live["kept_between_runs"] else (live["first_instr"], live["last_instr"])
        by_program.setdefault(live["program"], []).append((first, last, b))
overlaps = 0
for program, spans in by_program.items():
    spans.sort(key=lambda s: s[0])
    for x, (f1, l1, a) in enumerate(spans):
        for f2, l2, b in spans[x + 1:]:
            if f2 > l1:
                break
            if not (a["bytes"] and b["bytes"] and a["offset"] < b["offset"] + b["bytes"] and
                    b["offset"] < a["offset"] + a["bytes"]):
                continue
            if l1 == f2 and a["offset"] == b["offset"]:
                continue
            overlaps += 1
            print(f"{program}: {a['name']} and {b['name']} overlap")


def in_use(k, spans):  # the arena bytes live buffers cover at instr k (in-place pairs once)
    covered, end = 0, 0
    for lo, hi in sorted((s[2]["offset"], s[2]["offset"] + s[2]["bytes"]) for s in spans if s[0] <= k <= s[1]):
        covered += max(0, hi - max(lo, end))
        end = max(end, hi)
    return covered


spans = by_program["micro_step"]
peak = max(in_use(k, spans) for k in range(max(s[1] for s in spans) + 1))
print(f"{len(by_program)} programs, {sum(len(s) for s in by_program.values())} live ranges, {overlaps} overlaps")
reported = j["peak"]["live_bytes"]
print(f"micro_step peak: {'agrees' if reported == peak else 'differs'} ({peak} bytes, reported {reported})")
