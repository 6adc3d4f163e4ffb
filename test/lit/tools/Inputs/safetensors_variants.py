"""Writes malformed variants of a safetensors file (kiln-run-files.test): each one a way a weights
file can be wrong that the loader must name rather than load. Usage: safetensors_variants.py IN OUTDIR"""
import json
import os
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    tensors = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}
    return tensors, meta


def write(path, tensors, raw_header=None):
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, blob) in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = raw_header(header) if raw_header else json.dumps(header)
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode() + b"".join(blobs))


src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
tensors, _ = read(src)
items = list(tensors.items())
wpe = "transformer.wpe.weight"
wte = tensors["transformer.wte.weight"]

# The same parameter with and without the "transformer." prefix.
write(f"{out}/dup-prefix.safetensors", items + [("wpe.weight", tensors[wpe])])
# A JSON key that repeats (JSON keeps the last one).
write(f"{out}/dup-key.safetensors", items, raw_header=lambda h: json.dumps(h)[:-1] + ", " +
      json.dumps(wpe) + ": " + json.dumps(h[wpe]) + "}")
# An integer dtype.
write(f"{out}/i32.safetensors", [(k, ("I32", s, b) if k == wpe else (d, s, b)) for k, (d, s, b) in items])
# An extra tensor whose name is 16 characters after the prefix.
write(f"{out}/extra16.safetensors", items + [("transformer.h.0.mlp.extra.ww", ("F32", [1], b"\0" * 4))])
# lm_head.weight transposed: the same values, the wrong shape.
write(f"{out}/lm-head-t.safetensors", items + [("lm_head.weight", ("F32", wte[1][::-1], wte[2]))])
# Weights holding a NaN (a diverged run's, say).
write(f"{out}/nan.safetensors", [(k, (d, s, struct.pack("<f", float("nan")) + b[4:]) if k == wpe else (d, s, b))
                                 for k, (d, s, b) in items])
# A tensor name with a newline in it.
write(f"{out}/newline.safetensors", items + [("bad\nname", ("F32", [1], b"\0" * 4))])
# A linear weight transposed, as nanoGPT's nn.Linear keeps it.
attn = "transformer.h.0.attn.c_attn.weight"
write(f"{out}/linear-t.safetensors", [(k, (d, s[::-1], b) if k == attn else (d, s, b)) for k, (d, s, b) in items])
# The MLP's linear weights transposed too (attn.c_proj is square: transposed, its shape is the same).
for short, key in (("fc", "transformer.h.0.mlp.c_fc.weight"), ("proj", "transformer.h.0.mlp.c_proj.weight")):
    write(f"{out}/{short}-t.safetensors", [(k, (d, s[::-1], b) if k == key else (d, s, b)) for k, (d, s, b) in items])
# An embedding transposed: no nanoGPT layout to blame (its embeddings are [rows, C] as Hugging Face's).
write(f"{out}/wte-t.safetensors", [(k, (d, s[::-1], b) if k == "transformer.wte.weight" else (d, s, b)) for k, (d, s, b) in items])
# A linear weight whose first dimension is the model's second but whose second is not its first: not transposed.
write(f"{out}/linear-half.safetensors", [(k, (d, [s[1], s[0] // 2], b[:len(b) // 2]) if k == attn else (d, s, b))
                                         for k, (d, s, b) in items])
# Another model's names (no h.N layers at all): the depths are not said.
write(f"{out}/other-names.safetensors", [("model." + k.split(".", 1)[1], v) for k, v in items])
# One layer fewer, and one more (a copy of the last), than the model has.
last = max(int(k.split(".")[2]) for k in tensors if k.startswith("transformer.h."))
layer = f"transformer.h.{last}."
write(f"{out}/shallow.safetensors", [(k, v) for k, v in items if not k.startswith(layer)])
write(f"{out}/deep.safetensors", items + [(k.replace(layer, f"transformer.h.{last + 1}."), v)
                                          for k, v in items if k.startswith(layer)])
