#!/usr/bin/env python3
"""Weight files written by PyTorch load into Kiln exactly.

The same initial weights are written four ways by this test: Hugging Face safetensors with the
"transformer." prefix, without it (plus a tied lm_head.weight and the attention-mask buffers
that Hugging Face files carry, as F32 and again as BOOL), and as an llm.c model file (nn.Linear [out, in] layout,
vocabulary padded to a multiple of 128); then as BF16 and F16 safetensors and a bf16 llm.c file. Kiln loads
each with --init and saves them again with --save after one step at lr 0 (AdamW then changes nothing);
every saved tensor must equal the original (PyTorch's rounding of it, for the half-precision files) bit
for bit. An lm_head.weight that differs from wte must be refused.

Kiln pads the vocabulary to a multiple of 128 (wte is [Vp, C] inside, logits [N, Vp]); files hold
the real [V, C]. After a few training steps from a seed, the checkpoint (which stores the padded
tensors) must show the padded rows of wte and of its AdamW moments still exactly 0, while --save
and --dump-grads write wte as [V, C].

  test_weights.py --kilnc build/bin/kilnc --spec test/e2e/configs/awkward.toml --workdir DIR
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tomllib

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402


def write_safetensors_half(path, tensors, dtype):
    """Every tensor as PyTorch's bfloat16 ("BF16") or float16 ("F16") holds it."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().to(dtype).contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
        header[name] = {"dtype": {torch.bfloat16: "BF16", torch.float16: "F16"}[dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_llmc_bin(path, params, cfg, padded_vocab, bf16=False):
    """llm.c's gpt2 model file, version 3 (fp32) or 5 (bf16)."""
    C, L = cfg.n_embd, cfg.n_layer
    header = np.zeros(256, dtype="<i4")
    header[:8] = [20240326, 5 if bf16 else 3, cfg.block_size, cfg.vocab_size, L, cfg.n_head, C, padded_vocab]
    p = {k.removeprefix("transformer."): v for k, v in params.items()}
    wte = torch.zeros(padded_vocab, C)
    wte[: cfg.vocab_size] = p["wte.weight"]
    wte[cfg.vocab_size:] = 7.0  # padding rows must be ignored
    chunks = [wte, p["wpe.weight"]]

    def stack(suffix, transpose):
        return torch.stack([p[f"h.{i}.{suffix}"].t() if transpose else p[f"h.{i}.{suffix}"] for i in range(L)])

    for suffix, transpose in [("ln_1.weight", False), ("ln_1.bias", False), ("attn.c_attn.weight", True),
                              ("attn.c_attn.bias", False), ("attn.c_proj.weight", True), ("attn.c_proj.bias", False),
                              ("ln_2.weight", False), ("ln_2.bias", False), ("mlp.c_fc.weight", True),
                              ("mlp.c_fc.bias", False), ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False)]:
        chunks.append(stack(suffix, transpose))
    chunks += [p["ln_f.weight"], p["ln_f.bias"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for t in chunks:
            if bf16:
                f.write(t.contiguous().to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes())
            else:
                f.write(t.contiguous().to(torch.float32).numpy().astype("<f4").tobytes())


def read_checkpoint(path):
    """name -> {"shape", "value", "adam_m", "adam_v"} of a Kiln checkpoint (runtime/checkpoint.h)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"KILNCKPT", f"{path}: not a Kiln checkpoint"
    header_len = struct.unpack_from("<Q", data, 16)[0]
    header = json.loads(data[32:32 + header_len])
    base = 32 + header_len
    out = {}
    for p in header["parameters"]:
        out[p["name"]] = {"shape": p["shape"]}
        for key in ("value", "adam_m", "adam_v"):
            offset, nbytes = p[key]
            out[p["name"]][key] = np.frombuffer(data, "<f4", nbytes // 4, base + offset).reshape(p["shape"])
    return out


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnc", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    with open(a.spec, "rb") as f:
        spec = tomllib.load(f)
    cfg = ref.GPTConfig.from_dict(spec["model"])
    B, T = spec["compile"]["batch_size"], spec["compile"]["seq_len"]
    exe = os.path.join(a.workdir, "gpt2")
    code, out = run([a.kilnc, a.spec, "-o", exe])
    assert code == 0, out
    shard = os.path.join(a.workdir, "data.bin")
    ref.write_shard(shard, np.random.default_rng(0).integers(0, cfg.vocab_size, B * T * 4))

    params = ref.init_params(cfg, seed=3)
    files = {}
    files["prefixed"] = os.path.join(a.workdir, "prefixed.safetensors")
    ref.write_safetensors(files["prefixed"], params)
    plain = {k.removeprefix("transformer."): v for k, v in params.items()}
    plain["lm_head.weight"] = params["transformer.wte.weight"].clone()
    for i in range(cfg.n_layer):
        plain[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, cfg.block_size, cfg.block_size))
    files["plain+tied"] = os.path.join(a.workdir, "plain.safetensors")
    ref.write_safetensors(files["plain+tied"], plain)
    # The mask buffers as BOOL (transformers 4.2x), and a masked_bias beside them.
    for i in range(cfg.n_layer):
        plain[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, cfg.block_size, cfg.block_size)).bool()
        plain[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    files["plain+bool masks"] = os.path.join(a.workdir, "plain-bool.safetensors")
    ref.write_safetensors(files["plain+bool masks"], plain)
    files["llm.c bin"] = os.path.join(a.workdir, "model.bin")
    write_llmc_bin(files["llm.c bin"], params, cfg, (cfg.vocab_size + 127) // 128 * 128)
    # Half-precision files hold the values PyTorch rounds to; Kiln widens them exactly (F16's
    # subnormals among them: |w| < 6.1e-5 in N(0, 0.02)).
    rounded = {}
    for kind, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16)):
        files[kind] = os.path.join(a.workdir, f"{kind}.safetensors")
        write_safetensors_half(files[kind], params, dtype)
        rounded[kind] = {n: t.to(dtype).to(torch.float32) for n, t in params.items()}
    files["llm.c bin bf16"] = os.path.join(a.workdir, "model-bf16.bin")
    write_llmc_bin(files["llm.c bin bf16"], params, cfg, (cfg.vocab_size + 127) // 128 * 128, bf16=True)
    rounded["llm.c bin bf16"] = rounded["bf16"]

    failures = 0
    for kind, path in files.items():
        saved = os.path.join(a.workdir, f"saved-{kind.replace(' ', '_')}.safetensors")
        code, out = run([exe, "train", "--data", shard, "--steps", "1", "--init", path, "--lr", "0",
                         "--save", saved])
        if code != 0:
            print(f"FAIL {kind}: kiln exited {code}:\n{out}")
            failures += 1
            continue
        back = ref.read_safetensors(saved)
        want = rounded.get(kind, params)
        worst = max(float((back[n] - want[n]).abs().max()) for n in params)
        same = set(back) == set(params)
        ok = same and worst == 0.0
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {kind:12s} {len(back)} tensors, names match: {same}, max |diff| {worst:.1e}")

    # A cut llm.c file, and one whose header's padded vocabulary is not its tensors': said with the
    # header's sizes and the bytes they call for, before any tensor is read.
    whole = open(files["llm.c bin"], "rb").read()
    cut = os.path.join(a.workdir, "cut.bin")
    with open(cut, "wb") as f:
        f.write(whole[:-100])
    wide = os.path.join(a.workdir, "wide.bin")
    with open(wide, "wb") as f:
        f.write(whole[:28] + struct.pack("<i", struct.unpack_from("<i", whole, 28)[0] + 128) + whole[32:])
    for name, path, says in (("cut llm.c bin", cut, "(truncated?)"), ("llm.c bin, wrong Vp", wide, "(truncated?)")):
        code, out = run([exe, "train", "--data", shard, "--steps", "1", "--init", path])
        line = out.strip().splitlines()[-1] if out.strip() else ""
        refused = code != 0 and line.startswith(f"error: {path}: header: its sizes (Vp=") and line.endswith(says)
        failures += not refused
        print(f"{'ok  ' if refused else 'FAIL'} {name} refused: {line}")

    bad = dict(plain)
    bad["lm_head.weight"] = bad["lm_head.weight"] + 1
    bad_path = os.path.join(a.workdir, "untied.safetensors")
    ref.write_safetensors(bad_path, bad)
    code, out = run([exe, "train", "--data", shard, "--steps", "1", "--init", bad_path])
    refused = code != 0 and "lm_head.weight differs from wte.weight" in out
    failures += not refused
    print(f"{'ok  ' if refused else 'FAIL'} untied lm_head refused: {out.strip().splitlines()[-1] if out.strip() else ''}")
    # The padded vocabulary rows start at 0 and stay 0 through training (no gradient reaches them,
    # weight decay keeps 0 at 0); files show only the real [V, C].
    V, C = cfg.vocab_size, cfg.n_embd
    Vp = (V + 127) // 128 * 128
    ck = os.path.join(a.workdir, "ck")
    shutil.rmtree(ck, ignore_errors=True)
    trained, grads = (os.path.join(a.workdir, n) for n in ("trained.safetensors", "grads.safetensors"))
    code, out = run([exe, "train", "--data", shard, "--steps", "4", "--seed", "5", "--lr", "1e-2",
                     "--weight-decay", "0.1", "--checkpoint-dir", ck, "--checkpoint-every", "4",
                     "--dump-grads", grads, "--save", trained])
    if code != 0:
        print(f"FAIL padded vocabulary: kiln exited {code}:\n{out}")
        failures += 1
    else:
        ckpts = sorted(f for f in os.listdir(ck) if f.endswith(".kiln-ckpt"))
        wte = read_checkpoint(os.path.join(ck, ckpts[-1]))["wte.weight"]
        pad_zero = all(not np.any(wte[k][V:]) for k in ("value", "adam_m", "adam_v"))
        trained_rows = bool(np.any(wte["adam_v"][:V]))  # the real rows did get gradients
        shapes = (tuple(ref.read_safetensors(trained)["transformer.wte.weight"].shape),
                  tuple(ref.read_safetensors(grads)["transformer.wte.weight"].shape))
        ok = wte["shape"] == [Vp, C] and pad_zero and trained_rows and shapes == ((V, C), (V, C))
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} padded vocabulary: checkpoint wte {wte['shape']}, rows {V}..{Vp - 1} "
              f"zero in value and AdamW moments: {pad_zero}; --save / --dump-grads wte {shapes[0]} / {shapes[1]}")

    # eval: the mean loss of weights over shards, batch by batch as training reads them, against
    # float64 PyTorch (relative 1e-5: Kiln's forward is fp32); the same weights as an llm.c file
    # give the same loss.
    shard2 = os.path.join(a.workdir, "data2.bin")
    ref.write_shard(shard2, np.random.default_rng(7).integers(0, cfg.vocab_size, B * T * 2 + 5))
    weights = ref.to_f64(ref.normalize_state(ref.read_safetensors(trained) if code == 0 else params, cfg))
    batch_losses = []
    for f in (shard, shard2):
        tokens = torch.from_numpy(ref.read_shard(f).astype(np.int64))
        for i in range((len(tokens) - 1) // (B * T)):
            buf = tokens[i * B * T: (i + 1) * B * T + 1]
            _, loss = ref.forward(weights, buf[:-1].view(B, T), buf[1:].view(B, T), cfg)
            batch_losses.append(float(loss))
    want = sum(batch_losses) / len(batch_losses)
    evaluated = trained if code == 0 else files["prefixed"]
    code_e, out = run([exe, "eval", "--init", evaluated, "--data", os.path.join(a.workdir, "data*.bin"), "--json"])
    try:
        got = json.loads(out.splitlines()[0])
    except (ValueError, IndexError):
        got = {}
    err = abs(got.get("loss", float("nan")) - want) / want
    ok = code_e == 0 and got.get("batches") == len(batch_losses) and got.get("whole_pass") is True and err <= 1e-5
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} eval: loss {got.get('loss')} over {got.get('batches')} batches of 2 shards, "
          f"PyTorch float64 {want:.9f}: relative error {err:.1e}")
    code_e, out = run([exe, "eval", "--init", evaluated, "--data", shard, "--batches", "2"])
    first = out.splitlines()[0] if out else ""
    got2 = float(first.split()[1]) if first.startswith("loss ") else float("nan")
    want2 = sum(batch_losses[:2]) / 2
    ok = code_e == 0 and abs(got2 - want2) / want2 <= 1e-5 and "2 batches of B=" in first
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} eval --batches 2: {first}")
    code_e, out = run([exe, "eval", "--init", evaluated, "--data", shard, "--batches", "4"])
    line = next((l for l in out.splitlines() if l.startswith("loss ")), "")
    got4 = float(line.split()[1]) if line else float("nan")
    ok = (code_e == 0 and "note: --batches 4: the data holds 3 batches" in out and "(all of them)" in line
          and abs(got4 - sum(batch_losses[:3]) / 3) / want <= 1e-5)
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} eval --batches past the data reads one pass: {line}")
    if code == 0:  # the initial weights, as safetensors and as an llm.c file: one loss
        outs = [run([exe, "eval", "--init", files[k], "--data", shard, "--json"]) for k in ("prefixed", "llm.c bin")]
        losses = [json.loads(o.splitlines()[0])["loss"] if c == 0 else None for c, o in outs]
        ok = losses[0] is not None and losses[0] == losses[1]
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} eval of the same weights as safetensors and as an llm.c file: {losses}")
    print("RESULT:", "PASS" if failures == 0 else f"FAIL ({failures})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
