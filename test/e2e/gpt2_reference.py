#!/usr/bin/python3
"""Float64 PyTorch oracle for one Kiln GPT-2 training step.

This module implements, as literally as possible, /work/shared/docs/training-semantics.md
("The GPT-2 training step, exactly"):

  * GPT-2 forward with Hugging Face names and Conv1D layout (linear weight [in, out],
    y = x @ W + b), tied lm_head (logits = ln_f(x) @ wte^T, no bias), tanh GELU,
    layernorm eps 1e-5 with biased variance, causal attention, mean cross-entropy;
  * the optimizer step: gradient accumulation (each micro-step contributes loss/accum),
    global grad norm + clipping (coef = max_norm / (n + 1e-6), applied if coef < 1; the
    reported norm is the one before clipping), the warm-up + cosine LR schedule (or constant),
    AdamW with PyTorch semantics written out by hand (decay set = every 2-D weight, wte and wpe
    included; no decay for biases and layernorm parameters);
  * the sequential llm.c-shard data loader (shards in file-name order, cyclic);
  * helpers: write_shard / read_shard, write_safetensors / read_safetensors (hand-written
    format: u64 LE header length, JSON header, raw data), init_params.

Everything is computed in float64; parameters loaded from float32 files are upcast exactly.
Only torch and numpy are used (no safetensors / transformers module).

Run `python3 gpt2_reference.py --self-test` to check the reference itself (gradcheck, an
independent torch.nn.functional implementation, torch.optim.AdamW, schedule values by hand,
data loader positions, file round trips).
"""
from __future__ import annotations

import glob as _glob
import json
import math
import os
import struct
import sys
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

DTYPE = torch.float64
SHARD_MAGIC = 20240520
SHARD_VERSION = 1
SHARD_HEADER_INTS = 256
PREFIX = "transformer."


# ----------------------------------------------------------------------------------------------
# Configuration and parameter names
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int

    def __post_init__(self):
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not a multiple of n_head={self.n_head}")

    @staticmethod
    def from_dict(d: dict) -> "GPTConfig":
        return GPTConfig(int(d["n_layer"]), int(d["n_head"]), int(d["n_embd"]),
                         int(d["vocab_size"]), int(d["block_size"]))


def param_shapes(cfg: GPTConfig) -> "OrderedDict[str, tuple]":
    """Parameter names (HF GPT2LMHeadModel, with the 'transformer.' prefix) -> shapes.
    No lm_head.weight: it is tied to transformer.wte.weight."""
    C, V, Tm = cfg.n_embd, cfg.vocab_size, cfg.block_size
    s = OrderedDict()
    s["transformer.wte.weight"] = (V, C)
    s["transformer.wpe.weight"] = (Tm, C)
    for i in range(cfg.n_layer):
        h = f"transformer.h.{i}."
        s[h + "ln_1.weight"] = (C,)
        s[h + "ln_1.bias"] = (C,)
        s[h + "attn.c_attn.weight"] = (C, 3 * C)
        s[h + "attn.c_attn.bias"] = (3 * C,)
        s[h + "attn.c_proj.weight"] = (C, C)
        s[h + "attn.c_proj.bias"] = (C,)
        s[h + "ln_2.weight"] = (C,)
        s[h + "ln_2.bias"] = (C,)
        s[h + "mlp.c_fc.weight"] = (C, 4 * C)
        s[h + "mlp.c_fc.bias"] = (4 * C,)
        s[h + "mlp.c_proj.weight"] = (4 * C, C)
        s[h + "mlp.c_proj.bias"] = (C,)
    s["transformer.ln_f.weight"] = (C,)
    s["transformer.ln_f.bias"] = (C,)
    return s


def is_decayed(name: str, shape) -> bool:
    """Decay set = every 2-D weight (matrices, wte, wpe); biases and layernorm params are not."""
    return len(shape) == 2


def canonical_name(name: str) -> str:
    """Normalise a file name to the 'transformer.'-prefixed form (lm_head.weight is kept)."""
    if name.startswith(PREFIX) or name.startswith("lm_head."):
        return name
    return PREFIX + name


