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
The exception is the bf16 parity reference of the doc's "Mixed precision (bf16)" section
(forward_bf16 / TrainerBF16 / run_reference_bf16): the same step in float32 under
torch.autocast("cpu", dtype=torch.bfloat16) with fp32 master weights, AdamW state and gradient
accumulation; its section documents what autocast does to each op of the model.
Only torch and numpy are used (no safetensors / transformers module).

Run `python3 gpt2_reference.py --self-test` to check the reference itself (gradcheck, an
independent torch.nn.functional implementation, torch.optim.AdamW, schedule values by hand,
data loader positions, file round trips; for bf16: autocast's behaviour per op, the bf16
reference against float64 and against an explicit emulation, its fp32 AdamW step).
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
    """Writes every tensor as little-endian float32 ("F32"), but torch.bool ones as "BOOL" (how
    some transformers versions store the attention-mask buffers)."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = torch.as_tensor(t).detach().cpu()
        boolean = t.dtype == torch.bool
        a = np.ascontiguousarray(t.numpy() if boolean else t.to(torch.float32).numpy().astype("<f4"))
        b = a.tobytes()
        header[name] = {"dtype": "BOOL" if boolean else "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
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
                  hp: Hyper, steps: int, final: dict | None = None):
    """Convenience: a full run; returns the list of per-step dicts, and puts the weights after
    the last step in `final` when given."""
    tr = Trainer(cfg, params, hp)
    loader = DataLoader(data_files, B, T)
    recs = [tr.train_step(loader, accum) for _ in range(steps)]
    if final is not None:
        final.update(tr.params)
    return recs


# ----------------------------------------------------------------------------------------------
# bf16 mixed precision: the autocast parity reference
# ----------------------------------------------------------------------------------------------
# The doc's bf16 reference is "the same model and training step run in float32 under
# torch.autocast(dtype=torch.bfloat16) around the forward and the loss", with fp32 master
# weights, fp32 gradient accumulation (.grad of the fp32 parameters) and fp32 AdamW state;
# clipping and schedule unchanged. `forward_bf16` is `forward` written so that autocast applies
# the doc's policy; `TrainerBF16` is `Trainer` with fp32 state.
#
# What torch.autocast("cpu", dtype=torch.bfloat16) actually does in torch 1.13 (Debian's
# 1.13.1+dfsg build, CPU), op by op of this model -- measured, and re-checked by --self-test (item 7,
# `autocast_op_dtypes`); "listed" = in autocast's CPU op lists, "not listed" = runs in the dtype
# of its inputs with the usual type promotion:
#
#   op of the model                          autocast on CPU (1.13)                   out dtype
#   ---------------------------------------  ---------------------------------------  ---------
#   wte[idx], wpe[0:T] (index / slice)       not listed                               fp32
#   residual x + branch (fp32 + bf16)        not listed; type promotion               fp32
#   layernorm, hand-written or F.layer_norm  not listed (NOT in the CPU fp32 list):   fp32
#     on the fp32 residual                   runs in fp32 because x is fp32; on a bf16
#                                            input F.layer_norm with fp32 weight fails
#   F.linear / addmm / mm / matmul / bmm     lower-precision list: every input cast   bf16
#     (`@`)                                  to bf16 (casts of leaf weights cached
#                                            per autocast region), output bf16
#   hand-written `x @ W + b`                 matmul bf16, then + fp32 bias PROMOTES   fp32
#                                            (so the reference uses F.linear, bias
#                                            inside the bf16 op, as nn.Linear and HF
#                                            Conv1D = addmm do)
#   scores / sqrt(hs), masked_fill           not listed, stay bf16 (the scale is      bf16
#                                            exact when hs is a power of 4: 16, 64)
#   softmax (F.softmax, torch.softmax,       NOT upcast on CPU (CUDA autocast has     bf16
#     log_softmax) on bf16 scores            softmax in its fp32 list)
#   F.gelu(approximate="tanh") on bf16       not listed, stays bf16; and the 1.13 CPU bf16
#                                            kernel rounds EVERY intermediate to bf16 bf16
#                                            (bit-equal to the hand-written formula
#                                            on bf16): 46% of outputs differ from the
#                                            correctly rounded GELU, 14% by >= 2 ulp,
#                                            tens of ulp in the negative tail (much of
#                                            it flushed to 0); norm-wise 1.5-3x the
#                                            error of one rounding, forward and
#                                            backward (CUDA computes it in fp32)
#   hand-written tanh / exp / pow / mean /   not listed: each op rounds to bf16       bf16
#     sum / cross_entropy_mean on bf16
#   F.cross_entropy on bf16 logits           fp32 list: logits cast to fp32 BEFORE    fp32
#                                            log_softmax (nll_loss also fp32 list)
#   torch.cat(bf16, fp32)                    promote list                             fp32
#   backward (outside the region)            every op's backward runs in its forward dtype
#                                            (bf16 matmul backward = bf16 matmuls, results
#                                            rounded to bf16); a cast's backward casts the
#                                            gradient back to the source dtype, so .grad of
#                                            the fp32 parameters is fp32 and accumulates in
#                                            fp32 across micro-steps (wte: embedding part in
#                                            fp32 + lm_head part rounded to bf16, summed fp32)
#
# bf16 matrix products on CPU: with oneDNN (the Debian build has it) on a CPU with AVX512BW/VL/DQ
# and m*n*k > 16^3 per product, ATen's bf16 mm/bmm/addmm accumulate in fp32 and round once
# (measured: bit-equal to the correctly rounded product for every shape of tiny.toml and
# awkward.toml). Otherwise (older CPUs, tiny products such as 8x16x16) ATen's own bf16 gemm
# accumulates in bf16: relative errors of 1e-2 (K=64) to 1e-1 (K=8192), not the doc's policy.
# So `TrainerBF16` can run every product through `_Bf16Linear` / `_Bf16Matmul` instead: an
# explicit emulation of "round the inputs to bf16, multiply-accumulate in fp32, round the output
# to bf16" with autocast's backward (gradients rounded to bf16 at the same points).
# `check_autocast_gemm` compares the two on the real shapes; test_parity.py uses autocast when
# they agree and the emulation (with a warning) when they do not.
#
# Hence the reference forward below, i.e. the doc's policy as autocast realises it:
#   * residual stream, embeddings, layernorm (statistics and output), softmax, cross-entropy,
#     loss, reductions: fp32;
#   * every matrix product (c_attn, c_proj, c_fc, mlp.c_proj with their biases, q k^T, att v,
#     the tied lm_head): bf16 inputs, fp32 accumulation, bf16 output; layernorm outputs and the
#     fp32 softmax probabilities are rounded to bf16 where they enter a product;
#   * GELU of the bf16 c_fc output evaluated in fp32 and rounded once to bf16
#     (`F.gelu(u.float()).to(bf16)`; backward likewise one rounding): one rounding per stored
#     bf16 value, as in Kiln's bf16 and in CUDA autocast (fp32 opmath), not the CPU bf16 kernel;
#   * attention softmax: the bf16 scores are upcast explicitly (`.float()`), as CUDA autocast
#     would and as the doc requires; the CPU autocast of 1.13 would leave it in bf16;
#   * cross-entropy from the bf16 logits upcast to fp32 (`.float()`; what the CPU fp32 list
#     does anyway).
BF16 = torch.bfloat16
F32 = torch.float32


def autocast_op_dtypes() -> "OrderedDict[str, str]":
    """The output dtype (or error) of every op kind of the model under CPU bf16 autocast; used by
    the self-test to confirm the table above on the installed torch."""
    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 8, generator=g)
    xb = x.to(BF16)
    W = torch.randn(8, 24, generator=g).requires_grad_(True)
    b = torch.zeros(24).requires_grad_(True)
    lw, lb = torch.ones(8), torch.zeros(8)
    E = torch.randn(11, 8, generator=g).requires_grad_(True)
    idx = torch.randint(0, 11, (2, 5), generator=g)
    tgt = torch.randint(0, 11, (10,), generator=g)
    ops = OrderedDict([
        ("index wte[idx]", lambda: E[idx]),
        ("residual fp32 + bf16", lambda: x + xb),
        ("layernorm (hand-written) fp32 in", lambda: layernorm(x, lw, lb)),
        ("F.layer_norm fp32 in", lambda: F.layer_norm(x, (8,), lw, lb)),
        ("F.layer_norm bf16 in", lambda: F.layer_norm(xb, (8,), lw, lb)),
        ("F.linear", lambda: F.linear(x, W.t(), b)),
        ("matmul @", lambda: x @ W),
        ("matmul @ + bias", lambda: x @ W + b),
        ("bmm", lambda: torch.bmm(x, x.transpose(1, 2))),
        ("bf16 / float", lambda: xb / 4.0),
        ("masked_fill bf16", lambda: xb.masked_fill(xb > 0, float("-inf"))),
        ("F.softmax bf16 in", lambda: torch.nn.functional.softmax(xb, -1)),
        ("softmax (hand-written) bf16 in", lambda: softmax_lastdim(xb)),
        ("F.gelu tanh bf16 in", lambda: F.gelu(xb, approximate="tanh")),
        ("tanh bf16 in", lambda: torch.tanh(xb)),
        ("F.cross_entropy bf16 in", lambda: F.cross_entropy(F.linear(x.reshape(10, 8), E), tgt)),
        ("cross_entropy (hand-written) bf16 in", lambda: cross_entropy_mean(F.linear(x.reshape(10, 8), E), tgt)),
    ])
    out = OrderedDict()
    with torch.autocast("cpu", dtype=BF16):
        for name, f in ops.items():
            try:
                out[name] = str(f().dtype).replace("torch.", "")
            except RuntimeError:
                out[name] = "error"
    return out


class _Bf16Linear(torch.autograd.Function):
    """y = bf16(bf16(x) @ bf16(w)^T + bf16(b)) with fp32 accumulation; w in nn.Linear layout
    [out, in]. Backward as autocast's: gradients of x, w, b are fp32 products of bf16 operands
    rounded to bf16, returned in the dtype of the corresponding input."""

    @staticmethod
    def forward(ctx, x, w, b):
        with torch.autocast("cpu", enabled=False):
            x16, w16 = x.to(BF16), w.to(BF16)
            y = torch.matmul(x16.to(F32), w16.to(F32).t())
            if b is not None:
                y = y + b.to(BF16).to(F32)
            ctx.save_for_backward(x16, w16)
            ctx.dtypes = (x.dtype, w.dtype, None if b is None else b.dtype)
            return y.to(BF16)

    @staticmethod
    def backward(ctx, gy):
        x16, w16 = ctx.saved_tensors
        xd, wd, bd = ctx.dtypes
        with torch.autocast("cpu", enabled=False):
            g = gy.to(BF16).to(F32)
            g2 = g.reshape(-1, g.shape[-1])
            gx = torch.matmul(g, w16.to(F32)).to(BF16).to(xd)
            gw = torch.matmul(g2.t(), x16.to(F32).reshape(-1, x16.shape[-1])).to(BF16).to(wd)
            gb = None if bd is None else g2.sum(0).to(BF16).to(bd)
        return gx, gw, gb


class _Bf16Matmul(torch.autograd.Function):
    """c = bf16(bf16(a) @ bf16(b)) with fp32 accumulation, same batch shape; autocast's backward."""

    @staticmethod
    def forward(ctx, a, b):
        with torch.autocast("cpu", enabled=False):
            a16, b16 = a.to(BF16), b.to(BF16)
            ctx.save_for_backward(a16, b16)
            ctx.dtypes = (a.dtype, b.dtype)
            return torch.matmul(a16.to(F32), b16.to(F32)).to(BF16)

    @staticmethod
    def backward(ctx, gc):
        a16, b16 = ctx.saved_tensors
        ad, bd = ctx.dtypes
        with torch.autocast("cpu", enabled=False):
            g = gc.to(BF16).to(F32)
            ga = torch.matmul(g, b16.to(F32).transpose(-2, -1)).to(BF16).to(ad)
            gb = torch.matmul(a16.to(F32).transpose(-2, -1), g).to(BF16).to(bd)
        return ga, gb


