#!/usr/bin/python3
"""Kiln against its oracles on model shapes drawn at random from a seed.

The fixed configs (configs/*.toml) pick their awkward sizes by hand; this draws them: head sizes
from 1 to 64 (odd, prime, powers of two), 1 to 6 heads, 1 to 3 layers, a vocabulary from 4 tokens
up, T from 1 to past one attention tile (64), block_size >= T, B from 1 to 4, fp32 or bf16, and
with them one of kilnc's variants (fused, --no-fusion (cpu only), --fuse-single-ops,
--recompute=cheap) and 1 or 2 micro-steps a step. bf16 draws have C >= 8 and T raised to
B x T >= 32 (below, the bf16 reference itself misses its bias bound); cuda draws at most 2 layers
and C <= 128 where the head size allows (the emulated GPU runs each thread as a fiber).

Each draw is written as a spec and checked by one of
  parity  test_parity.py: step-0 gradients, losses, the schedule and the saved weights against
          PyTorch (float64, or the bf16 autocast reference), at its tolerances but the fp32 final
          weights' (see FP32_WEIGHT_TOL);
  decode  test_decode.py: sampling with the key/value caches against PyTorch's whole-model logits
          (cuda: the run with the caches only);
  ranks   test_ranks.py's tcp and tcp_three cases: 2 and 3 TCP ranks with ZeRO-1 on small
          compiled buckets against 1 process;
  checkpoint  test_checkpoint.py: runs killed (SIGKILL, SIGTERM, ...) and resumed give bitwise
          the losses and weights of an uninterrupted one; corrupt and mismatched checkpoints refused
          (not in CI: up to a minute a draw, and its signals are timed for steps as long as
          tiny.toml's, so that a much faster model can outrun them: seen, a SIGKILL meant for
          step 34 landing in step 40's checkpoint write (its temporary, which the next write
          removes, still there), a shard removed after the run had read it);
  fence   the generated kernels under ASan/UBSan with the arena fenced to each call's operands:
          cpu: cpu_fence.sh (train, eval, sample); cuda: cuda_emulation/run.sh with SANITIZE=1
          (the emulated step against the cpu module's, buffer by buffer, with and without fused
          epilogues, on the race-exposing schedules, and with SIMT attention for bf16).

    random_shapes.py --kilnc build/bin/kilnc --workdir DIR [--check parity|decode|ranks|checkpoint|fence]
                     [--seed 1] [--count 6] [--steps 3]
                     [--target cpu|cuda] [--runtime PATH]   (cuda: kiln-run-emulated)

A draw depends only on (seed, index), so `--seed S --only I` repeats one. Exit status 1 names each
failing draw's spec and the command that repeats it.
"""
import argparse
import os
import random
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HEAD_SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 48, 64]
VARIANTS = [[], ["--no-fusion"], ["--fuse-single-ops"], ["--recompute=cheap"]]