def normalize_state(d: dict, cfg: GPTConfig | None = None) -> "OrderedDict[str, torch.Tensor]":
    """Apply the reader rules of the doc: accept names with or without 'transformer.', ignore
    attn.bias / attn.masked_bias buffers and an lm_head.weight equal to wte."""
    out = OrderedDict()
    for k, v in d.items():
        if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias"):
            continue
        out[canonical_name(k)] = v
    if "lm_head.weight" in out:
        lm = out.pop("lm_head.weight")
        wte = out.get("transformer.wte.weight")
        if wte is None or lm.shape != wte.shape or not torch.equal(lm, wte):
            raise ValueError("lm_head.weight present and not equal to transformer.wte.weight")
    if cfg is not None:
        shapes = param_shapes(cfg)
        missing = [k for k in shapes if k not in out]
        extra = [k for k in out if k not in shapes]
        bad = [k for k in shapes if k in out and tuple(out[k].shape) != shapes[k]]
        if missing or extra or bad:
            raise ValueError(f"state does not match config: missing={missing} extra={extra} "
                             f"bad shapes={[(k, tuple(out[k].shape), shapes[k]) for k in bad]}")
        out = OrderedDict((k, out[k]) for k in shapes)
    return out


# ----------------------------------------------------------------------------------------------
# Initialisation
# ----------------------------------------------------------------------------------------------
def init_params(cfg: GPTConfig, seed: int) -> "OrderedDict[str, torch.Tensor]":
    """Doc initialisation, deterministic in `seed`, returned as float32 tensors (what is written
    to the weight file): weight matrices and both embeddings ~ N(0, 0.02), the residual
    projections attn.c_proj.weight / mlp.c_proj.weight ~ N(0, 0.02/sqrt(2L)), biases 0,
    layernorm weight 1 / bias 0."""
    g = torch.Generator().manual_seed(int(seed))
    out = OrderedDict()
    for name, shape in param_shapes(cfg).items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
            t = torch.ones(shape, dtype=torch.float32)
        elif len(shape) == 1:
            t = torch.zeros(shape, dtype=torch.float32)
        else:
            std = 0.02
            if name.endswith("attn.c_proj.weight") or name.endswith("mlp.c_proj.weight"):
                std = 0.02 / math.sqrt(2 * cfg.n_layer)
            t = (torch.randn(shape, generator=g, dtype=torch.float64) * std).to(torch.float32)
        out[name] = t
    return out


def to_f64(params: dict) -> "OrderedDict[str, torch.Tensor]":
    return OrderedDict((k, v.detach().to(DTYPE).clone()) for k, v in params.items())


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------
def layernorm(x, w, b, eps=1e-5):
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)          # biased variance
    return (x - mu) / torch.sqrt(var + eps) * w + b


def gelu_tanh(u):
    return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))


def softmax_lastdim(z):
    z = z - z.max(dim=-1, keepdim=True).values.detach()
    e = torch.exp(z)
    return e / e.sum(dim=-1, keepdim=True)


def cross_entropy_mean(logits, targets):
    """mean over all positions of -log softmax(logits)[target]; logits [N, V], targets [N]."""
    m = logits.max(dim=-1, keepdim=True).values.detach()
    lse = torch.log(torch.exp(logits - m).sum(dim=-1)) + m.squeeze(-1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (lse - picked).mean()


def forward(params: dict, idx: torch.Tensor, targets: torch.Tensor | None, cfg: GPTConfig):
    """Returns (logits [B,T,V], loss or None). params: canonical names -> float64 tensors."""
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    hs = C // H
    assert T <= cfg.block_size, f"T={T} > block_size={cfg.block_size}"
    p = params
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][0:T]     # [B,T,C]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.n_layer):
        h = f"transformer.h.{i}."
        a = layernorm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]       # [B,T,3C]
        q, k, v = qkv.split(C, dim=-1)
        q = q.reshape(B, T, H, hs).transpose(1, 2)                               # [B,H,T,hs]
        k = k.reshape(B, T, H, hs).transpose(1, 2)
        v = v.reshape(B, T, H, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~causal, float("-inf"))
        att = softmax_lastdim(att)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)                          # concat heads
        x = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = layernorm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        u = m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"]
        x = x + gelu_tanh(u) @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    xf = layernorm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    logits = xf @ p["transformer.wte.weight"].t()                              # tied, no bias
    loss = None
    if targets is not None:
        loss = cross_entropy_mean(logits.reshape(B * T, -1), targets.reshape(B * T))
    return logits, loss


