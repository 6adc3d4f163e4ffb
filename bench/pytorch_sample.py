#!/usr/bin/python3
"""PyTorch's incremental decoding of a GPT-2, the peer of Kiln's `sample` in bench/sample_cpu.sh.

Loads Hugging Face GPT-2 safetensors (as Kiln's --save writes them), feeds a prompt to B rows,
then samples new tokens one position at a time with a key/value cache per layer (the way
Hugging Face's `generate` decodes: the prompt in one causal forward pass over all its positions
that fills the caches, then each step computes one position and attends to the cached keys and
values), top-k 50, in fp32 under torch.no_grad with the given threads. Prints one JSON line: the
seconds of the prompt (prefill) and of every decoding step. --prefill-by-step feeds the prompt
one position at a time instead.

  pytorch_sample.py --weights W.safetensors --n-layer 4 --n-head 4 --rows 8 --prompt-len 16 \
                    --new-tokens 64 --threads 2
"""
import argparse
import json
import math
import struct
import time

import numpy as np
import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        begin, end = info["data_offsets"]
        out[name.removeprefix("transformer.")] = torch.from_numpy(
            np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"]).copy())
    return out


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


class Decoder:
    """One step: logits of the position `pos` for every row, extending the caches."""

    def __init__(self, p, n_layer, n_head, rows, context):
        self.p, self.L, self.H = p, n_layer, n_head
        C = p["wte.weight"].shape[1]
        self.C, self.hs = C, C // n_head
        self.k = torch.zeros(n_layer, rows, n_head, context, self.hs)
        self.v = torch.zeros_like(self.k)

    def prefill(self, prompt, rows):
        """The prompt's P positions at once in every row (causal attention), filling the caches
        at 0..P-1; returns the logits of the last position [rows, V]."""
        p, C, H, hs = self.p, self.C, self.H, self.hs
        P = prompt.shape[0]
        x = (p["wte.weight"][prompt] + p["wpe.weight"][:P]).repeat(rows, 1)   # [rows * P, C]
        mask = torch.ones(P, P, dtype=torch.bool).tril()
        for i in range(self.L):
            h = f"h.{i}."
            a = layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])
            qkv = torch.addmm(p[h + "attn.c_attn.bias"], a, p[h + "attn.c_attn.weight"])
            q, k, v = qkv.view(rows, P, 3, H, hs).permute(2, 0, 3, 1, 4).unbind(0)  # [rows, H, P, hs]
            self.k[i, :, :, :P] = k
            self.v[i, :, :, :P] = v
            s = (q @ k.transpose(-1, -2) / math.sqrt(hs)).masked_fill(~mask, float("-inf"))
            y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(rows * P, C)
            x = x + torch.addmm(p[h + "attn.c_proj.bias"], y, p[h + "attn.c_proj.weight"])
            m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
            u = torch.nn.functional.gelu(torch.addmm(p[h + "mlp.c_fc.bias"], m, p[h + "mlp.c_fc.weight"]),
                                         approximate="tanh")
            x = x + torch.addmm(p[h + "mlp.c_proj.bias"], u, p[h + "mlp.c_proj.weight"])
        last = x.view(rows, P, C)[:, -1]
        return layer_norm(last, p["ln_f.weight"], p["ln_f.bias"]) @ p["wte.weight"].t()

    def step(self, tokens, pos):
        p, C, H, hs = self.p, self.C, self.H, self.hs
        x = p["wte.weight"][tokens] + p["wpe.weight"][pos]                  # [B, C]
        for i in range(self.L):
            h = f"h.{i}."
            a = layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])
            qkv = torch.addmm(p[h + "attn.c_attn.bias"], a, p[h + "attn.c_attn.weight"])
            q, k, v = qkv.view(-1, 3, H, hs).unbind(1)                        # [B, H, hs]
            self.k[i, :, :, pos] = k
            self.v[i, :, :, pos] = v
            keys, values = self.k[i, :, :, : pos + 1], self.v[i, :, :, : pos + 1]
            s = torch.einsum("bhc,bhtc->bht", q, keys) / math.sqrt(hs)
            y = torch.einsum("bht,bhtc->bhc", torch.softmax(s, dim=-1), values).reshape(-1, C)
            x = x + torch.addmm(p[h + "attn.c_proj.bias"], y, p[h + "attn.c_proj.weight"])
            m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
            u = torch.nn.functional.gelu(torch.addmm(p[h + "mlp.c_fc.bias"], m, p[h + "mlp.c_fc.weight"]),
                                         approximate="tanh")
            x = x + torch.addmm(p[h + "mlp.c_proj.bias"], u, p[h + "mlp.c_proj.weight"])
        return layer_norm(x, p["ln_f.weight"], p["ln_f.bias"]) @ p["wte.weight"].t()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--n-layer", type=int, required=True)
    ap.add_argument("--n-head", type=int, required=True)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--context", type=int, default=1024, help="cached positions (default 1024)")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--prefill-by-step", action="store_true", help="feed the prompt one position at a time")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    p = read_safetensors(a.weights)
    V = p["wte.weight"].shape[0]
    assert a.prompt_len + a.new_tokens <= a.context
    dec = Decoder(p, a.n_layer, a.n_head, a.rows, a.context)
    prompt = torch.randint(0, V, (a.prompt_len,))
    steps = []
    with torch.no_grad():
        t0 = time.perf_counter()
        if a.prefill_by_step:
            for pos in range(a.prompt_len):
                logits = dec.step(prompt[pos].repeat(a.rows), pos)
        else:
            logits = dec.prefill(prompt, a.rows)
        prefill = time.perf_counter() - t0
        for k in range(a.new_tokens):
            t = time.perf_counter()
            top = torch.topk(logits, a.top_k, dim=-1)
            pick = torch.multinomial(torch.softmax(top.values, dim=-1), 1)
            token = top.indices.gather(-1, pick).squeeze(-1)
            if k + 1 < a.new_tokens:
                logits = dec.step(token, a.prompt_len + k)
            steps.append(time.perf_counter() - t)
    print(json.dumps({"prefill_s": prefill, "step_s": steps, "rows": a.rows, "torch": torch.__version__,
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
