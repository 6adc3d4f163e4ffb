#!/usr/bin/env python3
"""PyTorch's GPT-2 training step on a GPU (eager or torch.compile): the peer of Kiln's CUDA target.

The model and step are the ones Kiln compiles (../shared/docs/training-semantics.md): token +
position embedding, pre-LN blocks (layer norm eps 1e-5, causal multi-head attention, tanh-GELU
MLP), a final layer norm, the lm_head tied to the token embedding (no bias), mean cross-entropy.
As in Kiln, the token embedding is padded to Vp = the vocabulary rounded up to a multiple of 128
(GPT-2: 50257 -> 50304); the padded logits are sliced off before the (fp32) cross-entropy, so
they take no part in the softmax and the padded rows of wte get no gradient.
Attention is F.scaled_dot_product_attention(is_causal=True) where torch has it (2.0 and later);
older torch (Debian 12's 1.13) gets the explicit formula (q k^T / sqrt(d), causal mask, softmax,
@ v) and the JSON says so ("attention").

Precision "bf16" (the default on CUDA) is Kiln's bf16 policy: fp32 master weights, the forward
and the loss under torch.autocast(dtype=torch.bfloat16), the cross-entropy in fp32, fp32 AdamW
state. "fp32" runs everything in float32 (the default on the CPU).

One timed step: zero_grad(set_to_none) -> copy the next batch to the device (pinned memory,
non_blocking) -> loss -> backward -> clip_grad_norm_(1.0) -> AdamW(fused=True where this torch
and device have it, else foreach; lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the
2-D weights, none on biases and layer-norm parameters). The batches are random tokens (a pool of 8
made once, cycled) unless --data names llm.c shards, read sequentially like Kiln's loader. On CUDA
each step is timed with CUDA events (no synchronisation inside the timed loop: the loss is read
after it); the wall time of the whole timed loop is reported too. --mode compile wraps the model
(forward + loss) in torch.compile; clipping and AdamW stay eager (fused AdamW: multi-tensor
kernels). The first warm-up step's time (compilation included) is "first_step_s".

Model FLOPs per step (kiln-inspect's and Kiln's MFU rule, the lecture's and PaLM's):
    6 * N_params * tokens + 12 * L * C * T * tokens
with N_params all the parameters (wte padded to Vp, wpe included; 124,475,904 for GPT-2 124M),
tokens = B * T. Achieved TFLOP/s = that / median step time; with --peak-tflops, mfu = achieved /
peak.

Prints one JSON line on stdout (and writes it to --json): mode, B, T, median/mean/min step ms,
every step's ms, tokens/s, flops_per_step (+ the formula), achieved_tflops, peak memory, the first
and last loss, and what ran (torch, GPU, attention, optimizer, precision). A run that does not fit
in memory prints {"error": "out of memory", ...} and exits 3; --mode compile on a torch without
torch.compile prints {"skipped": ...} and exits 0.

--peak-matmul instead measures the bf16 matrix-product rate: an N x N x N torch.matmul (N = 8192
by default), --matmul-iters products between two CUDA events, best and median of
--matmul-repeats such timings after 3 warm-up products, 2 N^3 FLOPs each; prints JSON with
peak_tflops (the best). It also measures the memory bandwidth the same way: a --copy-mib MiB
tensor copied into another (read + write counted), bandwidth_gbs the best (kiln-inspect
--roofline's memory rate).

--attention instead times causal attention alone, forward + backward, as F.scaled_dot_product_attention
with each backend this torch offers (flash, efficient, cudnn; math only on the CPU), at the
training shape (B, H = n_head, T, head size n_embd / n_head; bf16 on CUDA): the peers of Kiln's
attention kernels (kiln-run --profile's attention and attention_grad rows). Prints JSON with the
median ms per backend.

Usage:
  pytorch_gpu_step.py --attention [-B 16] [-T 1024] [--json F]
  pytorch_gpu_step.py [--mode eager|compile] [-B 16] [-T 1024] [--steps 20] [--warmup 5] [--json F]
  pytorch_gpu_step.py --peak-matmul [--matmul-size 8192] [--json F]
  pytorch_gpu_step.py --device cpu --tiny --mode eager        # a smoke test without a GPU
(--tiny: L=2 H=4 C=64 V=512 Tmax=64, B=2 T=32, 1 warm-up + 3 timed steps.)
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import platform
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_gpt2_block import HAVE_SDPA, GPT2  # noqa: E402  (bench/ is on sys.path)
HAVE_COMPILE = hasattr(torch, "compile")
SHARD_MAGIC, SHARD_HEADER_INTS = 20240520, 256
GPT2_124M = dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=1024)
TINY = dict(n_layer=2, n_head=4, n_embd=64, vocab_size=512, block_size=64)
FLOPS_FORMULA = ("6 * N_params * tokens + 12 * n_layer * n_embd * T * tokens; N_params = all "
                 "parameters (wte padded to Vp, wpe included), tokens = B * T (kiln-inspect's rule)")


def is_oom(e: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or (isinstance(e, RuntimeError) and "out of memory" in str(e))


# --- data -----------------------------------------------------------------------------------------
def read_shard(path: str) -> torch.Tensor:
    import numpy as np  # only --data needs numpy
    header = np.fromfile(path, dtype="<i4", count=SHARD_HEADER_INTS)
    if header.size != SHARD_HEADER_INTS or header[0] != SHARD_MAGIC:
        sys.exit(f"pytorch_gpu_step.py: {path}: not an llm.c token shard")
    n = int(header[2])
    tokens = np.fromfile(path, dtype="<u2", count=n, offset=SHARD_HEADER_INTS * 4)
    if tokens.size != n:
        sys.exit(f"pytorch_gpu_step.py: {path}: {tokens.size} tokens, header says {n}")
    return torch.from_numpy(tokens.astype("int64"))


class ShardLoader:
    """Sequential llm.c-shard batches, as Kiln's loader: windows of B*T+1 tokens, stride B*T."""

    def __init__(self, pattern: str, B: int, T: int, vocab: int):
        self.files = sorted(glob.glob(pattern))
        if not self.files:
            sys.exit(f"pytorch_gpu_step.py: no shard matches {pattern!r}")
        self.B, self.T, self.vocab, self.file, self.pos = B, T, vocab, 0, 0
        self.tokens = self._load(0)

    def _load(self, i: int) -> torch.Tensor:
        t = read_shard(self.files[i])
        if t.numel() < self.B * self.T + 1:
            sys.exit(f"pytorch_gpu_step.py: {self.files[i]}: fewer than B*T+1 = {self.B * self.T + 1} tokens")
        if int(t.max()) >= self.vocab:
            sys.exit(f"pytorch_gpu_step.py: {self.files[i]}: token {int(t.max())} >= vocab_size {self.vocab}")
        return t

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.B * self.T
        if self.pos + n + 1 > self.tokens.numel():
            self.file = (self.file + 1) % len(self.files)
            self.tokens, self.pos = self._load(self.file), 0
        buf = self.tokens[self.pos:self.pos + n + 1]
        self.pos += n
        return buf[:-1].reshape(self.B, self.T), buf[1:].reshape(self.B, self.T)