def forward_functional(params: dict, idx, targets, cfg: GPTConfig):
    """An independent formulation with torch.nn.functional primitives (used only by the
    self-test to cross-check `forward`)."""
    F = torch.nn.functional
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    hs = C // H
    p = params
    x = F.embedding(idx, p["transformer.wte.weight"]) + F.embedding(
        torch.arange(T), p["transformer.wpe.weight"]).unsqueeze(0)
    neg = torch.full((T, T), float("-inf"), dtype=DTYPE).triu(1)
    for i in range(cfg.n_layer):
        h = f"transformer.h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps=1e-5)
        qkv = F.linear(a, p[h + "attn.c_attn.weight"].t(), p[h + "attn.c_attn.bias"])
        heads = []
        for hh in range(H):
            q = qkv[..., hh * hs:(hh + 1) * hs]
            k = qkv[..., C + hh * hs:C + (hh + 1) * hs]
            v = qkv[..., 2 * C + hh * hs:2 * C + (hh + 1) * hs]
            s = torch.einsum("btd,bsd->bts", q, k) * (1.0 / math.sqrt(hs)) + neg
            heads.append(torch.einsum("bts,bsd->btd", F.softmax(s, dim=-1), v))
        y = torch.cat(heads, dim=-1)
        x = x + F.linear(y, p[h + "attn.c_proj.weight"].t(), p[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps=1e-5)
        u = F.linear(m, p[h + "mlp.c_fc.weight"].t(), p[h + "mlp.c_fc.bias"])
        x = x + F.linear(F.gelu(u, approximate="tanh"), p[h + "mlp.c_proj.weight"].t(),
                         p[h + "mlp.c_proj.bias"])
    xf = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps=1e-5)
    logits = F.linear(xf, p["transformer.wte.weight"])
    loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
    return logits, loss


def loss_and_grads(params: dict, idx, targets, cfg: GPTConfig, scale: float = 1.0):
    """float64 loss of one micro-batch and d(scale*loss)/d(params) (wte includes the tied use)."""
    leaves = OrderedDict((k, v.detach().to(DTYPE).clone().requires_grad_(True))
                         for k, v in params.items())
    _, loss = forward(leaves, idx, targets, cfg)
    grads = torch.autograd.grad(loss * scale, list(leaves.values()))
    return loss.item(), OrderedDict(zip(leaves.keys(), (g.detach() for g in grads)))


# ----------------------------------------------------------------------------------------------
# LR schedule
# ----------------------------------------------------------------------------------------------
def get_lr(step: int, lr: float, warmup_steps: int, total_steps: int,
           min_lr_ratio: float = 0.1, schedule: str = "cosine") -> float:
    """Doc formula. step s 0-based, W warm-up steps, S total steps (= --steps).
    cosine:   s < W: lr*(s+1)/W ; s > S: min_lr ; else r=(s-W)/(S-W),
              min_lr + 0.5*(1+cos(pi*r))*(lr-min_lr).
    constant: warm-up as above (if W > 0), then lr.  (The doc only says "a constant schedule
              is also offered"; this reference takes warm-up to apply to it too.)"""
    s, W, S = step, warmup_steps, total_steps
    min_lr = lr * min_lr_ratio
    if s < W:
        return lr * (s + 1) / W
    if schedule == "constant":
        return lr
    if schedule != "cosine":
        raise ValueError(f"unknown schedule {schedule!r}")
    if s > S:
        return min_lr
    if S == W:          # only reachable with s == S == W: r is 0/0; treat as end of decay
        return min_lr
    r = (s - W) / (S - W)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr - min_lr)


# ----------------------------------------------------------------------------------------------
# Data: llm.c shards and the sequential loader
# ----------------------------------------------------------------------------------------------
def write_shard(path: str, tokens) -> None:
    toks = np.asarray(tokens, dtype=np.int64)
    if toks.size and (toks.min() < 0 or toks.max() > 65535):
        raise ValueError("shard tokens must fit in uint16")
    header = np.zeros(SHARD_HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, toks.size
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype("<u2").tobytes())
    os.replace(tmp, path)