def forward_bf16(params: dict, idx: torch.Tensor, targets: torch.Tensor | None, cfg: GPTConfig,
                 emulate_gemm: bool = False):
    """`forward` for the bf16 reference. params: canonical names -> float32 tensors (the masters).
    Call it inside torch.autocast("cpu", dtype=torch.bfloat16) (see the table above for what
    that does to each op). emulate_gemm: run the products through _Bf16Linear / _Bf16Matmul
    instead of ATen's bf16 gemm (same policy, exact fp32 accumulation on every CPU).
    Returns (logits [B,T,V] bf16, loss fp32 or None)."""
    F = torch.nn.functional
    if emulate_gemm:
        def linear(x, w, b=None):           # w: nn.Linear layout [out, in]
            return _Bf16Linear.apply(x, w, b)
        matmul = _Bf16Matmul.apply
    else:
        linear, matmul = F.linear, torch.matmul
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    hs = C // H
    assert T <= cfg.block_size, f"T={T} > block_size={cfg.block_size}"
    p = params
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][0:T]     # fp32
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.n_layer):
        h = f"transformer.h.{i}."
        a = layernorm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])               # fp32
        qkv = linear(a, p[h + "attn.c_attn.weight"].t(), p[h + "attn.c_attn.bias"])  # bf16
        q, k, v = qkv.split(C, dim=-1)
        q = q.reshape(B, T, H, hs).transpose(1, 2)                               # [B,H,T,hs]
        k = k.reshape(B, T, H, hs).transpose(1, 2)
        v = v.reshape(B, T, H, hs).transpose(1, 2)
        att = matmul(q, k.transpose(-2, -1)) / math.sqrt(hs)                     # bf16
        att = att.float().masked_fill(~causal, float("-inf"))                    # fp32 softmax
        att = softmax_lastdim(att)
        y = matmul(att, v).transpose(1, 2).reshape(B, T, C)                      # bf16
        x = x + linear(y, p[h + "attn.c_proj.weight"].t(), p[h + "attn.c_proj.bias"])  # fp32
        m = layernorm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])               # fp32
        u = linear(m, p[h + "mlp.c_fc.weight"].t(), p[h + "mlp.c_fc.bias"])      # bf16
        g = F.gelu(u.float(), approximate="tanh").to(BF16)                       # bf16
        x = x + linear(g, p[h + "mlp.c_proj.weight"].t(), p[h + "mlp.c_proj.bias"])    # fp32
    xf = layernorm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])  # fp32
    logits = linear(xf, p["transformer.wte.weight"])                             # bf16, tied
    loss = None
    if targets is not None:
        loss = cross_entropy_mean(logits.float().reshape(B * T, -1), targets.reshape(B * T))
    return logits, loss


