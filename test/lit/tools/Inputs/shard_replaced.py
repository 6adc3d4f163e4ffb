"""Trains on two shards of 20000 tokens (156 steps of gpt2-tiny each) and, while the run is
stopped (SIGSTOP) after step 2, replaces the second by a new file of 30000 tokens (234 steps) and
rewrites the first in place with other tokens of the same count; it reads them again at steps 157
and 391. Then prints the run's warnings and its last step.
Usage: shard_replaced.py EXE (in the current folder)"""
import os
import random
import signal
import struct
import subprocess
import sys


def shard(path, n, seed):
    rng = random.Random(seed)
    data = struct.pack("<256i", 20240520, 1, n, *[0] * 253) + struct.pack(f"<{n}H", *[rng.randrange(512) for _ in range(n)])
    with open(path, "wb") as f:
        f.write(data)


shard("r_0.bin", 20000, 1)
shard("r_1.bin", 20000, 2)
run = subprocess.Popen([sys.argv[1], "train", "--data", "r_*.bin", "--steps", "400", "--print-every", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
last = ""
for line in run.stdout:
    if line.startswith("step") and int(line.split()[1].split("/")[0]) == 2:
        run.send_signal(signal.SIGSTOP)
        shard("r_1.new", 30000, 3)
        os.rename("r_1.new", "r_1.bin")  # a new file at the name
        shard("r_0.bin", 20000, 4)         # the same file rewritten
        run.send_signal(signal.SIGCONT)
    if line.startswith("step"):
        last = line.split("|")[0].strip()
err = run.communicate()[1]
sys.stdout.write("".join(line + "\n" for line in err.splitlines() if "warning" in line))
print("exit", run.returncode, "after", last)