def read_shard(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < SHARD_HEADER_INTS * 4:
        raise ValueError(f"{path}: shorter than the 1024-byte header")
    header = np.frombuffer(data[:SHARD_HEADER_INTS * 4], dtype="<i4")
    if header[0] != SHARD_MAGIC:
        raise ValueError(f"{path}: bad magic {header[0]}")
    if header[1] != SHARD_VERSION:
        raise ValueError(f"{path}: bad version {header[1]}")
    n = int(header[2])
    body = data[SHARD_HEADER_INTS * 4:]
    if len(body) != 2 * n:
        raise ValueError(f"{path}: header says {n} tokens, file has {len(body) // 2}")
    return np.frombuffer(body, dtype="<u2").astype(np.int64)


class DataLoader:
    """Sequential loader of the doc (single process; rank/world_size kept for completeness)."""

    def __init__(self, files, B: int, T: int, rank: int = 0, world_size: int = 1):
        if isinstance(files, str):
            files = _glob.glob(files)
        self.files = sorted(files)   # file-name order (shards live in one directory)
        if not self.files:
            raise ValueError("no shard files")
        self.B, self.T, self.rank, self.world_size = B, T, rank, world_size
        self.shard_index = 0
        self.tokens = read_shard(self.files[0])
        self.pos = 0
        self.trace = []   # (shard index, pos) of every batch, for tests

    def next_batch(self):
        B, T, W = self.B, self.T, self.world_size
        start = self.pos + self.rank * B * T
        buf = self.tokens[start:start + B * T + 1]
        if buf.size != B * T + 1:
            raise RuntimeError(f"shard {self.files[self.shard_index]} too small for B*T+1 tokens")
        self.trace.append((self.shard_index, self.pos))
        x = torch.from_numpy(buf[:-1].copy()).view(B, T)
        y = torch.from_numpy(buf[1:].copy()).view(B, T)
        self.pos += B * T * W
        if self.pos + B * T * W + 1 > self.tokens.size:
            self.shard_index = (self.shard_index + 1) % len(self.files)
            self.tokens = read_shard(self.files[self.shard_index])
            self.pos = 0
        return x, y


# ----------------------------------------------------------------------------------------------
# Safetensors (hand-written)
# ----------------------------------------------------------------------------------------------
_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def write_safetensors(path: str, tensors: dict, metadata: dict | None = None) -> None:
    """Writes every tensor as little-endian float32 ("F32")."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        a = np.ascontiguousarray(torch.as_tensor(t).detach().cpu().to(torch.float32).numpy()).astype("<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)                      # align data to 8 bytes
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path: str) -> "OrderedDict[str, torch.Tensor]":
    """Reads F32/F64/F16/BF16/int tensors; returns tensors of their own dtype (BF16 -> float32),
    in file order of data offsets. Names are returned as stored."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} beyond end of file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = OrderedDict()
    items = [(k, v) for k, v in header.items() if k != "__metadata__"]
    items.sort(key=lambda kv: kv[1]["data_offsets"][0])
    for name, info in items:
        b, e = info["data_offsets"]
        raw = data[base + b:base + e]
        if len(raw) != e - b:
            raise ValueError(f"{path}: tensor {name} data beyond end of file")
        shape = tuple(info["shape"])
        dt = info["dtype"]
        if dt == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif dt in _ST_DTYPES:
            arr = np.frombuffer(raw, dtype=np.dtype(_ST_DTYPES[dt]).newbyteorder("<"))
        else:
            raise ValueError(f"{path}: unsupported dtype {dt} for {name}")
        count = int(np.prod(shape)) if shape else 1
        if arr.size != count:
            raise ValueError(f"{path}: tensor {name} has {arr.size} elements, shape {shape}")
        out[name] = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=True)).reshape(shape)
    return out


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------
@dataclass
class Hyper:
    lr: float = 6e-4
    warmup_steps: int = 0
    total_steps: int = 1
    min_lr_ratio: float = 0.1
    schedule: str = "cosine"
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0       # <= 0 disables clipping


def global_norm(grads: dict) -> float:
    return math.sqrt(sum(float((g.to(DTYPE) ** 2).sum()) for g in grads.values()))