class TrainerBF16(Trainer):
    """The bf16 parity reference's training state: fp32 master parameters (loaded exactly from
    the same float32 file as the float64 Trainer), fp32 AdamW m and v. Forward and loss run under
    torch.autocast("cpu", dtype=torch.bfloat16); each micro-step backpropagates loss/accum into
    the .grad of the fp32 parameters (fp32 accumulation). Clipping, the global norm (of the fp32
    gradients), the schedule and AdamW are Trainer's, here on fp32 tensors."""

    def __init__(self, cfg: GPTConfig, params: dict, hp: Hyper, emulate_gemm: bool = False):
        self.cfg, self.hp = cfg, hp
        self.emulate_gemm = emulate_gemm
        self.params = OrderedDict((k, v.detach().to(F32).clone())
                                  for k, v in normalize_state(params, cfg).items())
        self.m = OrderedDict((k, torch.zeros_like(v)) for k, v in self.params.items())
        self.v = OrderedDict((k, torch.zeros_like(v)) for k, v in self.params.items())
        self.step = 0

    def accumulate(self, loader: DataLoader, accum: int):
        """Returns (mean micro-step loss, fp32 grads = sum over micro-steps of d(loss/accum)/dp)."""
        leaves = OrderedDict((k, v.detach().clone().requires_grad_(True)) for k, v in self.params.items())
        losses = []
        for _ in range(accum):
            x, y = loader.next_batch()
            with torch.autocast("cpu", dtype=BF16):
                _, loss = forward_bf16(leaves, x, y, self.cfg, self.emulate_gemm)
            assert loss.dtype == F32
            (loss / accum).backward()
            losses.append(loss.item())
        grads = OrderedDict((k, l.grad.detach() if l.grad is not None else torch.zeros_like(l))
                            for k, l in leaves.items())
        return sum(losses) / accum, grads


