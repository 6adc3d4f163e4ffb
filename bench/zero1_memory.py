#!/usr/bin/python3
"""Memory per rank of data-parallel training with and without ZeRO-1, Kiln against PyTorch.

GPT-2 124M (models/gpt2-124m.toml, fp32, target cpu) with a small micro-batch (--batch, --seq:
default B=1 T=64, so that the state, not the activations, is what the ranks hold) is compiled
by kilnc and trained on --ranks ranks (default 2, the TCP rendezvous, on this machine) for
--steps steps on one synthetic shard (scripts/make_synthetic_shard.py), in five configurations:
  kiln            `train` (gradients averaged in buckets; every rank keeps the whole AdamW state)
  kiln-zero1      `train --zero 1`: each rank keeps only its slices of the AdamW moments
  kiln-zero1-ckpt the same with a checkpoint at the end (rank 0 gathers the whole moments for it)
  torch           bench/pytorch_zero_rank.py: DistributedDataParallel (gloo) with torch.optim.AdamW
  torch-zero      the same with ZeroRedundancyOptimizer (AdamW's state sharded over the ranks)
For every rank it records the peak resident memory (ru_maxrss, from wait4), and for Kiln the
arena rank 0 announces. Prints a table (MiB per rank), the ratio of each framework's ZeRO run to
its plain run (what sharding saves), the saving against what the AdamW moments take
(2 x 4 bytes x parameters x (ranks - 1) / ranks), and Kiln's peak against PyTorch's, plain and
sharded; also the time of the last step (rank 0, one thread per rank: a memory bench, so a rough
figure); writes everything to bench/results/zero1_memory.json (git-ignored).

Usage: bench/zero1_memory.py [--ranks 2] [--steps 2] [--batch 1] [--seq 64] [--no-pytorch]
                             [--spec models/gpt2-124m.toml] [--out FILE] [--keep] [--timeout 1800]
Environment: KILN_BUILD (default build). Takes ~2 minutes on an idle 2-core machine and needs
about 2.5 GiB per rank for GPT-2 124M.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
ARENA = re.compile(r"this rank keeps 1/(\d+) of the AdamW moments: its arena is ([\d.]+) MiB, not ([\d.]+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(make_args, world: int, env_extra: dict, cwd: str, what: str, timeout: float) -> list[dict]:
    """Starts `world` ranks (make_args(rank) -> argv) under the environment rendezvous; waits for
    each with wait4 for its peak RSS; exits naming `what` if any fails or all take over `timeout` s."""
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **env_extra)
        out = open(os.path.join(cwd, f"{what}.{r}.out"), "w+")
        err = open(os.path.join(cwd, f"{what}.{r}.err"), "w+")
        procs.append((subprocess.Popen(make_args(r), stdout=out, stderr=err, env=env, cwd=cwd), out, err))
    ranks = []
    deadline = time.monotonic() + timeout
    for r, (p, out, err) in enumerate(procs):
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                for q, _, _ in procs:
                    q.kill()
                sys.exit(f"zero1_memory.py: {what}: the ranks did not finish within {timeout:.0f} s")
            time.sleep(0.2)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        o, e = out.read(), err.read()
        out.close(), err.close()
        if p.returncode != 0:
            for q, _, _ in procs:
                q.kill()
            sys.exit(f"zero1_memory.py: {what}: rank {r} exited {p.returncode}:\n{e[-3000:]}")
        ranks.append({"rank": r, "maxrss_mib": usage.ru_maxrss * 1024 / MiB, "stdout": o, "stderr": e})
    return ranks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=os.path.join(ROOT, "models", "gpt2-124m.toml"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--no-pytorch", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "zero1_memory.json"))
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds for the ranks of one configuration")
    a = ap.parse_args()
    if a.ranks < 2 or a.steps < 1 or a.batch < 1 or a.seq < 1:
        ap.error("--ranks >= 2, --steps, --batch, --seq >= 1")
    build = os.environ.get("KILN_BUILD", os.path.join(ROOT, "build"))
    kilnc, inspect = os.path.join(build, "bin", "kilnc"), os.path.join(build, "bin", "kiln-inspect")
    for tool in (kilnc, inspect):
        if not os.access(tool, os.X_OK):
            sys.exit(f"zero1_memory.py: {tool} not found; build first (scripts/build.sh)")
    if not a.no_pytorch and subprocess.run([sys.executable, "-c", "import torch.distributed"],
                                           capture_output=True).returncode != 0:
        sys.exit(f"zero1_memory.py: {sys.executable} cannot import torch.distributed (the PyTorch peer); "
                 "install it, or pass --no-pytorch")
    work = tempfile.mkdtemp(prefix="kiln-zero1-memory.")
    t0 = time.monotonic()
    try:
        # The spec with the bench's micro-batch.
        with open(a.spec) as f:
            text = f.read()
        text = re.sub(r"(?m)^(\s*batch_size\s*=\s*)\d+", rf"\g<1>{a.batch}", text)
        text = re.sub(r"(?m)^(\s*seq_len\s*=\s*)\d+", rf"\g<1>{a.seq}", text)
        spec = os.path.join(work, "model.toml")
        with open(spec, "w") as f:
            f.write(text)
        exe = os.path.join(work, "gpt2")
        print(f"== kilnc {os.path.basename(a.spec)} (B={a.batch} T={a.seq})", flush=True)
        subprocess.run([kilnc, spec, "-o", exe], check=True, cwd=work)
        info = json.loads(subprocess.run([inspect, exe, "--json"], check=True, capture_output=True, text=True).stdout)
        params = info["parameter_count"]
        vocab = info["model"].get("vocab_size", 50257) if isinstance(info.get("model"), dict) else 50257
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_synthetic_shard.py"), "--out", work,
                        "--vocab-size", str(min(vocab, 50257)), "--tokens", str(a.batch * a.seq * a.ranks * (a.steps + 1) + 1)],
                       check=True, capture_output=True)
        data = os.path.join(work, "train_*.bin")
        common = ["train", "--data", data, "--steps", str(a.steps), "--lr", "1e-4", "--print-every", "1"]
        ckpt = os.path.join(work, "ckpt")
        configs = {
            "kiln": (lambda r: [exe, *common, "--comm", "tcp"]),
            "kiln-zero1": (lambda r: [exe, *common, "--comm", "tcp", "--zero", "1"]),
            "kiln-zero1-ckpt": (lambda r: [exe, *common, "--comm", "tcp", "--zero", "1", "--checkpoint-dir", ckpt]),
        }
        if not a.no_pytorch:
            worker = os.path.join(ROOT, "bench", "pytorch_zero_rank.py")
            targs = ["--spec", spec, "--data", data, "--steps", str(a.steps)]
            configs["torch"] = lambda r: [sys.executable, worker, *targs]
            configs["torch-zero"] = lambda r: [sys.executable, worker, *targs, "--zero"]
        results = {}
        for name, make in configs.items():
            print(f"== {name}: {a.ranks} ranks, {a.steps} steps", flush=True)
            env = {"PYTHONPATH": os.path.join(ROOT, "bench")} if name.startswith("torch") else {}
            ranks = run_ranks(make, a.ranks, env, work, name, a.timeout)
            row = {"maxrss_mib": [r["maxrss_mib"] for r in ranks]}
            if name.startswith("kiln"):
                m = ARENA.search(ranks[0]["stderr"])
                row["arena_mib"] = float(m.group(2)) if m else None
                row["arena_whole_mib"] = float(m.group(3)) if m else None
                row["losses"] = [float(x) for x in re.findall(r"loss ([\d.]+)", ranks[0]["stdout"])]
                row["step_ms"] = [float(x) for x in re.findall(r"\| ([\d.]+) ms \|", ranks[0]["stdout"])]
            else:
                lines = [json.loads(r["stdout"].strip().splitlines()[-1]) for r in ranks]
                row["losses"] = lines[0]["losses"]
                row["step_ms"] = lines[0]["step_ms"]
                row["torch"] = lines[0]["torch"]
            results[name] = row
            shutil.rmtree(ckpt, ignore_errors=True)

        moments_saved = 2 * 4 * params * (a.ranks - 1) / a.ranks / MiB
        print(f"\n{os.path.basename(a.spec)} fp32 on the CPU, {a.ranks} ranks, B={a.batch} T={a.seq}, {params:,} parameters: "
              f"sharding AdamW's moments can save {moments_saved:.1f} MiB per rank")
        print(f"{'configuration':<18}{'peak RSS per rank (MiB)':>32}{'arena, rank 0 (MiB)':>22}{'last step (ms)':>16}")
        for name, row in results.items():
            rss = ", ".join(f"{x:.0f}" for x in row["maxrss_mib"])
            arena = f"{row['arena_mib']:.1f}" if row.get("arena_mib") else ""
            step = f"{row['step_ms'][-1]:.0f}" if row.get("step_ms") else ""
            print(f"{name:<18}{rss:>32}{arena:>22}{step:>16}")
        summary = {}
        for plain, zero in (("kiln", "kiln-zero1"), ("kiln", "kiln-zero1-ckpt"), ("torch", "torch-zero")):
            if plain not in results or zero not in results:
                continue
            p, z = results[plain]["maxrss_mib"], results[zero]["maxrss_mib"]
            ratio = [zi / pi for zi, pi in zip(z, p)]
            saved = [pi - zi for zi, pi in zip(z, p)]
            summary[f"{zero}/{plain}"] = {"rss_ratio": ratio, "saved_mib": saved,
                                          "of_moments": [s / moments_saved for s in saved]}
            print(f"{zero + ' / ' + plain:<26} peak RSS x{', x'.join(f'{r:.3f}' for r in ratio)}  "
                  f"(saved {', '.join(f'{s:.0f}' for s in saved)} MiB: "
                  f"{', '.join(f'{100 * s / moments_saved:.0f}%' for s in saved)} of the moments' share)")
        for kiln, torch in (("kiln", "torch"), ("kiln-zero1", "torch-zero")):
            if torch in results:
                ratio = [k / t for k, t in zip(results[kiln]["maxrss_mib"], results[torch]["maxrss_mib"])]
                summary[f"{kiln}/{torch}"] = {"rss_ratio": ratio}
                print(f"{kiln + ' / ' + torch:<26} peak RSS x{', x'.join(f'{r:.3f}' for r in ratio)}")
        if results["kiln-zero1"].get("arena_mib"):
            k = results["kiln-zero1"]
            print(f"kiln-zero1 arena, rank 0: {k['arena_mib']:.1f} MiB, not {k['arena_whole_mib']:.1f} "
                  f"(x{k['arena_mib'] / k['arena_whole_mib']:.3f})")
        if results["kiln"]["losses"] and results["kiln-zero1"]["losses"]:
            d = max(abs(x - y) for x, y in zip(results["kiln"]["losses"], results["kiln-zero1"]["losses"]))
            print(f"kiln-zero1 vs kiln: max |dloss| {d:.1e} over {a.steps} steps")
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out + ".tmp", "w") as f:
            json.dump({"ranks": a.ranks, "steps": a.steps, "batch": a.batch, "seq": a.seq, "parameters": params,
                       "moments_share_mib": moments_saved, "results": results, "summary": summary,
                       "seconds": time.monotonic() - t0}, f, indent=1)
        os.replace(a.out + ".tmp", a.out)
        print(f"wrote {a.out} ({time.monotonic() - t0:.0f} s)")
    finally:
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
