#!/usr/bin/env python3
"""`sample` decodes with the key/value caches of @decode what PyTorch computes with the whole model.

The test writes weights with a spread large enough that the logits are not all near 0
(init_params' std times 5), continues a prompt of T/2 tokens by T more, so that each sequence
outgrows the T cached positions half-way (from there on `sample` runs @logits over the last T
tokens), for B+1 samples (a second round of rows starts the caches again, B-1 rows unused), and
keeps the logits every token was drawn from (--logits-out). Then, for every sample and step:

  * the logits equal PyTorch's over the last T tokens of the sequence so far within a relative
    error per row, ||kiln - ref|| / ||ref||: in fp32 float64's (gpt2_reference.forward) within
    1e-4; in bf16 those of the autocast reference (forward_bf16, test_parity's bf16 oracle) within
    the bf16 tolerance (test_parity.bf16_tolerances: 5e-2 here);
  * the token is among the 5 largest of its logits (--top-k 5, a seed: the rows of a round
    differ, so a kernel that mixed up rows would show);
  * `sample` says how many steps took their logits from @decode (the first T - T/2 + 1 of each
    round) and how many from @logits (the rest; with --no-kv-cache, all);
  * --no-kv-cache (@logits at every step) gives the same within the same tolerance;
  * at --temperature 1e-6 over all tokens (--top-k 0) every draw is its row's largest logit;
  * with --top-p every draw is in its row's nucleus, computed from the logits with PyTorch;
  * the prompt goes into the caches through @prefill (min(T, 64) positions per call) and
    @prefill_short (16, when T > 16), as `sample` reports: the calls it reports read every
    position before the last that @decode does not, at the least cost of any mix of calls at the
    prices it reports (each call from 2 to its positions' count of @decode calls, a @decode call 1);
    --no-prefill (every prompt position through @decode) gives the same logits within the
    tolerance.

  test_decode.py --kilnc build/bin/kilnc --spec test/e2e/configs/awkward.toml --workdir DIR
                 [--kilnc-arg=--no-fusion] [--kilnc-arg=--runtime=build/bin/kiln-run-emulated]
  test_decode.py --exe EXECUTABLE --spec SPEC --workdir DIR      (the executable of that spec)
"""
import argparse
import os
import re
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from test_parity import bf16_tolerances, tomllib  # noqa: E402  (tomllib, or its fallback on Python 3.10)


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout, r.stderr


