#!/usr/bin/env python3
"""Write a synthetic, learnable token data set in llm.c's shard format (pure stdlib).

    make_synthetic_shard.py --out DIR --vocab-size V --tokens N --seed S [--val-tokens M]

writes DIR/train_000.bin (N tokens) and DIR/val_000.bin (M tokens, default max(N // 10, 1))
atomically (temporary file, then os.replace). Format: 256 little-endian int32 header
[20240520, 1, ntok, 0, ...] followed by ntok little-endian uint16 tokens.

The text has structure a small GPT learns quickly: documents start with an end-of-text token
(V - 1); their body alternates between walks of a sparse random Markov chain (every token has
1 to 4 possible successors with fixed random probabilities) and verbatim "phrases" (a fixed
table of random token strings of length 3..12 picked with Zipf-like frequencies). The entropy is
about 1-1.5 nats per token, far below ln(V), so the training loss should fall clearly below
ln(V) within a few hundred steps. The same seed always gives the same bytes.
"""
import argparse
import bisect
import os
import random
import struct
import sys
from array import array

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256


class Generator:
    def __init__(self, vocab_size: int, seed: int):
        if vocab_size < 4 or vocab_size > 65536:
            raise ValueError("--vocab-size must be in [4, 65536]")
        self.V = vocab_size
        self.eot = vocab_size - 1
        self.rng = random.Random(seed)
        rng, n = self.rng, vocab_size - 1            # ordinary tokens are 0 .. V-2
        self.succ, self.cum = [], []
        for _ in range(n):
            k = rng.randint(1, min(4, n))
            nxt = rng.sample(range(n), k)
            w = [rng.random() + 0.1 for _ in range(k)]
            tot, acc, cum = sum(w), 0.0, []
            for x in w:
                acc += x / tot
                cum.append(acc)
            cum[-1] = 1.0
            self.succ.append(nxt)
            self.cum.append(cum)
        nphr = max(4, min(256, n // 4))
        self.phrases = [[rng.randrange(n) for _ in range(rng.randint(3, 12))] for _ in range(nphr)]
        zipf = [1.0 / (i + 1) for i in range(nphr)]
        tot, acc = sum(zipf), 0.0
        self.phrase_cum = []
        for z in zipf:
            acc += z / tot
            self.phrase_cum.append(acc)
        self.phrase_cum[-1] = 1.0

    def generate(self, ntok: int) -> array:
        rng, out = self.rng, array("H")
        succ, cum, pcum, phrases = self.succ, self.cum, self.phrase_cum, self.phrases
        random_, bisect_ = rng.random, bisect.bisect_left
        while len(out) < ntok:
            out.append(self.eot)                                 # document start
            cur = rng.randrange(self.V - 1)
            doc_len = rng.randint(32, 512)
            n = 0
            while n < doc_len:
                if random_() < 0.3:                              # a verbatim phrase
                    ph = phrases[bisect_(pcum, random_())]
                    out.extend(ph)
                    n += len(ph)
                    cur = ph[-1]
                else:                                            # a Markov walk
                    for _ in range(rng.randint(4, 16)):
                        c = cum[cur]
                        cur = succ[cur][bisect_(c, random_())]
                        out.append(cur)
                    n += 1
        del out[ntok:]
        return out


def write_shard(path: str, tokens: array) -> None:
    if sys.byteorder != "little":
        tokens = array("H", tokens)
        tokens.byteswap()
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    tmp = os.path.join(os.path.dirname(path) or ".", "." + os.path.basename(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<%di" % HEADER_INTS, *header))
        tokens.tofile(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (created if missing)")
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--tokens", type=int, required=True, help="tokens in train_000.bin")
    ap.add_argument("--val-tokens", type=int, default=None, help="tokens in val_000.bin (default N//10)")
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args(argv)
    if a.tokens < 1 or a.tokens >= 2 ** 31:
        ap.error("--tokens must be in [1, 2^31)")
    if a.vocab_size < 4 or a.vocab_size > 65536:
        ap.error("--vocab-size must be in [4, 65536] (llm.c shards hold uint16 ids; the generator needs 4)")
    if a.val_tokens is not None and (a.val_tokens < 1 or a.val_tokens >= 2 ** 31):
        ap.error("--val-tokens must be in [1, 2^31)")
    nval = a.val_tokens if a.val_tokens is not None else max(a.tokens // 10, 1)
    os.makedirs(a.out, exist_ok=True)
    gen = Generator(a.vocab_size, a.seed)
    for name, n in (("train_000.bin", a.tokens), ("val_000.bin", nval)):
        path = os.path.join(a.out, name)
        write_shard(path, gen.generate(n))
        print(f"wrote {path}: {n} tokens, vocab {a.vocab_size} (eot {a.vocab_size - 1}), "
              f"seed {a.seed}, {os.path.getsize(path)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