class Trainer:
    """Float64 training state: parameters, AdamW m and v, step counter."""

    def __init__(self, cfg: GPTConfig, params: dict, hp: Hyper):
        self.cfg, self.hp = cfg, hp
        self.params = to_f64(normalize_state(params, cfg))
        self.m = OrderedDict((k, torch.zeros_like(v)) for k, v in self.params.items())
        self.v = OrderedDict((k, torch.zeros_like(v)) for k, v in self.params.items())
        self.step = 0

    def accumulate(self, loader: DataLoader, accum: int):
        """Returns (mean micro-step loss, grads = sum over micro-steps of d(loss/accum)/dp)."""
        grads, losses = None, []
        for _ in range(accum):
            x, y = loader.next_batch()
            loss, g = loss_and_grads(self.params, x, y, self.cfg, scale=1.0 / accum)
            losses.append(loss)
            if grads is None:
                grads = g
            else:
                for k in grads:
                    grads[k] += g[k]
        return sum(losses) / accum, grads

    def apply(self, grads: dict, lr: float):
        """Clip (if max_norm > 0 and coef < 1) then AdamW. Returns (norm before clip, clipped?)."""
        hp = self.hp
        n = global_norm(grads)
        clipped = False
        if hp.grad_clip > 0:
            coef = hp.grad_clip / (n + 1e-6)
            if coef < 1.0:
                clipped = True
                grads = OrderedDict((k, g * coef) for k, g in grads.items())
        t = self.step + 1
        bc1 = 1.0 - hp.beta1 ** t
        bc2 = 1.0 - hp.beta2 ** t
        for k, p in self.params.items():
            g = grads[k]
            if is_decayed(k, p.shape):
                p = p * (1.0 - lr * hp.weight_decay)
            m = hp.beta1 * self.m[k] + (1.0 - hp.beta1) * g
            v = hp.beta2 * self.v[k] + (1.0 - hp.beta2) * g * g
            p = p - lr * (m / bc1) / (torch.sqrt(v / bc2) + hp.eps)
            self.params[k], self.m[k], self.v[k] = p, m, v
        self.step += 1
        return n, clipped

    def train_step(self, loader: DataLoader, accum: int):
        lr = get_lr(self.step, self.hp.lr, self.hp.warmup_steps, self.hp.total_steps,
                    self.hp.min_lr_ratio, self.hp.schedule)
        step = self.step
        loss, grads = self.accumulate(loader, accum)
        n, clipped = self.apply(grads, lr)
        return {"step": step, "loss": loss, "lr": lr, "grad_norm": n, "clipped": clipped}


def run_reference(cfg: GPTConfig, params: dict, data_files, B: int, T: int, accum: int,
                  hp: Hyper, steps: int):
    """Convenience: a full run; returns the list of per-step dicts."""
    tr = Trainer(cfg, params, hp)
    loader = DataLoader(data_files, B, T)
    return [tr.train_step(loader, accum) for _ in range(steps)]