def samples(text):
    return [[int(w) for w in line.split()] for line in text.splitlines() if not line.startswith("---")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnc", help="compile the spec with this kilnc")
    ap.add_argument("--exe", help="or run this executable (a cuda module on a GPU: bench/device/check.sh)")
    ap.add_argument("--spec", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--prompt-len", type=int, help="prompt tokens (default seq_len / 2)")
    ap.add_argument("--new-tokens", type=int, help="tokens to sample (default seq_len)")
    ap.add_argument("--kilnc-arg", action="append", default=[],
                    help="an extra kilnc argument (--no-fusion, --runtime=kiln-run-emulated: the GPU path)")
    ap.add_argument("--num-samples", type=int, help="samples to draw (default batch_size + 1: two rounds)")
    ap.add_argument("--kv-cache-only", action="store_true",
                    help="only the run with the caches against the reference (no --no-kv-cache, --no-prefill or "
                         "--temperature runs): for contexts too long to run four times under the emulator")
    ap.add_argument("--exe-env", action="append", default=[], metavar="VAR=VALUE",
                    help="set in the executable's environment alone (the emulation under ASan: its runtime "
                         "preloaded, KEMU_SANITIZE=1)")
    a = ap.parse_args()
    exe_env = dict(os.environ)
    for kv in a.exe_env:
        if "=" not in kv:
            sys.exit(f"test_decode.py: --exe-env {kv!r}: expected VAR=VALUE")
        var, value = kv.split("=", 1)
        exe_env[var] = value
    os.makedirs(a.workdir, exist_ok=True)
    with open(a.spec, "rb") as f:
        spec = tomllib.load(f)
    cfg = ref.GPTConfig.from_dict(spec["model"])
    B, T, V = spec["compile"]["batch_size"], spec["compile"]["seq_len"], cfg.vocab_size
    bf16 = spec["compile"].get("precision", "fp32") == "bf16"
    tol = bf16_tolerances(cfg, B, T)[0] if bf16 else 1e-4

    if not a.kilnc and not a.exe:
        sys.exit("test_decode.py: give --kilnc or --exe")
    exe = a.exe or os.path.join(a.workdir, "gpt2")
    if not a.exe:
        run([a.kilnc, a.spec, "-o", exe] + a.kilnc_arg)
    params = ref.init_params(cfg, seed=5)
    for t in params.values():
        if t.dim() == 2:
            t.mul_(5.0)
    weights = os.path.join(a.workdir, "w.safetensors")
    ref.write_safetensors(weights, params)
    p64 = ref.to_f64(params)

    oracle = "PyTorch's bf16 autocast reference" if bf16 else "float64 PyTorch"

    def reference(idx):
        if not bf16:
            return ref.forward(p64, idx, None, cfg)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return ref.forward_bf16(params, idx, None, cfg, emulate_gemm=True)[0]

    prompt = [int(x) for x in np.random.default_rng(1).integers(0, V, a.prompt_len or max(1, T // 2))]
    new, n, k = a.new_tokens or T, a.num_samples or B + 1, 5
    base = [exe, "sample", "--init", weights, "--prompt-ids", " ".join(map(str, prompt)),
            "--max-new-tokens", str(new), "--num-samples", str(n), "--top-k", str(k), "--seed", "11"]
    # Steps whose logits come from @decode: while a sequence holds at most T tokens, per round.
    rounds = (n + B - 1) // B
    by_decode = rounds * min(new, max(0, T - len(prompt) + 1))
    print(f"{a.spec}: prompt {len(prompt)} tokens, {new} new ({by_decode // rounds} from the caches, "
          f"then @logits), {n} samples in rows of {B}; relative tolerance {tol:.1e}")
    # Per round, the prompt positions before the last (n) go in by prefill calls of M positions
    # at `cost` @decode calls each, and by @decode calls (1 each). The least cost of any mix:
    def least_cost(n, prices):
        (m0, c0), (m1, c1) = (prices + [(1, 1), (1, 1)])[:2]
        return min(a * c0 + b * c1 + max(0, n - a * m0 - b * m1)
                   for a in range(n // m0 + 2) for b in range(n // m1 + 2))
    wanted_programs = ([("prefill", min(T, 64))] if T > 1 else []) + ([("prefill_short", 16)] if T > 16 else [])
    if len(prompt) > T:
        wanted_programs = []  # (the caches are not used: no prefill is reported)
    n_prompt = len(prompt) - 1 if len(prompt) <= T else 0  # (a longer prompt goes through @logits)
    failures = 0
    results = {}
    modes = (("kv cache", []), ("no kv cache", ["--no-kv-cache"]), ("no prefill", ["--no-prefill"]))
    for name, extra in modes[:1] if a.kv_cache_only else modes:
        npy = os.path.join(a.workdir, f"{name.replace(' ', '-')}.npy")
        stdout, stderr = run(base + extra + ["--logits-out", npy], exe_env)
        seqs = samples(stdout)
        m = re.search(r"logits of (\d+) steps by @decode \(key/value caches\), (\d+) by @logits", stderr)
        want = (0, rounds * new) if name == "no kv cache" else (by_decode, rounds * new - by_decode)
        if not m or (int(m.group(1)), int(m.group(2))) != want:
            print(f"FAIL {name}: sample says {m.group(0) if m else stderr.strip()!r}; expected {want[0]} steps by "
                  f"@decode and {want[1]} by @logits")
            failures += 1
        lines = re.findall(r"(\d+) prompt positions read by @(\w+) in (\d+) calls? \((\d+) a call, costed as (\d+) "
                           r"@decode calls\)", stderr)
        report = {g[1]: tuple(int(x) for x in (g[0], g[2], g[3], g[4])) for g in lines}  # positions, calls, M, cost
        problem = None
        if name != "kv cache":
            problem = f"reports prefill calls: {lines}" if lines else None
        elif sorted((k, v[2]) for k, v in report.items()) != sorted(wanted_programs):
            problem = f"reports {[(k, v[2]) for k, v in report.items()]} (program, positions a call); expected {wanted_programs}"
        else:
            read = sum(v[0] for v in report.values())
            if any(v[0] % rounds or v[1] % rounds or not 2 <= v[3] <= v[2] or v[0] > v[1] * v[2] for v in report.values()) \
                    or read % rounds or read // rounds > n_prompt:
                problem = f"reports {report} for {rounds} rounds of {n_prompt} positions"
            else:
                cost = sum(v[1] // rounds * v[3] for v in report.values()) + n_prompt - read // rounds
                best = least_cost(n_prompt, [(v[2], v[3]) for v in report.values()])
                if cost != best:
                    problem = f"the calls it reports ({report}) cost {cost} @decode calls a round; the least is {best}"
        if problem:
            print(f"FAIL {name}: @prefill: {problem}")
            failures += 1
        elif name == "kv cache":
            print(f"ok   {name}: the prompt read by " + (", ".join(
                f"@{k}: {v[0]} positions in {v[1]} calls ({v[2]} a call, at {v[3]})" for k, v in report.items())
                  + f"; {n_prompt - sum(v[0] for v in report.values()) // rounds} a round by @decode"
                  if report else f"@decode alone ({n_prompt} positions a round)"))
        logits = torch.from_numpy(np.load(npy)).double()
        assert logits.shape == (n, new, V), logits.shape
        assert len(seqs) == n and all(len(s) == len(prompt) + new and s[: len(prompt)] == prompt for s in seqs)
        # Rows must all differ (each samples with its own seed), or a kernel that mixed them up, or
        # rows that shared one random stream, would pass.
        if len({tuple(s) for s in seqs[:B]}) < min(B, n):
            print(f"FAIL {name}: two rows of a round sampled the same tokens; the test cannot tell them apart")
            failures += 1
        results[name] = (logits, seqs)
        worst, where = 0.0, (0, 0)
        with torch.no_grad():
            for i, s in enumerate(seqs):
                for step in range(new):
                    ctx = s[: len(prompt) + step][-T:]
                    want = reference(torch.tensor([ctx]))[0, -1, :V].double()
                    got = logits[i, step]
                    err = float((got - want).norm() / want.norm())
                    if err > worst:
                        worst, where = err, (i, step)
                    token = s[len(prompt) + step]
                    if int((got > got[token]).sum()) >= k:
                        print(f"FAIL {name}: sample {i + 1} step {step}: token {token} is not among the {k} "
                              f"largest of its logits")
                        failures += 1
        ok = worst <= tol
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {n * new} rows of logits, worst relative error {worst:.2e} "
              f"(sample {where[0] + 1}, step {where[1]}) against {oracle}")
    if a.kv_cache_only:
        sys.exit(1 if failures else 0)
    # Each pair agrees row by row while their sequences do (in bf16 an exact tie of two logits may
    # part them: each is then checked against the reference above on its own).
    for other in ("no kv cache", "no prefill"):
        (lk, sk), (lf, sf) = results["kv cache"], results[other]
        diff, rows = 0.0, 0
        for i in range(n):
            for step in range(new):
                diff = max(diff, float((lk[i, step] - lf[i, step]).norm() / lf[i, step].norm()))
                rows += 1
                if sk[i][len(prompt) + step] != sf[i][len(prompt) + step]:
                    break
        ok = diff <= tol
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} kv cache against {other}: worst relative difference {diff:.2e} over {rows} rows")
    # Temperature divides the logits: at 1e-6, over all tokens, every draw is its row's largest
    # logit (or one within 1e-3 of it, which at this temperature has no chance either: e^-1000).
    cold = base[:]
    cold[cold.index("--top-k") + 1] = "0"
    npy = os.path.join(a.workdir, "cold.npy")
    seqs = samples(run(cold + ["--temperature", "1e-6", "--logits-out", npy], exe_env)[0])
    logits = np.load(npy).astype(np.float64)
    gaps = [float(logits[i, step].max() - logits[i, step][seqs[i][len(prompt) + step]])
            for i in range(n) for step in range(new)]
    ok = max(gaps) <= 1e-3
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} --temperature 1e-6 --top-k 0: every one of {len(gaps)} draws within "
          f"{max(gaps):.1e} of its row's largest logit (at most 1e-3)")
    # --top-p over all tokens: every draw lies in its row's nucleus as Hugging Face's top-p takes it
    # (the most likely tokens whose softmax at the temperature adds up to p: a token is in when the
    # probability of those before it, more likely or tied at a lower id, is below p), from the
    # logits `sample` drew from; 1e-9 of slack for Kiln summing the same floats in another order.
    top_p, temperature = 0.6, 1.5
    nucleus = base[:]
    nucleus[nucleus.index("--top-k") + 1] = "0"
    npy = os.path.join(a.workdir, "top-p.npy")
    seqs = samples(run(nucleus + ["--top-p", str(top_p), "--temperature", str(temperature), "--logits-out", npy],
                       exe_env)[0])
    logits = torch.from_numpy(np.load(npy)).double()
    outside, sizes = [], []
    for i in range(n):
        for step in range(new):
            probs = torch.softmax(logits[i, step] / temperature, dim=0)
            token = seqs[i][len(prompt) + step]
            ids = torch.arange(V)
            before = float(probs[(probs > probs[token]) | ((probs == probs[token]) & (ids < token))].sum())
            if before >= top_p + 1e-9:
                outside.append((i, step, token, before))
            srt = torch.sort(probs, descending=True).values
            sizes.append(int(((torch.cumsum(srt, 0) - srt) < top_p).sum()))
    ok = not outside
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} --top-p {top_p} --temperature {temperature} --top-k 0: "
          f"{len(sizes) - len(outside)} of {len(sizes)} draws in their row's nucleus (of {min(sizes)} to "
          f"{max(sizes)} tokens)" + (f"; outside: sample {outside[0][0] + 1} step {outside[0][1]} token "
                                     f"{outside[0][2]}, {outside[0][3]:.4f} of the mass before it" if outside else ""))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
