#!/usr/bin/python3
"""One rank of PyTorch's data-parallel GPT-2 training on the CPU: the peer of Kiln in
bench/zero1_memory.py.

The model is bench/torch_gpt2_block.py's GPT2 (fp32), wrapped in DistributedDataParallel over
the gloo backend (torch.distributed's environment rendezvous: RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). The optimizer is torch.optim.AdamW (lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight
decay 0.1 on the 2-D weights), or with --zero the same AdamW inside
torch.distributed.optim.ZeroRedundancyOptimizer, which keeps on each rank the state of its share
of the parameters only (ZeRO stage 1) and broadcasts the updated parameters after the step.
Gradients are clipped to norm 1.0 first (DDP has averaged them; the norm is the global one).

Each step: zero_grad -> the rank's B*T+1 tokens of the shard -> loss -> backward -> clip -> step.
Prints one JSON line: the rank, the losses, each step's time (as Kiln's `train` times a step:
zero_grad to the optimizer step), and the process's peak resident memory (ru_maxrss).

Usage (per rank): RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p \\
    bench/pytorch_zero_rank.py --spec SPEC.toml --data 'DIR/train_*.bin' [--steps 2] [--zero]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from pytorch_cpu_step import Loader, read_spec  # noqa: E402  (bench/ is on sys.path)
from torch_gpt2_block import GPT2  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--zero", action="store_true", help="shard AdamW's state (ZeroRedundancyOptimizer)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1337)  # the same initial weights on every rank
    cfg = read_spec(a.spec)
    B, T = cfg["batch_size"], cfg["seq_len"]
    net = GPT2(cfg)
    # The causal masks (bool buffers, the same on every rank) are not broadcast: gloo has no bool.
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        net, [n for n, b in net.named_buffers() if b.dtype == torch.bool])
    model = DistributedDataParallel(net)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    kw = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    if a.zero:
        opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **kw)
    else:
        opt = torch.optim.AdamW(groups, **kw)
    loader = Loader(a.data, B, T)
    for _ in range(rank):  # rank r reads every world-th batch, starting at its own
        loader.next()
    losses, step_ms = [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        x, y = loader.next()
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        step_ms.append((time.perf_counter() - t0) * 1e3)
        for _ in range(world - 1):
            loader.next()
    dist.barrier()
    print(json.dumps({"rank": rank, "world": world, "zero": a.zero, "losses": losses, "step_ms": step_ms,
                      "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "parameters": sum(p.numel() for p in model.parameters()),
                      "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
