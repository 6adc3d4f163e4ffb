# module_layout.py SCHEMA MODULE: a module's sizes recomputed from its own buffers and instrs
# (flatc decodes it), against the sizes kilnc wrote beside them. Prints one line per check.
#   state: parameter state first, in declaration order, each at the previous one's aligned end;
#   program P: its activation_size is where its activations end (offset - state + aligned size);
#   activation/naive/arena: the largest program's plan; the largest sum of a program's aligned
#   activations (no reuse); state + activations.
import sys

import module_json

d = module_json.load(*sys.argv[1:3])
align = lambda n: (n + 255) // 256 * 256
bufs = d["buffers"]
state = 0
for b in bufs:
    if b.get("kind", "Activation") != "Activation":
        assert b.get("offset", 0) == state, (b["name"], b.get("offset", 0), state)
        state += align(b.get("size", 0))
print("state", state, "written", d["state_size"])
ends, sums = [], []
for p in d["programs"]:
    used = {p.get("result", 0)} | {x for i in p["instrs"] for x in i.get("inputs", []) + i.get("outputs", [])}
    acts = [bufs[x] for x in sorted(used) if bufs[x].get("kind", "Activation") == "Activation"]
    end = max(b.get("offset", 0) - state + align(b.get("size", 0)) for b in acts)
    ends.append(end)
    sums.append(sum(align(b.get("size", 0)) for b in acts))
    print("program", p["name"], "ends at", end, "written", p.get("activation_size", 0))
print("activations", max(ends), "written", d["activation_size"])
print("naive", max(sums), "written", d["naive_activation_size"])
print("arena", state + max(ends), "written", d["arena_size"])