class RandomLoader:
    """A pool of random-token batches, made once and cycled (the data do not change the time)."""

    def __init__(self, B: int, T: int, vocab: int, seed: int, pin: bool, pool: int = 8):
        g = torch.Generator().manual_seed(seed)
        self.batches = []
        for _ in range(pool):
            buf = torch.randint(0, vocab, (B * T + 1,), generator=g, dtype=torch.int64)
            x, y = buf[:-1].reshape(B, T).contiguous(), buf[1:].reshape(B, T).contiguous()
            self.batches.append((x.pin_memory(), y.pin_memory()) if pin else (x, y))
        self.i = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.batches[self.i % len(self.batches)]
        self.i += 1
        return b


def make_optimizer(model: nn.Module, device: str) -> tuple[torch.optim.Optimizer, str]:
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    if device == "cuda":
        try:
            return torch.optim.AdamW(groups, fused=True, **kw), "torch.optim.AdamW(fused=True)"
        except (TypeError, RuntimeError):   # a torch without fused AdamW
            pass
    return torch.optim.AdamW(groups, foreach=True, **kw), "torch.optim.AdamW(foreach=True)"


# --- environment ----------------------------------------------------------------------------------
def environment(device: str) -> dict:
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": device,
           "host_cpus": os.cpu_count()}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 2),
                   sm_count=p.multi_processor_count, capability=f"{p.major}.{p.minor}",
                   cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    else:
        env["threads"] = torch.get_num_threads()
    if hasattr(torch, "get_float32_matmul_precision"):
        env["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return env


def emit(out: dict, path: str | None) -> None:
    line = json.dumps(out)
    print(line, flush=True)
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")


# --- --peak-matmul --------------------------------------------------------------------------------
def timed(fn, iters: int, device: str) -> float:
    """Seconds for `iters` calls of fn, between two CUDA events (or on the host clock)."""
    if device != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return time.perf_counter() - t0
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / 1e3


def peak_matmul(a, device: str) -> dict:
    n = a.matmul_size
    out = {"bench": "peak_matmul", "dtype": "bfloat16", "n": n, "iters": a.matmul_iters,
           "repeats": a.matmul_repeats, "flops_per_matmul": 2 * n ** 3, **environment(device)}
    g = torch.Generator(device=device).manual_seed(a.seed)
    x = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
    y = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
    z = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(x, y, out=z)
    rates = [2 * n ** 3 * a.matmul_iters / timed(lambda: torch.matmul(x, y, out=z), a.matmul_iters, device) / 1e12
             for _ in range(a.matmul_repeats)]
    out.update(peak_tflops=max(rates), median_tflops=statistics.median(rates), tflops_each=rates)
    del x, y, z
    # Memory bandwidth: one large device-to-device copy, its bytes read and written. A failure
    # here keeps the matmul peak.
    try:
        nbytes = a.copy_mib * 2**20
        src = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
        dst = torch.empty_like(src)
        for _ in range(2):
            dst.copy_(src)
        rates = [2 * nbytes * a.matmul_iters / timed(lambda: dst.copy_(src), a.matmul_iters, device) / 1e9
                 for _ in range(a.matmul_repeats)]
        out.update(copy_bytes=nbytes, bandwidth_gbs=max(rates), bandwidth_gbs_each=rates)
    except Exception as e:  # noqa: BLE001 (reported, not raised)
        out["bandwidth_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


# --- --attention ----------------------------------------------------------------------------------
def attention_bench(a, device: str) -> dict:
    cfg = dict(TINY if a.tiny else GPT2_124M)
    B = a.batch_size if a.batch_size is not None else (2 if a.tiny else 16)
    T = a.seq_len if a.seq_len is not None else (32 if a.tiny else 1024)
    H, hs = cfg["n_head"], cfg["n_embd"] // cfg["n_head"]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    out = {"bench": "attention", "B": B, "H": H, "T": T, "head_size": hs, "dtype": str(dtype).split(".")[-1],
           "causal": True, "what": "forward + backward of F.scaled_dot_product_attention", **environment(device)}
    if not hasattr(F, "scaled_dot_product_attention"):
        out["skipped"] = f"torch {torch.__version__} has no scaled_dot_product_attention"
        return out
    g = torch.Generator(device=device).manual_seed(a.seed)
    q, k, v = (torch.randn(B, H, T, hs, device=device, dtype=dtype, generator=g).requires_grad_() for _ in range(3))
    dout = torch.randn(B, H, T, hs, device=device, dtype=dtype, generator=g)
    backends = {"default": None}
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        names = ("flash", "efficient", "cudnn") if device == "cuda" else ("math",)
        for name in names:
            attr = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                    "math": "MATH"}[name]
            if hasattr(SDPBackend, attr):
                backends[name] = getattr(SDPBackend, attr)
    except ImportError:
        pass
    iters = 3 if a.tiny else 20
    results = {}
    for name, backend in backends.items():
        import contextlib
        ctx = contextlib.nullcontext() if backend is None else sdpa_kernel(backend)
        try:
            with ctx:
                times = []
                for i in range(iters + 3):
                    q.grad = k.grad = v.grad = None
                    if device == "cuda":
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                    t0 = time.perf_counter()
                    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    y.backward(dout)
                    if device == "cuda":
                        e1.record()
                        e1.synchronize()
                        ms = e0.elapsed_time(e1)
                    else:
                        ms = (time.perf_counter() - t0) * 1e3
                    if i >= 3:
                        times.append(ms)
            results[name] = {"median_ms": statistics.median(times), "min_ms": min(times)}
        except Exception as e:  # a backend this GPU, dtype or shape does not support
            results[name] = {"error": str(e).splitlines()[0][:200]}
    # Causal: about half of the 4 B H T^2 hs forward and 8 B H T^2 hs backward FLOPs.
    out.update(backends=results, flops=6.0 * B * H * T * T * hs)
    return out