# ----------------------------------------------------------------------------------------------
# Self-test of the reference
# ----------------------------------------------------------------------------------------------
def _self_test() -> int:
    import tempfile
    torch.manual_seed(0)
    ok = True

    def report(name, err, tol):
        nonlocal ok
        good = err <= tol
        ok &= good
        print(f"  [{'ok' if good else 'FAIL'}] {name}: {err:.3e} (tol {tol:.0e})")

    # 1. gradcheck of the whole model (all parameters as inputs) on a tiny config.
    print("1. torch.autograd.gradcheck of forward (float64, finite differences)")
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=8, vocab_size=11, block_size=7)
    p0 = to_f64(init_params(cfg, seed=1))
    # non-trivial layernorm params and biases so their gradients are exercised
    for k in p0:
        if p0[k].dim() == 1:
            p0[k] = p0[k] + 0.1 * torch.randn_like(p0[k])
        else:
            p0[k] = p0[k] * 10.0    # larger weights: attention not uniform
    B, T = 2, 5
    idx = torch.randint(0, cfg.vocab_size, (B, T))
    tgt = torch.randint(0, cfg.vocab_size, (B, T))
    names = list(p0.keys())

    def f(*tensors):
        return forward(dict(zip(names, tensors)), idx, tgt, cfg)[1]

    inputs = tuple(p0[k].clone().requires_grad_(True) for k in names)
    gc = torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-8, rtol=1e-6, raise_exception=False)
    print(f"  [{'ok' if gc else 'FAIL'}] gradcheck over {sum(p.numel() for p in inputs)} parameters")
    ok &= bool(gc)

    # 2. independent torch.nn.functional formulation: loss and every gradient.
    print("2. cross-check against a torch.nn.functional implementation (awkward sizes)")
    cfg2 = GPTConfig(n_layer=3, n_head=3, n_embd=48, vocab_size=331, block_size=40)
    p2 = to_f64(init_params(cfg2, seed=2))
    for k in p2:
        if p2[k].dim() == 1:
            p2[k] = p2[k] + 0.05 * torch.randn_like(p2[k])
    idx = torch.randint(0, cfg2.vocab_size, (3, 24))
    tgt = torch.randint(0, cfg2.vocab_size, (3, 24))
    la = OrderedDict((k, v.clone().requires_grad_(True)) for k, v in p2.items())
    lb = OrderedDict((k, v.clone().requires_grad_(True)) for k, v in p2.items())
    _, loss_a = forward(la, idx, tgt, cfg2)
    _, loss_b = forward_functional(lb, idx, tgt, cfg2)
    ga = torch.autograd.grad(loss_a, list(la.values()))
    gb = torch.autograd.grad(loss_b, list(lb.values()))
    report("loss abs diff", abs(loss_a.item() - loss_b.item()), 1e-12)
    worst = max(float((x - y).norm() / max(y.norm(), 1e-300)) for x, y in zip(ga, gb))
    report("max grad rel diff over all params", worst, 1e-10)
    report("initial loss vs ln(V) (sanity, abs)", abs(loss_a.item() - math.log(cfg2.vocab_size)), 0.1)

    # 3. AdamW (with clipping and accumulation) vs torch.optim.AdamW(foreach=False).
    print("3. optimizer vs torch.optim.AdamW(foreach=False), 2 param groups, 8 steps")
    cfg3 = GPTConfig(n_layer=2, n_head=4, n_embd=32, vocab_size=97, block_size=16)
    init = init_params(cfg3, seed=3)
    hp = Hyper(lr=3e-3, warmup_steps=3, total_steps=8, min_lr_ratio=0.1, weight_decay=0.1,
               grad_clip=1.0)   # norms go ~1.4 -> ~0.8: clips on some steps only
    with tempfile.TemporaryDirectory() as d:
        gen = torch.Generator().manual_seed(5)
        toks = torch.randint(0, cfg3.vocab_size, (2000,), generator=gen).numpy()
        write_shard(os.path.join(d, "s_000.bin"), toks)
        tr = Trainer(cfg3, init, hp)
        ld1 = DataLoader(os.path.join(d, "s_*.bin"), 2, 16)
        ld2 = DataLoader(os.path.join(d, "s_*.bin"), 2, 16)
        tp = OrderedDict((k, torch.nn.Parameter(v.to(DTYPE).clone())) for k, v in init.items())
        groups = [
            {"params": [p for k, p in tp.items() if is_decayed(k, p.shape)], "weight_decay": hp.weight_decay},
            {"params": [p for k, p in tp.items() if not is_decayed(k, p.shape)], "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups, lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps, foreach=False)
        nclip, worst_p, worst_n = 0, 0.0, 0.0
        for s in range(hp.total_steps):
            rec = tr.train_step(ld1, accum=2)
            nclip += rec["clipped"]
            opt.zero_grad(set_to_none=True)
            for _ in range(2):
                x, y = ld2.next_batch()
                _, loss = forward(tp, x, y, cfg3)
                (loss / 2).backward()
            n = torch.nn.utils.clip_grad_norm_(list(tp.values()), hp.grad_clip)
            for gr in opt.param_groups:
                gr["lr"] = get_lr(s, hp.lr, hp.warmup_steps, hp.total_steps, hp.min_lr_ratio)
            opt.step()
            worst_n = max(worst_n, abs(float(n) - rec["grad_norm"]) / rec["grad_norm"])
            for k in tp:
                worst_p = max(worst_p, float((tr.params[k] - tp[k].detach()).norm() / tp[k].detach().norm()))
        report("max param rel diff after 8 steps", worst_p, 1e-10)
        report("max grad-norm rel diff (vs clip_grad_norm_)", worst_n, 1e-12)
        print(f"  clipping triggered on {nclip}/{hp.total_steps} steps")
        ok &= 0 < nclip < hp.total_steps

        # 4. data loader positions with two shards, the +1 boundary, and the cyclic wrap.
        print("4. data loader: shard order, +1 boundary, cyclic wrap")
        B, T = 2, 4                                     # B*T = 8
        a = np.arange(0, 8 * 3 + 1) % 60000             # exactly 3 batches (+1 token) in shard a
        b = (np.arange(0, 8 * 2 + 8) + 100)             # 24 tokens: 2 batches (needs 17, 25 > 24)
        write_shard(os.path.join(d, "t_001.bin"), b)
        write_shard(os.path.join(d, "t_000.bin"), a)
        ld = DataLoader([os.path.join(d, "t_001.bin"), os.path.join(d, "t_000.bin")], B, T)
        xs = [ld.next_batch() for _ in range(7)]
        expect = [(0, 0), (0, 8), (0, 16), (1, 0), (1, 8), (0, 0), (0, 8)]
        good = ld.trace == expect and int(xs[2][1][-1, -1]) == 24 and int(xs[3][0][0, 0]) == 100
        good &= torch.equal(xs[0][1].flatten(), torch.arange(1, 9)) and torch.equal(xs[5][0], xs[0][0])
        print(f"  [{'ok' if good else 'FAIL'}] trace {ld.trace}")
        ok &= good

        # 5. file round trips.
        print("5. safetensors / shard round trips")
        pth = os.path.join(d, "w.safetensors")
        write_safetensors(pth, init)
        back = read_safetensors(pth)
        good = list(back) == list(init) and all(torch.equal(back[k], init[k]) for k in init)
        with open(pth, "rb") as fh:
            (hn,) = struct.unpack("<Q", fh.read(8))
            hdr = json.loads(fh.read(hn))
        good &= all(v["dtype"] == "F32" for v in hdr.values()) and "lm_head.weight" not in hdr
        stripped = OrderedDict((k[len(PREFIX):], v) for k, v in back.items())
        stripped["lm_head.weight"] = back["transformer.wte.weight"].clone()
        stripped["h.0.attn.bias"] = torch.ones(1, 1, 4, 4)
        good &= list(normalize_state(stripped, cfg3)) == list(param_shapes(cfg3))
        good &= np.array_equal(read_shard(os.path.join(d, "t_000.bin")), a)
        print(f"  [{'ok' if good else 'FAIL'}] exact round trip, F32 on disk, prefix-less names accepted")
        ok &= good

    # 6. schedule values by hand (lr=1e-3, W=5, S=20, min ratio 0.1).
    print("6. LR schedule values by hand")
    hand = {0: 2e-4, 1: 4e-4, 4: 1e-3, 5: 1e-3,
            # s=12: r = 7/15, cos(pi*7/15) = 0.10452846326765347
            12: 1e-4 + 0.5 * (1 + 0.10452846326765347) * 9e-4,
            # s=19: r = 14/15, cos(pi*14/15) = -0.9781476007338057
            19: 1e-4 + 0.5 * (1 - 0.9781476007338057) * 9e-4,
            20: 1e-4, 21: 1e-4, 100: 1e-4}
    worst = max(abs(get_lr(s, 1e-3, 5, 20, 0.1) - v) / v for s, v in hand.items())
    report("max rel err of cosine schedule", worst, 1e-12)
    worst = max(abs(get_lr(s, 1e-3, 0, 20, 0.1) - v) / v for s, v in
                {0: 1e-3, 10: 1e-4 + 0.5 * 9e-4, 20: 1e-4}.items())
    report("max rel err of cosine schedule, no warm-up", worst, 1e-12)
    const = [get_lr(s, 1e-3, 2, 20, 0.1, "constant") for s in range(4)]
    report("constant schedule (warm-up then lr)", max(abs(a_ - b_) for a_, b_ in zip(const, [5e-4, 1e-3, 1e-3, 1e-3])), 1e-18)

    print("SELF-TEST", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if "--self-test" in sys.argv[1:]:
        sys.exit(_self_test())
    print(__doc__)
