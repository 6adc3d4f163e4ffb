#!/usr/bin/python3
"""PyTorch eager's activation memory for one GPT-2 training micro-step (forward + backward).

The model is the PyTorch reference of test/e2e/gpt2_reference.py: `forward` for fp32 and
`forward_bf16` under torch.autocast("cpu", dtype=torch.bfloat16) for bf16 (fp32 master weights;
that is the reference's bf16 policy, the one Kiln's bf16 implements).  Two figures per run:

  saved    bytes of the tensors autograd saves for backward, seen by a
           torch.autograd.graph.saved_tensors_hooks pack hook: the saved tensors still alive at
           the end of the forward, deduplicated by storage (a storage shared by several saved
           tensors or views counts once, in full); parameters (and views of them, e.g. W.t()) and
           the token inputs are excluded.  A lower bound: it leaves out the gradients of
           activations and every temporary of forward and backward.
  peak     the peak of live bytes the CPU allocator hands out during forward + backward, from
           torch.profiler's memory events (profile_memory=True); parameters, their .grad (allocated
           before the step, so backward accumulates into them in place) and the inputs are
           allocated before the measured region and are not counted.  This is the figure to set
           beside Kiln's activation_bytes (kiln-inspect --json), which is the peak of planned live activation bytes of the
           same forward + backward (activation gradients and weight-gradient temporaries included).
           (The live bytes at the end of the forward equal `saved` exactly: nothing else is held.)

Variants (--configs PRECISION:VARIANT,...):
  eager    the reference as written: softmax(q k^T) materialised, autograd saves the
           [B, H, T, T] score / probability tensors.  Its saved figure is also reported without
           them ("eager saved - [B,H,T,T]").
  flash    the same model with the attention core replaced by a FlashAttention-style
           autograd.Function (what SDPA's flash / memory-efficient kernels keep) that saves only
           q, k, v (views of the qkv projection), the output and the row log-sum-exp, and
           recomputes the probabilities in backward one [T, T] block (one batch row, one head) at
           a time: no [B, H, T, T] tensor is saved or materialised.
  fused    flash, and torch.nn.functional's fused ops where the reference writes formulas out
           (F.layer_norm, F.linear with the bias, F.gelu, F.cross_entropy): what a typical PyTorch
           GPT-2 keeps.  Not in the default set (time).
flash and fused are checked against the reference (loss and every gradient, fp64 and bf16) at a
small size before the measurement.

Batch size.  The B=16, T=1024 eager fp32 step does not fit in 24 GiB (it saves two
B*H*T*T fp32 tensors per layer), so every variant runs for real at B=1 and B=2 and is
extrapolated to the target B with the affine fit M(B) = M0 + B * dM (M0: B-independent memory,
e.g. the causal masks and autocast's bf16 weight copies; dM: per-sample bytes).  M(2)/M(1) and M0
are printed to show the linearity; a third batch size (--batches 1,2,3) is checked against the
fit.  In addition, for fp32 the saved-for-backward bytes are counted exactly at the target B on
the `meta` device (torch 1.13 runs this model's forward and backward on meta; meta allocates
nothing, so the peak cannot be measured there, and CPU autocast does not apply to meta tensors,
so bf16 is not counted there), which checks the extrapolation.

Runtime: the configurations are spread over --workers processes (default 2), one thread each
(with two, this torch build's element-wise kernels are ~10x slower on a 2-core machine):
~3.5 minutes for the default set on an idle 2-core machine.

Usage: bench/pytorch_activation_memory.py [--spec models/gpt2-124m.toml] [--batches 1,2]
         [--configs fp32:eager,fp32:flash,bf16:eager,bf16:flash] [--workers 2] [--json OUT]
         [--no-check] [--no-meta]
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import subprocess
import tempfile
import threading
import time
import tomllib
import weakref
from collections import OrderedDict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "test" / "e2e"))
import gpt2_reference as R  # noqa: E402

BF16, F32 = torch.bfloat16, torch.float32
GIB = float(1 << 30)
T0 = float(os.environ.get("KILN_BENCH_T0", time.time()))
TAG = ""


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s]{' ' + TAG + ':' if TAG else ''} {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# FlashAttention-style causal attention: saves q, k, v, out, lse; recomputes P in backward.
# ----------------------------------------------------------------------------------------------
def _acc(dtype):
    return F32 if dtype in (BF16, torch.float16) else dtype


class FlashAttention(torch.autograd.Function):
    """softmax(q k^T / sqrt(hs) + causal mask) v for q, k, v [B, H, T, hs]; output in q's dtype.
    Computed one (batch row, head) [T, T] block at a time in fp32 (fp64 for fp64 inputs);
    saves q, k, v, the output and the log-sum-exp [B, H, T] (fp32), as FlashAttention does."""

    @staticmethod
    def forward(ctx, q, k, v):
        Bn, Hn, Tn, hs = q.shape
        acc, scale = _acc(q.dtype), 1.0 / math.sqrt(hs)
        masked = torch.ones(Tn, Tn, dtype=torch.bool, device=q.device).triu(1)
        out = torch.empty_like(q)
        lse = torch.empty(Bn, Hn, Tn, dtype=acc, device=q.device)
        with torch.autocast("cpu", enabled=False):
            for b in range(Bn):
                for h in range(Hn):
                    s = (q[b, h].to(acc) @ k[b, h].to(acc).t()) * scale
                    s = s.masked_fill(masked, float("-inf"))
                    m = s.amax(-1, keepdim=True)
                    e = torch.exp(s - m)
                    l = e.sum(-1, keepdim=True)
                    out[b, h] = ((e / l) @ v[b, h].to(acc)).to(q.dtype)
                    lse[b, h] = (m + torch.log(l)).squeeze(-1)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        Bn, Hn, Tn, hs = q.shape
        acc, scale = _acc(q.dtype), 1.0 / math.sqrt(hs)
        masked = torch.ones(Tn, Tn, dtype=torch.bool, device=q.device).triu(1)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        with torch.autocast("cpu", enabled=False):
            for b in range(Bn):
                for h in range(Hn):
                    qb, kb, vb = q[b, h].to(acc), k[b, h].to(acc), v[b, h].to(acc)
                    s = (qb @ kb.t()) * scale
                    p = torch.exp(s - lse[b, h].unsqueeze(-1)).masked_fill(masked, 0.0)
                    do = dout[b, h].to(acc)
                    dv[b, h] = (p.t() @ do).to(v.dtype)
                    dp = do @ vb.t()
                    D = (do * out[b, h].to(acc)).sum(-1, keepdim=True)
                    ds = p * (dp - D) * scale
                    dq[b, h] = (ds @ kb).to(q.dtype)
                    dk[b, h] = (ds.t() @ qb).to(k.dtype)
        return dq, dk, dv


def forward_flash(params: dict, idx, targets, cfg: R.GPTConfig, bf16: bool, fused: bool = False):
    """R.forward (bf16=False) / R.forward_bf16 (bf16=True, call under autocast), op for op, except
    that the attention core (scores, mask, softmax, @ v) is FlashAttention.apply.
    fused=True: also torch.nn.functional's fused ops where the reference writes the formula out:
    F.layer_norm, F.linear (addmm) with the bias inside, F.gelu(approximate="tanh") (on the bf16
    pre-activation under autocast, as a typical autocast model runs it), F.cross_entropy."""
    F = torch.nn.functional
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    hs = C // H
    p = params
    if bf16 or fused:
        def proj(x, w, b):                  # R.forward_bf16: F.linear with the bias inside
            return F.linear(x, w.t(), b)
    else:
        def proj(x, w, b):                  # R.forward: x @ W + b
            return x @ w + b
    if fused:
        def ln(x, w, b):
            return F.layer_norm(x, (C,), w, b, eps=1e-5)

        def gelu(u):
            return F.gelu(u, approximate="tanh")
    else:
        ln = R.layernorm

        def gelu(u):
            return F.gelu(u.float(), approximate="tanh").to(BF16) if bf16 else R.gelu_tanh(u)
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][0:T]
    for i in range(cfg.n_layer):
        h = f"transformer.h.{i}."
        a = ln(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])
        qkv = proj(a, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"])
        q, k, v = qkv.split(C, dim=-1)
        q = q.reshape(B, T, H, hs).transpose(1, 2)
        k = k.reshape(B, T, H, hs).transpose(1, 2)
        v = v.reshape(B, T, H, hs).transpose(1, 2)
        y = FlashAttention.apply(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + proj(y, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])
        m = ln(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        u = proj(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"])
        x = x + proj(gelu(u), p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
    xf = ln(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    if bf16 or fused:
        logits = F.linear(xf, p["transformer.wte.weight"])
    else:
        logits = xf @ p["transformer.wte.weight"].t()
    flat = (logits.float() if bf16 else logits).reshape(B * T, -1)
    if fused:
        loss = F.cross_entropy(flat, targets.reshape(B * T))
    else:
        loss = R.cross_entropy_mean(flat, targets.reshape(B * T))
    return logits, loss


VARIANTS = OrderedDict([
    ("eager", "eager attention (reference as written)"),
    ("flash", "flash-style attention"),
    ("fused", "flash-style attention + fused F.* ops"),
])


def run_forward(params, idx, targets, cfg, precision: str, attention: str):
    """Loss of one micro-batch; the logits are not kept (only what autograd keeps stays alive)."""
    bf16 = precision == "bf16"
    if attention == "eager":
        fwd = R.forward_bf16 if bf16 else R.forward
    else:
        def fwd(*a):
            return forward_flash(*a, bf16=bf16, fused=attention == "fused")
    with torch.autocast("cpu", dtype=BF16, enabled=bf16):
        return fwd(params, idx, targets, cfg)[1]


# ----------------------------------------------------------------------------------------------
# Self-check of the flash variant against the reference (small model).
# ----------------------------------------------------------------------------------------------
def check_flash() -> None:
    cfg = R.GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=97, block_size=64)
    g = torch.Generator().manual_seed(1)
    B, T = 2, 48
    idx = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    tgt = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    base = R.init_params(cfg, 3)
    for precision, dtype, tol in (("fp64", torch.float64, 1e-10), ("bf16", F32, 3e-2)):
        res = {}
        for att in ("eager", "flash", "fused"):
            leaves = OrderedDict((k, v.detach().to(dtype).clone().requires_grad_(True))
                                 for k, v in base.items())
            loss = run_forward(leaves, idx, tgt, cfg, "bf16" if precision == "bf16" else "fp32", att)
            loss.backward()
            res[att] = (loss.detach().double(), OrderedDict((k, l.grad.double()) for k, l in leaves.items()))
        for att in ("flash", "fused"):
            dl = abs(float(res["eager"][0] - res[att][0]))
            worst = max(R.rel_err(res[att][1][k], res["eager"][1][k]) for k in base)
            ok = dl <= tol * max(1.0, abs(float(res["eager"][0]))) and worst <= tol
            log(f"check {att} variant vs the reference ({precision}, {cfg.n_layer} layers, B={B}, "
                f"T={T}): |dloss|={dl:.2e}, worst grad rel err={worst:.2e}, tol={tol:g}: "
                f"{'ok' if ok else 'FAIL'}")
            if not ok:
                raise SystemExit(f"the {att} variant does not match the reference")


# ----------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------
def _storage(t: torch.Tensor):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()   # torch 2 / 1.13


def storage_key(t: torch.Tensor) -> int:
    return _storage(t)._cdata       # the StorageImpl: unique while alive, also on `meta`


def measure(params, cfg, B, T, precision, attention, device="cpu", seed=0, want_peak=True):
    g = torch.Generator().manual_seed(seed + B)
    idx = torch.randint(0, cfg.vocab_size, (B, T), generator=g).to(device)
    tgt = torch.randint(0, cfg.vocab_size, (B, T), generator=g).to(device)
    exclude = {storage_key(p) for p in params.values()} | {storage_key(idx), storage_key(tgt)}
    packed = []                       # weak references to every tensor autograd saves

    def pack(t):
        packed.append(weakref.ref(t))
        return t

    gc.collect()
    t0 = time.time()
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True) if want_peak else None
    if prof is not None:
        prof.__enter__()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = run_forward(params, idx, tgt, cfg, precision, attention)
        # What is saved at the end of the forward: the tensors still alive (a tensor saved by a
        # node that died during the forward, e.g. the indices of a max whose values were
        # detached, is gone), deduplicated by storage (alive storages have distinct keys).
        saved = {}
        for r in packed:
            t = r()
            if t is not None:
                key = storage_key(t)
                if key not in exclude and key not in saved:
                    saved[key] = (_storage(t).nbytes(), str(t.dtype).replace("torch.", ""),
                                  tuple(t.shape))
        t = None
        del packed[:]
        t1 = time.time()
        with record_function("bench::backward"):
            loss.backward()
        loss_value = float(loss.detach().float().cpu()) if device != "meta" else float("nan")
        del loss
    finally:
        if prof is not None:
            prof.__exit__(None, None, None)
    t2 = time.time()

    # [B, H, T, T] attention tensors; matmul saves the probabilities as their [B*H, T, T] bmm view.
    tt = sum(b for b, _, s in saved.values() if len(s) >= 3 and s[-2:] == (T, T))
    by_dtype = {}
    for b, d, _ in saved.values():
        by_dtype[d] = by_dtype.get(d, 0) + b
    out = OrderedDict(B=B, saved_bytes=sum(b for b, _, _ in saved.values()), saved_tt_bytes=tt,
                      saved_storages=len(saved), saved_bytes_by_dtype=by_dtype,
                      forward_s=round(t1 - t0, 2), backward_s=round(t2 - t1, 2), loss=loss_value)
    if prof is not None:
        evs = prof.profiler.kineto_results.events()
        bwd_start = min(e.start_us() for e in evs if e.name() == "bench::backward")
        mem = sorted(((e.start_us(), i, e.nbytes()) for i, e in enumerate(evs)
                      if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU))
        live = peak = peak_fwd = 0
        live_after_fwd = None
        for ts, _, n in mem:
            if live_after_fwd is None and ts >= bwd_start:
                live_after_fwd = live
            live += n
            peak = max(peak, live)
            if ts < bwd_start:
                peak_fwd = max(peak_fwd, live)
        out.update(peak_bytes=peak, peak_forward_bytes=peak_fwd,
                   live_after_forward_bytes=live_after_fwd if live_after_fwd is not None else live,
                   live_at_end_bytes=live, memory_events=len(mem))
    return out


def affine(points: dict, key: str, target_b: int):
    """points: B -> measurement. Fit M(B) = M0 + B*dM through the two smallest B; return the
    estimate at target_b, M0, dM, M(B2)/M(B1) and, for any further B, measured vs predicted."""
    bs = sorted(points)
    b1, b2 = bs[0], bs[1]
    m1, m2 = points[b1][key], points[b2][key]
    dm = (m2 - m1) / (b2 - b1)
    m0 = m1 - b1 * dm
    checks = OrderedDict((str(b), OrderedDict(
        measured=points[b][key], predicted=m0 + b * dm,
        rel_err=(m0 + b * dm) / points[b][key] - 1 if points[b][key] else 0.0)) for b in bs[2:])
    return OrderedDict(estimate=m0 + target_b * dm, intercept=m0, per_sample=dm,
                       ratio=m2 / m1 if m1 else float("nan"), b1=b1, b2=b2, checks=checks)


# Relative cost of one configuration (fp32 GEMMs run at ~1/2.5 the bf16 rate here), for
# spreading the configurations over worker processes.
COST = {"fp32": 3.0, "bf16": 1.5}


def run_config(params, cfg, T, target_b, batches, precision, att):
    pts = OrderedDict()
    for B in batches:
        for p in params.values():
            p.grad.zero_()
        log(f"run   {precision} {att:5s} B={B} T={T} ...")
        r = measure(params, cfg, B, T, precision, att)
        pts[B] = r
        log(f"      {precision} {att:5s} B={B}: forward {r['forward_s']}s backward {r['backward_s']}s "
            f"loss {r['loss']:.4f}: peak {r['peak_bytes'] / GIB:.3f} GiB, saved "
            f"{r['saved_bytes'] / GIB:.3f} GiB ([B,H,T,T] {r['saved_tt_bytes'] / GIB:.3f}), live "
            f"after forward {r['live_after_forward_bytes'] / GIB:.3f} GiB")
    run = OrderedDict(precision=precision, attention=att, measured=list(pts.values()),
                      extrapolated=OrderedDict())
    for key in ("peak_bytes", "saved_bytes", "saved_tt_bytes", "live_after_forward_bytes"):
        run["extrapolated"][key] = affine(pts, key, target_b)
    e = run["extrapolated"]["peak_bytes"]
    log(f"      {precision} {att:5s} -> B={target_b}: peak {e['estimate'] / GIB:.3f} GiB "
        f"(peak(B={batches[1]})/peak(B={batches[0]}) = {e['ratio']:.4f}, B-independent part "
        f"{e['intercept'] / GIB:.3f} GiB), saved "
        f"{run['extrapolated']['saved_bytes']['estimate'] / GIB:.3f} GiB")
    for b, c in e["checks"].items():
        log(f"      {precision} {att:5s} linearity check at B={b}: peak measured "
            f"{c['measured'] / GIB:.3f} GiB, predicted by the fit {c['predicted'] / GIB:.3f} GiB "
            f"({100 * c['rel_err']:+.2f}%)")
    return run


def spawn_workers(args, groups):
    """Run each group of configurations in its own process (one thread each); forward their
    progress lines; return their runs."""
    runs = []
    # One core per worker: OpenBLAS (Debian's torch uses it for GEMMs) would start a thread per
    # core in each process otherwise.
    env = dict(os.environ, KILN_BENCH_T0=str(T0))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(var, str(args.threads))
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        procs = []
        for w, group in enumerate(groups):
            out = os.path.join(tmp, f"worker{w}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--spec", args.spec,
                   "--batches", args.batches, "--threads", str(args.threads),
                   "--configs", ",".join(group), "--workers", "1", "--no-check", "--no-meta",
                   "--tag", f"worker {w}", "--json", out]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, bufsize=1, env=env)

            def pump(pr=proc):
                for line in pr.stdout:
                    print(line, end="", flush=True)
            th = threading.Thread(target=pump, daemon=True)
            th.start()
            procs.append((proc, th, out, group))
        try:
            for proc, th, out, group in procs:
                rc = proc.wait()
                th.join()
                if rc != 0:
                    raise SystemExit(f"worker for {group} failed (exit {rc})")
                with open(out) as f:
                    runs.extend(json.load(f)["runs"])
        finally:
            for proc, _, _, _ in procs:       # on failure or interrupt: stop the other workers
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return runs


def main() -> int:
    global TAG
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=str(REPO / "models" / "gpt2-124m.toml"))
    ap.add_argument("--batches", default="1,2", help="batch sizes run for real (two or more)")
    ap.add_argument("--configs", default="fp32:eager,fp32:flash,bf16:eager,bf16:flash",
                    help="precision:variant pairs; precision fp32|bf16, variant eager|flash|fused "
                         "(fused: not in the default set)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                    help="processes to spread the configurations over")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per process (default 1: with 2 the element-wise kernels "
                         "of this torch build are ~10x slower on a 2-core machine)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--no-check", action="store_true", help="skip the flash-vs-reference check")
    ap.add_argument("--no-meta", action="store_true", help="skip the exact meta-device count")
    ap.add_argument("--tag", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    TAG = args.tag

    torch.set_num_threads(args.threads)
    with open(args.spec, "rb") as f:
        spec = tomllib.load(f)
    cfg = R.GPTConfig.from_dict(spec["model"])
    target_b, T = int(spec["compile"]["batch_size"]), int(spec["compile"]["seq_len"])
    batches = sorted(int(b) for b in args.batches.split(","))
    if len(batches) < 2:
        ap.error("--batches needs two batch sizes for the linear fit")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        pr, _, at = c.partition(":")
        if pr not in ("fp32", "bf16") or at not in VARIANTS:
            ap.error(f"bad configuration {c!r}")
    log(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s) per process; model "
        f"{spec['model'].get('name')} L={cfg.n_layer} H={cfg.n_head} C={cfg.n_embd} "
        f"V={cfg.vocab_size}; target B={target_b} T={T}; measured at B={batches}; configs {configs}")

    if not args.no_check:
        check_flash()

    result = OrderedDict(
        torch=torch.__version__, spec=args.spec, model=spec["model"], target_batch=target_b,
        seq_len=T, batches=batches,
        method=OrderedDict(
            model="test/e2e/gpt2_reference.py: forward (fp32); forward_bf16 under "
                  "torch.autocast('cpu', bfloat16) with fp32 master weights (bf16); 'flash' = the "
                  "same with attention as a FlashAttention-style autograd.Function; 'fused' = "
                  "flash + F.layer_norm/F.linear/F.gelu/F.cross_entropy",
            saved="saved_tensors_hooks pack hook; tensors still alive at the end of the forward, "
                  "deduplicated by storage; parameters and inputs excluded",
            peak="torch.profiler profile_memory=True: peak of live CPU-allocator bytes during "
                 "forward+backward; parameters, their .grad and the inputs allocated beforehand "
                 "(not counted)",
            extrapolation=f"affine in B through B={batches[0]} and B={batches[1]}"),
        runs=[])

    # Exact saved-for-backward count at the target B on the meta device (fp32 only: CPU
    # autocast does not apply to meta tensors).
    meta_saved = {}
    if not args.no_meta:
        mparams = None
        for c in configs:
            pr, _, at = c.partition(":")
            if pr != "fp32":
                continue
            if mparams is None:
                mparams = OrderedDict((k, torch.empty(s, device="meta", dtype=F32).requires_grad_(True))
                                      for k, s in R.param_shapes(cfg).items())
            r = measure(mparams, cfg, target_b, T, "fp32", at, device="meta", want_peak=False)
            meta_saved[c] = r
            log(f"meta  fp32 {at:5s} B={target_b}: saved for backward {r['saved_bytes'] / GIB:.3f} "
                f"GiB ({r['saved_storages']} storages; [B,H,T,T]: {r['saved_tt_bytes'] / GIB:.3f} GiB)")

    workers = max(1, min(args.workers, len(configs)))
    if workers > 1:
        groups, load = [[] for _ in range(workers)], [0.0] * workers
        for c in sorted(configs, key=lambda c: -COST[c.partition(":")[0]]):
            w = load.index(min(load))
            groups[w].append(c)
            load[w] += COST[c.partition(":")[0]]
        log(f"spreading over {workers} processes: {groups}")
        runs = {f"{r['precision']}:{r['attention']}": r for r in spawn_workers(args, groups)}
    else:
        params = OrderedDict((k, v.requires_grad_(True)) for k, v in R.init_params(cfg, 0).items())
        for p in params.values():
            p.grad = torch.zeros_like(p)     # allocated up front: backward accumulates in place
        runs = {}
        for c in configs:
            pr, _, at = c.partition(":")
            runs[c] = run_config(params, cfg, T, target_b, batches, pr, at)
    for c in configs:
        run = runs[c]
        if c in meta_saved:
            run["meta_saved_bytes"] = meta_saved[c]["saved_bytes"]
            run["meta_saved_tt_bytes"] = meta_saved[c]["saved_tt_bytes"]
            ex = run["extrapolated"]["saved_bytes"]["estimate"]
            log(f"check {c}: saved for backward at B={target_b}, extrapolated {ex / GIB:.3f} GiB vs "
                f"counted on meta {run['meta_saved_bytes'] / GIB:.3f} GiB "
                f"({100 * (ex / run['meta_saved_bytes'] - 1):+.2f}%)")
        result["runs"].append(run)

    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