def draw(seed, index, target, min_embd=2):
    """One configuration: (the spec's values, kilnc arguments, micro-steps per step)."""
    rng = random.Random(f"{seed}/{index}")
    n_head = rng.randint(1, 6)
    hs = rng.choice(HEAD_SIZES)
    # (a layer norm over one channel is 0 whatever its input: nothing to train)
    while n_head * hs < min_embd:
        n_head += 1
    T = rng.choice([1, 2, 3, rng.randint(4, 40), rng.randint(41, 63), 64, 65, rng.randint(66, 100)])
    spec = {
        "n_layer": rng.randint(1, 3),
        "n_head": n_head,
        "n_embd": n_head * hs,
        "vocab_size": rng.choice([4, 5, rng.randint(6, 127), 128, rng.randint(129, 700)]),
        "block_size": T + rng.choice([0, 0, 1, rng.randint(2, 40)]),
        "batch_size": rng.randint(1, 4),
        "seq_len": T,
        "precision": rng.choice(["fp32", "bf16"]),
    }
    # The bf16 check bounds the mean scale error of the gradients by u = 2^-8 (unbiased rounding):
    # that needs tokens and channels enough for the roundings of what every gradient shares (the
    # logits' gradient, the layer norms' statistics) to average out. With B x T = 3, or C = 2 or
    # 4, the bf16 reference itself is 4e-3 to 9e-3 from float64. Those shapes run in fp32.
    if spec["n_embd"] < 8:
        spec["precision"] = "fp32"
    if spec["precision"] == "bf16" and spec["batch_size"] * T < 32:
        T = spec["seq_len"] = -(-32 // spec["batch_size"])
        spec["block_size"] = max(spec["block_size"], T)
    # The emulated GPU runs each thread as a fiber: smaller models keep a cuda draw to seconds.
    if target == "cuda":
        spec["n_layer"] = min(spec["n_layer"], 2)
        while spec["n_head"] > 1 and spec["n_embd"] > 128:
            spec["n_head"] -= 1
            spec["n_embd"] = spec["n_head"] * hs
    # (a cuda module runs only generated kernels: no --no-fusion)
    variants = VARIANTS if target == "cpu" else [v for v in VARIANTS if v != ["--no-fusion"]]
    return spec, rng.choice(variants), rng.choice([1, 2])


def spec_text(spec, title, target):
    return (f"# {title}\n[model]\n"
            + "".join(f"{k} = {spec[k]}\n" for k in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"))
            + "\n[compile]\n"
            + "".join(f"{k} = {spec[k]}\n" for k in ("batch_size", "seq_len"))
            + f"precision = \"{spec['precision']}\"\ntarget = \"{target}\"\n")


# fp32 draws compare the final weights within 1e-3 relative per tensor, not test_parity's 2e-5 (which
# its fixed configs keep): a gradient element near zero makes AdamW's g / sqrt(v) step on rounding
# noise, and a draw may hold one. Seen: one element of a 396x99 weight 4.8e-5 off (the tensor
# 2.9e-5), one of a zero-initialised bias 5.0e-6 off in 2.1e-3 (the tensor, whose norm is three
# steps' worth, 2.0e-4); every other element within 1e-8. The step-0 gradients (1e-4) and the
# losses (1e-4) are checked at test_parity's tolerances.
FP32_WEIGHT_TOL = "1e-3"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kilnc", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=6)
    ap.add_argument("--only", type=int, help="run only this draw")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--target", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--runtime", help="kilnc --runtime (kiln-run-emulated for --target cuda)")
    ap.add_argument("--check", choices=("parity", "decode", "ranks", "fence", "checkpoint"), default="parity",
                    help="test_parity.py (training), test_decode.py (sampling's key/value caches), "
                         "test_ranks.py's tcp and tcp_three cases (2 and 3 ranks, ZeRO-1, against 1 process), "
                         "test_checkpoint.py (killed and resumed runs bitwise as uninterrupted ones), "
                         "or the kernels under ASan/UBSan with the arena fenced to each call's operands "
                         "(cpu: cpu_fence.sh; cuda: cuda_emulation/run.sh SANITIZE=1)")
    args = ap.parse_args()
    if args.target == "cuda" and not args.runtime and args.check != "fence":
        ap.error("--target cuda needs --runtime (kiln-run-emulated)")
    # The build folder of the fence scripts: kilnc's (BUILD/bin/kilnc).
    args.build = os.path.dirname(os.path.dirname(os.path.abspath(args.kilnc)))
    args.kilnc = os.path.abspath(args.kilnc)  # (test_parity.py runs kilnc in the draw's folder)
    if args.runtime:
        args.runtime = os.path.abspath(args.runtime)

    os.makedirs(args.workdir, exist_ok=True)
    failed = []
    indices = [args.only] if args.only is not None else range(args.count)
    # run.sh compares the emulated step with the cpu module's element by element (max |error| over
    # max |value|), which a layer norm over 2 to 7 channels (its gradients 1e-8 and cancelling)
    # leaves to rounding: there C >= 8.
    min_embd = 8 if args.check == "fence" and args.target == "cuda" else 2
    for i in indices:
        spec, variant, accum = draw(args.seed, i, args.target, min_embd)
        name = f"draw-{args.seed}-{i}"
        work = os.path.join(args.workdir, name)
        os.makedirs(work, exist_ok=True)
        # (the fence scripts name a config by its file name; run.sh derives the cuda spec from a cpu one)
        spec_path = os.path.join(work, f"{name}.toml" if args.check == "fence" else "spec.toml")
        with open(spec_path, "w") as f:
            f.write(spec_text(spec, f"random_shapes.py draw {i} of seed {args.seed}",
                              "cpu" if args.check == "fence" else args.target))
        if args.check == "checkpoint":  # (test_checkpoint.py compiles the spec as it is)
            variant = []
        if args.check == "fence":  # (run.sh compiles the fused module; --no-fusion has no kernel to fence)
            variant = [] if args.target == "cuda" or variant == ["--no-fusion"] else variant
        kilnc_args = variant + ([f"--runtime={args.runtime}"] if args.runtime else [])
        env = None
        if args.check == "fence" and args.target == "cpu":
            cmd = ["bash", os.path.join(HERE, "cpu_fence.sh"), args.build, os.path.join(work, "fence")]
            env = dict(os.environ, CONFIGS=spec_path, VARIANTS=" ".join(variant) or "-")
        elif args.check == "fence":
            # every run.sh pass on it: fused epilogues and not, the race-exposing schedules, SIMT attention
            cmd = ["bash", os.path.join(HERE, "cuda_emulation", "run.sh"), args.build, os.path.join(work, "fence")]
            env = dict(os.environ, SANITIZE="1", CONFIGS=spec_path, CONFIGS_PLAIN=name, CONFIGS_RACE=name,
                       CONFIGS_SIMT=name if spec["precision"] == "bf16" else "")
        elif args.check == "checkpoint":
            cmd = ([sys.executable, os.path.join(HERE, "test_checkpoint.py"), "--kilnc", args.kilnc, "--spec", spec_path,
                    "--other-spec", os.path.join(HERE, "configs", "awkward.toml"),
                    "--workdir", os.path.join(work, "run")])  # (which it empties first)
        elif args.check == "ranks":
            cmd = ([sys.executable, os.path.join(HERE, "test_ranks.py"), "--kilnc", args.kilnc, "--spec", spec_path,
                    "--workdir", work, "--group", "tcp", "--case", "tcp", "--case", "tcp_three", "--steps", "4"]
                   + [f"--kilnc-arg={a}" for a in kilnc_args])
        elif args.check == "decode":
            # (at least 6 new tokens: the rows of a round must sample different sequences)
            cmd = ([sys.executable, os.path.join(HERE, "test_decode.py"), "--kilnc", args.kilnc, "--spec", spec_path,
                    "--workdir", work, "--new-tokens", str(max(spec["seq_len"], 6))]
                   + [f"--kilnc-arg={a}" for a in kilnc_args]
                   + (["--kv-cache-only"] if args.target == "cuda" else []))  # (emulated: the run that matters)
        else:
            cmd = ([sys.executable, os.path.join(HERE, "test_parity.py"), "--kilnc", args.kilnc, "--spec", spec_path,
                    "--workdir", work, "--steps", str(args.steps), "--accum", str(accum), "--warmup-steps", "1"]
                   + [f"--kilnc-arg={a}" for a in kilnc_args]
                   + (["--weight-tol", FP32_WEIGHT_TOL] if spec["precision"] == "fp32" else []))
        shape = (f"L{spec['n_layer']} H{spec['n_head']} C{spec['n_embd']} V{spec['vocab_size']} "
                 f"T{spec['seq_len']}/{spec['block_size']} B{spec['batch_size']} {spec['precision']} "
                 + (f"accum {accum} " if args.check == "parity" else "") + f"{' '.join(variant) or 'fused'}")
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        dt = time.time() - t0
        if r.returncode == 0:
            print(f"draw {i}: {shape}: pass ({dt:.1f} s)", flush=True)
        else:
            print(f"draw {i}: {shape}: FAIL ({dt:.1f} s)\n" + (r.stdout + r.stderr)[-3000:], flush=True)
            failed.append((i, spec_path, cmd))
    if failed:
        print(f"random {args.check}: {len(failed)} of {len(indices)} draws failed:")
        for i, spec_path, cmd in failed:
            print(f"  draw {i} ({spec_path}): {shlex.join(cmd)}")
        return 1
    print(f"random {args.check}: {len(indices)} draws of seed {args.seed} pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
