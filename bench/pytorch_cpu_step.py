#!/usr/bin/python3
"""PyTorch eager's GPT-2 training step on the CPU: the peer of Kiln in bench/fusion_cpu.sh.

The model is the one Kiln compiles from a spec (../shared/docs/training-semantics.md): token +
position embedding, pre-LN blocks (layer norm eps 1e-5, causal multi-head attention, tanh-GELU
MLP), a final layer norm, the lm_head tied to the token embedding (no bias), mean cross-entropy.
Attention is F.scaled_dot_product_attention(is_causal=True) where torch has it (2.0 and later);
Debian 12's torch 1.13 does not, so there it is the usual eager formula (q k^T / sqrt(d), a causal
mask, softmax, @ v) and the JSON says so ("attention").

One step, timed as Kiln's `train` times its `dt_ms` (batch read, forward, backward, clip, AdamW):
  zero_grad(set_to_none) -> next B*T+1 tokens of the shard -> loss -> backward ->
  clip_grad_norm_(1.0) -> torch.optim.AdamW(foreach=True, lr 6e-4, betas (0.9, 0.95), eps 1e-8,
  weight decay 0.1 on the 2-D weights, none on biases and layer-norm parameters).
Precision is the spec's: fp32, or bf16 as Kiln's mixed precision (fp32 master weights and
optimizer): the forward and its backward under torch.autocast("cpu", dtype=torch.bfloat16), whose
matrix products run in bf16 (oneDNN, on AMX or AVX-512 BF16 where the CPU has them), the
cross-entropy in fp32. (Torch 1.13's CPU autocast leaves softmax and GELU in their input's bf16,
where Kiln computes attention's softmax in fp32: PyTorch does a little less fp32 work.)
The data are read like Kiln's loader reads llm.c shards (sequential windows of B*T+1 tokens,
advancing by B*T, files in name order, cyclic), so both see the same batches.

Threads: torch.set_num_threads(--threads, default os.cpu_count()), which is what Kiln's OpenMP
and OpenBLAS use by default; the JSON reports what torch then says.

Prints one JSON line on stdout (and writes it to --json if given): median_ms over the steps after
--warmup, every step's time, tokens/s, the first and last loss, threads, the torch version, the
attention implementation and which BLAS / oneDNN this torch uses.

With --eval, the peer of Kiln's `eval` (bench/eval_cpu.sh) instead: each step is one batch's
forward pass and mean loss under torch.no_grad() (model.eval(); autocast as above for bf16), as
Kiln's `forward` program computes it; no backward, no update.

Usage: bench/pytorch_cpu_step.py --spec SPEC.toml --data 'DIR/train_*.bin' [--steps 12]
         [--warmup 2] [--threads N] [--seed 1337] [--eval] [--json OUT]
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import statistics
import sys
import time
import tomllib

import numpy as np
import torch

from torch_gpt2_block import HAVE_SDPA, GPT2  # noqa: E402  (bench/ is on sys.path)
SHARD_MAGIC, SHARD_HEADER_BYTES = 20240520, 256 * 4


def read_spec(path: str) -> dict:
    with open(path, "rb") as f:
        spec = tomllib.load(f)
    m, c = spec["model"], spec.get("compile", {})
    cfg = dict(n_layer=int(m["n_layer"]), n_head=int(m["n_head"]), n_embd=int(m["n_embd"]),
               vocab_size=int(m["vocab_size"]), block_size=int(m["block_size"]),
               batch_size=int(c.get("batch_size", 1)),
               seq_len=int(c.get("seq_len", m["block_size"])),
               precision=c.get("precision", "fp32"))
    if cfg["precision"] not in ("fp32", "bf16"):
        sys.exit(f"pytorch_cpu_step.py: {path}: precision {cfg['precision']!r}; fp32 or bf16 are measured")
    return cfg


def read_shard(path: str) -> np.ndarray:
    header = np.fromfile(path, dtype=np.int32, count=256)
    if header.size != 256 or header[0] != SHARD_MAGIC:
        sys.exit(f"pytorch_cpu_step.py: {path}: not an llm.c token shard")
    n = int(header[2])
    tokens = np.fromfile(path, dtype=np.uint16, count=n, offset=SHARD_HEADER_BYTES)
    if tokens.size != n:
        sys.exit(f"pytorch_cpu_step.py: {path}: {tokens.size} tokens, header says {n}")
    return tokens


class Loader:
    """Sequential llm.c-shard batches, as Kiln's DataLoader: windows of B*T+1 tokens, stride B*T."""

    def __init__(self, pattern: str, B: int, T: int):
        self.files = sorted(glob.glob(pattern))
        if not self.files:
            sys.exit(f"pytorch_cpu_step.py: no shard matches {pattern!r}")
        self.B, self.T, self.file, self.pos = B, T, 0, 0
        self.tokens = read_shard(self.files[0])
        if self.tokens.size < B * T + 1:
            sys.exit(f"pytorch_cpu_step.py: {self.files[0]}: fewer than B*T+1 = {B * T + 1} tokens")

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.B * self.T
        if self.pos + n + 1 > self.tokens.size:
            self.file = (self.file + 1) % len(self.files)
            self.tokens, self.pos = read_shard(self.files[self.file]), 0
        buf = torch.from_numpy(self.tokens[self.pos:self.pos + n + 1].astype(np.int64))
        self.pos += n
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)