# --- the training step ----------------------------------------------------------------------------
def train_bench(a, device: str) -> tuple[dict, int]:
    cfg = dict(TINY if a.tiny else GPT2_124M)
    for k in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"):
        if getattr(a, k) is not None:
            cfg[k] = getattr(a, k)
    cfg["padded_vocab"] = -(-cfg["vocab_size"] // a.pad_to) * a.pad_to
    B = a.batch_size if a.batch_size is not None else (2 if a.tiny else 16)
    T = a.seq_len if a.seq_len is not None else (32 if a.tiny else 1024)
    steps = a.steps if a.steps is not None else (3 if a.tiny else 20)
    warmup = a.warmup if a.warmup is not None else (1 if a.tiny else 5)
    precision = a.precision or ("bf16" if device == "cuda" else "fp32")
    if T > cfg["block_size"]:
        sys.exit(f"pytorch_gpu_step.py: T={T} > block_size {cfg['block_size']}")
    if cfg["n_embd"] % cfg["n_head"]:
        sys.exit("pytorch_gpu_step.py: n_embd must be a multiple of n_head")
    tokens = B * T
    out = {"bench": "pytorch_gpu_step", "mode": a.mode, "B": B, "T": T, "tokens_per_step": tokens,
           "model": cfg, "precision": "bf16 autocast, fp32 master weights" if precision == "bf16" else "fp32",
           "warmup": warmup, "steps": steps, **environment(device)}
    if a.mode == "compile" and not HAVE_COMPILE:
        out["skipped"] = f"torch.compile is not available in torch {torch.__version__}"
        return out, 0

    torch.manual_seed(a.seed)
    model = GPT2(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    flops = 6 * n_params * tokens + 12 * cfg["n_layer"] * cfg["n_embd"] * T * tokens
    opt, opt_name = make_optimizer(model, device)
    out.update(parameters=n_params, flops_per_step=flops, flops_formula=FLOPS_FORMULA, optimizer=opt_name,
               attention="F.scaled_dot_product_attention(is_causal=True)" if HAVE_SDPA else
                         "explicit softmax(q k^T / sqrt(d) + causal mask) @ v (this torch has no SDPA)",
               grad_clip=1.0, data=a.data or "random tokens (8 batches, cycled)")
    step_model = model
    if a.mode == "compile":
        step_model = torch.compile(model, **({} if a.compile_mode == "default" else {"mode": a.compile_mode}))
        out["compile_mode"] = a.compile_mode
    pin = device == "cuda"
    loader = ShardLoader(a.data, B, T, cfg["vocab_size"]) if a.data else \
        RandomLoader(B, T, cfg["vocab_size"], a.seed, pin)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=precision == "bf16")

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        opt.zero_grad(set_to_none=True)
        x, y = loader.next()
        if pin and not x.is_pinned():
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast:
            loss = step_model(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach().clone(), norm.detach().clone()   # clone: CUDA-graph modes reuse outputs

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    losses, norms, ms = [], [], []
    try:
        for i in range(warmup):
            t0 = time.perf_counter()
            loss, norm = step()
            sync()
            if i == 0:
                out["first_step_s"] = time.perf_counter() - t0
            losses.append(loss)
            norms.append(norm)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
            sync()
            t0 = time.perf_counter()
            for e0, e1 in ev:
                e0.record()
                loss, norm = step()
                e1.record()
                losses.append(loss)
                norms.append(norm)
            sync()
            wall = time.perf_counter() - t0
            ms = [e0.elapsed_time(e1) for e0, e1 in ev]
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                t1 = time.perf_counter()
                loss, norm = step()
                ms.append((time.perf_counter() - t1) * 1e3)
                losses.append(loss)
                norms.append(norm)
            wall = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001: out of memory, or torch.compile failing, is a result
        if is_oom(e):
            out["error"] = "out of memory"
            out["detail"] = str(e).splitlines()[0][:300]
            if device == "cuda":
                out["gpu_memory_reserved_gib"] = torch.cuda.memory_reserved() / 2**30
            return out, 3
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:500] if str(e) else ''}"
        return out, 4

    lv = [float(x) for x in losses]
    nv = [float(x) for x in norms]
    med = statistics.median(ms)
    out.update(median_ms=med, mean_ms=statistics.mean(ms), min_ms=min(ms), max_ms=max(ms),
               mean_ms_wall=wall * 1e3 / steps, step_ms=ms,
               tokens_per_s=tokens / (med / 1e3), achieved_tflops=flops / (med / 1e3) / 1e12,
               loss_first=lv[0], loss_last=lv[-1], grad_norm_last=nv[-1])
    if a.peak_tflops:
        out["peak_tflops"] = a.peak_tflops
        out["mfu"] = out["achieved_tflops"] / a.peak_tflops
    if device == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["peak_memory_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        out["peak_memory_note"] = "torch.cuda.max_memory_allocated / _reserved over the timed steps"
    else:
        out["peak_memory_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        out["peak_memory_note"] = "the process's peak resident set (ru_maxrss)"
    if not all(math.isfinite(x) for x in lv + nv):
        out["error"] = "non-finite loss or gradient norm"
        return out, 5
    return out, 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring (head -60 bench/pytorch_gpu_step.py) for details.")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--tiny", action="store_true", help="L=2 H=4 C=64 V=512 Tmax=64, B=2 T=32, 1+3 steps")
    ap.add_argument("-B", "--batch-size", type=int, help="micro-batch (default 16; --tiny 2)")
    ap.add_argument("-T", "--seq-len", type=int, help="sequence length (default 1024; --tiny 32)")
    for k in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"):
        ap.add_argument("--" + k.replace("_", "-"), dest=k, type=int, help=f"default GPT-2 124M's {GPT2_124M[k]}")
    ap.add_argument("--pad-to", type=int, default=128, help="pad the vocabulary to a multiple of this (Kiln: 128)")
    ap.add_argument("--precision", choices=("bf16", "fp32"), help="default bf16 on cuda, fp32 on cpu")
    ap.add_argument("--steps", type=int, help="timed steps (default 20; --tiny 3)")
    ap.add_argument("--warmup", type=int, help="untimed steps first, compilation included (default 5; --tiny 1)")
    ap.add_argument("--data", help="llm.c token shard(s), a file or a quoted glob (default: random tokens)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--compile-mode", default="default",
                    choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"))
    ap.add_argument("--peak-tflops", type=float, help="the peak to report mfu against (e.g. --peak-matmul's)")
    ap.add_argument("--peak-matmul", action="store_true", help="measure the bf16 matmul rate instead")
    ap.add_argument("--attention", action="store_true",
                    help="time causal SDPA forward + backward per backend instead (the peers of Kiln's attention)")
    ap.add_argument("--matmul-size", type=int, default=8192)
    ap.add_argument("--matmul-iters", type=int, default=10)
    ap.add_argument("--matmul-repeats", type=int, default=5)
    ap.add_argument("--copy-mib", type=int, default=1024, help="--peak-matmul: MiB copied to measure bandwidth")
    ap.add_argument("--json", help="also write the JSON line to this file")
    a = ap.parse_args()
    if (a.steps is not None and a.steps < 1) or (a.warmup is not None and a.warmup < 1):
        ap.error("--steps and --warmup must be >= 1 (the first warm-up step compiles)")
    if a.device == "cuda" and not torch.cuda.is_available():
        emit({"bench": "peak_matmul" if a.peak_matmul else "attention" if a.attention else "pytorch_gpu_step", "mode": a.mode,
              "error": "no CUDA device visible to torch", "torch": torch.__version__}, a.json)
        return 2
    if a.device == "cpu" and not a.tiny and not a.peak_matmul:
        print("pytorch_gpu_step.py: warning: GPT-2 124M on the CPU is slow; --tiny is the smoke test",
              file=sys.stderr)
    if a.peak_matmul:
        emit(peak_matmul(a, a.device), a.json)
        return 0
    if a.attention:
        emit(attention_bench(a, a.device), a.json)
        return 0
    out, rc = train_bench(a, a.device)
    emit(out, a.json)
    return rc


if __name__ == "__main__":
    sys.exit(main())
