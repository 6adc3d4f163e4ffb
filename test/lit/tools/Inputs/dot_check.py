"""Checks a kiln-inspect --dot graph against its own nodes and prints what it found.

usage: dot_check.py GRAPH.dot
Instructions i0..i(n-1) are chained in order by invisible edges; an activation is an edge from its
writer when it is read at most 8 instructions later and a note naming the writer ("from #k") when
farther; a kernel's name is broken after underscores into lines of at most 30 characters, each
line ended only where its next piece would pass 30, and the lines joined give the symbol back;
no node is declared twice.
"""
import re
import sys

dot = open(sys.argv[1]).read()
labels = {int(i): l for i, l in re.findall(r'^    i(\d+) \[shape=box, .*label="#\d+ ((?:[^"\\]|\\.)*)"\];$', dot, re.M)}
n = len(labels)
assert sorted(labels) == list(range(n)), sorted(labels)
chain = [(int(a), int(b)) for a, b in re.findall(r"^  i(\d+) -> i(\d+) \[style=invis, weight=4\];$", dot, re.M)]
assert chain == [(k, k + 1) for k in range(n - 1)], chain

near = [int(b) - int(a) for a, b in re.findall(r'^  i(\d+) -> i(\d+) \[label=', dot, re.M)]
assert near and all(0 < d <= 8 for d in near), near
notes = {note: int(w) for note, w in re.findall(r'^  (s\d+_\d+) \[shape=note, fillcolor="#ffffff", label=".*\\nfrom #(\d+)"\];$', dot, re.M)}
far = []
for note, w in notes.items():
    reader = re.search(r"^  " + note + r" -> i(\d+);$", dot, re.M)
    assert reader and int(note.split("_")[1]) == int(reader.group(1)), note
    far.append(int(reader.group(1)) - w)
assert all(d > 8 for d in far), far

# Each node is declared once: a state buffer an instruction both reads and writes is one node.
ids = re.findall(r"^  +(\w+) \[shape=", dot, re.M)
assert len(ids) == len(set(ids)), sorted(i for i in set(ids) if ids.count(i) > 1)

wrapped = 0
for k, label in labels.items():
    parts = label.split("\\n")
    name_lines = []
    for p in parts:
        if p.startswith("("):
            break
        name_lines.append(p)
    if len(name_lines) < 2 or not re.match(r"k\d+_", name_lines[0]):
        continue
    wrapped += 1
    for line, nxt in zip(name_lines, name_lines[1:]):
        piece = re.match(r"[^_]*_?", nxt).group(0)
        assert line.endswith("_") and len(line) + len(piece) > 30, (k, line, nxt)
    for line in name_lines:
        assert len(line) <= 30 or "_" not in line[:-1], (k, line)
print("%d instructions chained; %d edges (%d of them 8 apart), %d notes (%d of them 9 apart); %d names wrapped" %
      (n, len(near), near.count(8), len(far), far.count(9), wrapped))
