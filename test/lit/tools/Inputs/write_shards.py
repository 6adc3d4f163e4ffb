# write_shards.py PREFIX N0 N1 ...: llm.c token shards PREFIX_0.bin, PREFIX_1.bin, ... of N0, N1, ...
# random tokens below 512 (gpt2-tiny's vocabulary).
import random
import struct
import sys

prefix, counts = sys.argv[1], [int(n) for n in sys.argv[2:]]
rng = random.Random(1)
for i, n in enumerate(counts):
    with open(f"{prefix}_{i}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *[0] * 253))
        f.write(struct.pack(f"<{n}H", *[rng.randrange(512) for _ in range(n)]))