def blas_info() -> dict:
    """Which BLAS and oneDNN this torch uses: its build config, and the libraries loaded now."""
    cfg = torch.__config__.show()
    info = {m.group(1).lower(): m.group(2) for m in re.finditer(r"\b(BLAS_INFO|LAPACK_INFO)=([^,\s]+)", cfg)}
    info["mkl"] = bool(torch.backends.mkl.is_available())
    info["mkldnn"] = bool(torch.backends.mkldnn.is_available())
    m = re.search(r"MKL-DNN v([\d.]+)", cfg)
    if m:
        info["mkldnn_version"] = m.group(1)
    info["openmp"] = bool(torch.backends.openmp.is_available())
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                base = os.path.basename(path)
                if re.search(r"blas|lapack|mkl|dnnl|gomp|iomp", base):
                    libs.add(os.path.realpath(path))
    except OSError:
        pass
    info["loaded_libraries"] = sorted(libs)
    info["openblas"] = any("openblas" in p for p in libs)
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="model spec (TOML, as kilnc reads it)")
    ap.add_argument("--data", required=True, help="llm.c token shard(s): a file or a quoted glob")
    ap.add_argument("--steps", type=int, default=12, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch.set_num_threads (default os.cpu_count(): what Kiln uses)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--eval", action="store_true",
                    help="time the forward pass and loss alone, under torch.no_grad() (Kiln's eval)")
    ap.add_argument("--json", help="also write the JSON line to this file")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.threads < 1:
        ap.error("--steps >= 1, --warmup >= 0, --threads >= 1")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg = read_spec(a.spec)
    B, T = cfg["batch_size"], cfg["seq_len"]
    model = GPT2(cfg)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    loader = Loader(a.data, B, T)
    bf16 = cfg["precision"] == "bf16"

    if a.eval:
        model.eval()
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        x, y = loader.next()
        if a.eval:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(x, y)
            norm = 0.0
        else:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(x, y)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        losses.append(loss.item())  # (waits for the step's work, as Kiln reads its loss)
        dt = time.perf_counter() - t0
        if not (math.isfinite(losses[-1]) and math.isfinite(float(norm))):
            sys.exit(f"pytorch_cpu_step.py: step {step}: loss {losses[-1]}, grad norm {float(norm)}")
        if step >= a.warmup:
            times.append(dt * 1e3)

    med = statistics.median(times)
    out = {
        "config": "pytorch-eager-eval" if a.eval else "pytorch-eager",
        "precision": ("bf16 autocast, fp32 master weights (CPU autocast: softmax and GELU in bf16)"
                      if bf16 else "fp32"),
        "median_ms": med,
        "tokens_per_step": B * T,
        "tokens_per_s": B * T / (med / 1e3),
        "step_ms": times,
        "warmup": a.warmup,
        "steps": a.steps,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "threads_requested": a.threads,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "attention": "F.scaled_dot_product_attention" if HAVE_SDPA else
                     "eager softmax(q k^T / sqrt(d) + causal mask) @ v (this torch has no SDPA)",
        "optimizer": None if a.eval else "torch.optim.AdamW(foreach=True)",
        "parameters": sum(p.numel() for p in model.parameters()),
        "model": cfg,
        "blas": blas_info(),
    }
    line = json.dumps(out)
    print(line, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