def run_reference_bf16(cfg: GPTConfig, params: dict, data_files, B: int, T: int, accum: int,
                       hp: Hyper, steps: int, emulate_gemm: bool = False):
    """`run_reference` for the bf16 reference."""
    tr = TrainerBF16(cfg, params, hp, emulate_gemm)
    loader = DataLoader(data_files, B, T)
    return [tr.train_step(loader, accum) for _ in range(steps)]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / max(||b||, 1e-12), in float64."""
    a, b = a.to(DTYPE), b.to(DTYPE)
    return float((a - b).norm() / max(float(b.norm()), 1e-12))


def scale_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """<a - b, b> / <b, b>: the component of a's error along b, i.e. a's relative scale error.
    Unbiased rounding (round-to-nearest-even) leaves it ~0 on average over the parameters;
    a biased one (truncation toward zero) shrinks every gradient by ~u/2 per rounding."""
    a, b = a.to(DTYPE), b.to(DTYPE)
    return float(((a - b) * b).sum() / max(float((b * b).sum()), 1e-300))


# The table above, as autocast_op_dtypes() reports it on torch 1.13 (checked by --self-test).
EXPECTED_AUTOCAST_DTYPES = OrderedDict([
    ("index wte[idx]", "float32"), ("residual fp32 + bf16", "float32"),
    ("layernorm (hand-written) fp32 in", "float32"), ("F.layer_norm fp32 in", "float32"),
    ("F.layer_norm bf16 in", "error"), ("F.linear", "bfloat16"), ("matmul @", "bfloat16"),
    ("matmul @ + bias", "float32"), ("bmm", "bfloat16"), ("bf16 / float", "bfloat16"),
    ("masked_fill bf16", "bfloat16"), ("F.softmax bf16 in", "bfloat16"),
    ("softmax (hand-written) bf16 in", "bfloat16"), ("F.gelu tanh bf16 in", "bfloat16"),
    ("tanh bf16 in", "bfloat16"), ("F.cross_entropy bf16 in", "float32"),
    ("cross_entropy (hand-written) bf16 in", "bfloat16"),
])


GEMM_AGREE_TOL = 2e-2     # ~5 u: autocast vs emulation when both round once (measured <= 5e-3)


def check_autocast_gemm(cfg: GPTConfig, params: dict, data_files, B: int, T: int, accum: int):
    """Step-0 loss and gradients of the autocast reference vs the explicit bf16 emulation on the
    real shapes. Returns (loss abs diff, max per-parameter grad rel diff, emulate?). Where ATen's
    bf16 gemm rounds once (oneDNN) the two differ only by fp32 summation order and the rare
    rounding tie or 1-ulp flip that then propagates: measured 1e-3 to 5e-3 (L = 1..12). An ATen
    gemm that accumulates in bf16 makes it 1e-2 to 1e-1, and then `emulate?` is True: the
    reference must use the emulation."""
    la, ga = TrainerBF16(cfg, params, Hyper()).accumulate(DataLoader(data_files, B, T), accum)
    le, ge = TrainerBF16(cfg, params, Hyper(), emulate_gemm=True).accumulate(
        DataLoader(data_files, B, T), accum)
    dl, dg = abs(la - le), max(rel_err(ga[k], ge[k]) for k in ga)
    return dl, dg, not dg <= GEMM_AGREE_TOL


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

    # 7. what autocast does per op (the table of the bf16 section).
    print("7. torch.autocast(\"cpu\", bfloat16) per op (the table in the bf16 section)")
    got = autocast_op_dtypes()
    bad = [f"{k}: {got.get(k)} (table: {v})" for k, v in EXPECTED_AUTOCAST_DTYPES.items() if got.get(k) != v]
    print(f"  [{'ok' if not bad else 'FAIL'}] {len(got)} ops as in the table" +
          "".join(f"\n    differs: {b_}" for b_ in bad))
    ok &= not bad
    x16 = (torch.randn(4096) * 3).to(BF16)
    ge = torch.nn.functional.gelu(x16, approximate="tanh")
    print(f"  [info] F.gelu on bf16 equals the correctly rounded GELU for "
          f"{float((ge == gelu_tanh(x16.to(DTYPE)).to(BF16)).float().mean()):.0%} of inputs "
          f"(the reference evaluates GELU in fp32 and rounds once)")

    # 8. the bf16 (autocast) reference: dtypes, vs the float64 reference, vs the emulation.
    print("8. bf16 autocast reference vs float64 (awkward sizes; fp32 masters, AdamW state, grads)")
    with tempfile.TemporaryDirectory() as d:
        B, T = 3, 24
        gen = torch.Generator().manual_seed(7)
        sh = os.path.join(d, "b_000.bin")
        write_shard(sh, torch.randint(0, cfg2.vocab_size, (8 * B * T + 1,), generator=gen).numpy())
        w2 = init_params(cfg2, seed=2)
        dl, dg, emulate = check_autocast_gemm(cfg2, w2, [sh], B, T, 2)
        print(f"  [info] autocast vs explicit bf16 gemm emulation: loss {dl:.1e}, grads {dg:.1e} -> "
              f"{'EMULATION (this CPU/torch accumulates bf16 products in bf16)' if emulate else 'autocast'}")
        l64, g64 = Trainer(cfg2, w2, Hyper()).accumulate(DataLoader([sh], B, T), 2)
        for emu in sorted({emulate, True}):
            tb = TrainerBF16(cfg2, w2, Hyper(), emulate_gemm=emu)
            l16, g16 = tb.accumulate(DataLoader([sh], B, T), 2)
            tag = "emulated gemm" if emu else "autocast"
            good = all(g.dtype == F32 for g in g16.values()) and all(p_.dtype == F32 for p_ in tb.params.values())
            print(f"  [{'ok' if good else 'FAIL'}] {tag}: gradients and master weights are float32")
            ok &= good
            report(f"{tag}: step-0 loss abs diff vs float64", abs(l16 - l64), 1e-3)
            report(f"{tag}: max per-parameter grad rel err vs float64",
                   max(rel_err(g16[k], g64[k]) for k in g64), 2e-2)
            report(f"{tag}: |mean grad scale err| vs float64 (rounding bias)",
                   abs(sum(scale_err(g16[k], g64[k]) for k in g64) / len(g64)), 2e-3)
        # the fp32 optimizer step == torch.optim.AdamW on float32 parameters, clipping included
        hpb = Hyper(lr=3e-3, weight_decay=0.1, grad_clip=0.5)
        tb = TrainerBF16(cfg2, w2, hpb)
        _, g16 = tb.accumulate(DataLoader([sh], B, T), 2)
        tp = OrderedDict((k, torch.nn.Parameter(v.clone())) for k, v in tb.params.items())
        groups = [
            {"params": [p for k, p in tp.items() if is_decayed(k, p.shape)], "weight_decay": hpb.weight_decay},
            {"params": [p for k, p in tp.items() if not is_decayed(k, p.shape)], "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups, lr=hpb.lr, betas=(hpb.beta1, hpb.beta2), eps=hpb.eps, foreach=False)
        for k, p in tp.items():
            p.grad = g16[k].clone()
        torch.nn.utils.clip_grad_norm_(list(tp.values()), hpb.grad_clip)
        opt.step()
        n, clipped = tb.apply(g16, hpb.lr)
        good = clipped and all(t.dtype == F32 for dct in (tb.params, tb.m, tb.v) for t in dct.values())
        print(f"  [{'ok' if good else 'FAIL'}] AdamW step on float32 state (m, v, masters float32; clipped)")
        ok &= good
        report("AdamW float32 step vs torch.optim.AdamW (max param rel diff)",
               max(rel_err(tb.params[k], tp[k].detach()) for k in tp), 1e-6)

        # a short training run: bf16 reference vs float64 reference, clipping on some steps
        print("  8-step run, cfg of item 3 (L2 H4 C32 V97), accum 2, warm-up + cosine, clip")
        sh3 = os.path.join(d, "c_000.bin")
        write_shard(sh3, torch.randint(0, cfg3.vocab_size, (2000,), generator=gen).numpy())
        hp3 = Hyper(lr=3e-3, warmup_steps=3, total_steps=8, min_lr_ratio=0.1, weight_decay=0.1, grad_clip=1.0)
        r64 = run_reference(cfg3, init, [sh3], 2, 16, 2, hp3, 8)
        for emu in sorted({check_autocast_gemm(cfg3, init, [sh3], 2, 16, 2)[2], True}):
            r16 = run_reference_bf16(cfg3, init, [sh3], 2, 16, 2, hp3, 8, emulate_gemm=emu)
            tag = "emulated gemm" if emu else "autocast"
            report(f"{tag}: max loss abs diff over 8 steps",
                   max(abs(x["loss"] - y["loss"]) for x, y in zip(r16, r64)), 1e-2)
            report(f"{tag}: max grad-norm rel diff over 8 steps",
                   max(abs(x["grad_norm"] - y["grad_norm"]) / y["grad_norm"] for x, y in zip(r16, r64)), 2e-2)

    # 9. a model so small that ATen's bf16 gemm accumulates in bf16: the check must see it and
    #    the emulation must still be a bf16 approximation of the float64 gradients.
    print("9. tiny products (C=8, hs=4, T=5): ATen's bf16 gemm path is detected, emulation is used")
    with tempfile.TemporaryDirectory() as d:
        sh = os.path.join(d, "s_000.bin")
        gen = torch.Generator().manual_seed(9)
        write_shard(sh, torch.randint(0, cfg.vocab_size, (41,), generator=gen).numpy())
        w1 = init_params(cfg, seed=1)
        dl, dg, emulate = check_autocast_gemm(cfg, w1, [sh], 2, 5, 2)
        print(f"  [{'ok' if emulate else 'FAIL'}] autocast vs emulation grads differ by {dg:.1e} > "
              f"{GEMM_AGREE_TOL:.0e}: emulation selected")
        ok &= emulate
        l64, g64 = Trainer(cfg, w1, Hyper()).accumulate(DataLoader([sh], 2, 5), 2)
        _, ga = TrainerBF16(cfg, w1, Hyper()).accumulate(DataLoader([sh], 2, 5), 2)
        _, g16 = TrainerBF16(cfg, w1, Hyper(), emulate_gemm=True).accumulate(DataLoader([sh], 2, 5), 2)
        print(f"  [info] autocast with the bf16-accumulating gemm: max grad rel err vs float64 "
              f"{max(rel_err(ga[k], g64[k]) for k in g64):.1e}")
        # 5e-2: test_parity's bf16 gradient tolerance; with C=8 a single gradient element
        # carries a large share of a parameter's norm, so errors are less averaged than above.
        report("emulated gemm: max per-parameter grad rel err vs float64",
               max(rel_err(g16[k], g64[k]) for k in g64), 5e-2)

    print("SELF-TEST", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if "--self-test" in sys.argv[1:]:
        sys.exit(_self_test())
    print(__doc__)
