#!/usr/bin/python3
"""Data-parallel ranks end to end: a compiled training executable on 2 ranks against 1 process.

    /usr/bin/python3 test/e2e/test_ranks.py --kilnc PATH/kilnc --spec SPEC.toml --workdir DIR \
        [--group mpi|tcp|all] [--mpirun mpirun] [--steps 10] [--case NAME ...]

Compiles SPEC with kilnc into DIR/gpt2, writes two llm.c token shards, trains a 1-process
reference with --total-batch 2*B*T (2 micro-steps per step), then checks (group mpi):
  mpi        `mpirun -np 2 ... --total-batch 2*B*T`: per-step loss within 1e-5, grad_norm within
             1e-5 relative, lr equal, final weights and step 0's gradients (--dump-grads) within
             1e-5; rank 0 alone logs and prints
  mpi_zero1  the same with --zero 1 and small buckets (several, with uneven ZeRO pieces), against
             both the reference and the plain 2-rank run; it samples every 3 steps too
             (--sample-every: rank 0 alone, which changes no loss or weight)
  mpi_accum  2 ranks x 2 micro-steps (--zero 1) against 1 process x 4 micro-steps
  mpi_kill   SIGKILL rank 1 after the first step: mpirun, and with it rank 0, ends non-zero
             within 60 s
  mpi_hang   SIGSTOP rank 1 with KILN_COMM_TIMEOUT=4: rank 0's watchdog ends it, and mpirun the job
  mpi_pause  the whole job stopped for 5 s with KILN_COMM_TIMEOUT=3, then resumed: it trains on
             (both ranks alive and stepping 4 s later)
  mpi_eval   `mpirun -np 2 ... eval --batches 3` against 1 process with --batches 6 (as tcp_eval)
  mpi_sample `mpirun -np 2 ... sample`: rank 0 alone samples, as 1 process; no collective's timeout
             (KILN_COMM_TIMEOUT=1) can end it
  mpi_rank_error_folder  rank 1 fails at start (missing data) while rank 0 waits for it, having
             made its --checkpoint-dir: mpirun's SIGTERM (then SIGKILL) to rank 0 leaves no folder
  mpi_arg_error  both ranks given a bad option: one error line, rank 0's (also when rank 0 starts
             3 s late); MPMD with it on rank 1 alone: that rank's, naming it
  mpi_start_error  3 ranks, one command line, failing at start (missing shards, a file that is
             not one): one error line, rank 0's; shards missing for rank 1 alone (or its --init folder
             naming a missing checkpoint, before the communicator): its line, naming it
and (group tcp, the environment rendezvous RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT):
  tcp            2 processes started here: same checks as mpi (with --zero 1 on small buckets,
                 compiled in: a --bucket-mb at run time is noted as unused);
                 rank 0's arena is smaller by half the AdamW moments (less alignment)
  single_zero1   one process with --zero 1 is the reference
  tcp_three      3 ranks, --zero 1, small compiled buckets, against 1 process with 3 micro-steps
                 (rank 0's arena: smaller by two thirds of the moments)
  tcp_three_accum  3 ranks x 2 micro-steps, --zero 1, clipping, on a --recompute=cheap --no-fusion
                 module with small buckets, against 1 process with 6 micro-steps
  tcp_zero1_resume --zero 1 checkpoints: the whole AdamW state (as a plain 2-rank run's), and a
                 run resumed from one bitwise equal to the uninterrupted run
  tcp_kill_1     SIGKILL rank 1 after the first step: rank 0 exits non-zero within 60 s, naming it
  tcp_kill_0     the same for rank 0 (the hub)
  tcp_hang       SIGSTOP rank 1 with KILN_COMM_TIMEOUT=4: rank 0 gives up on it after 4 s
  tcp_pause      both ranks stopped for 5 s with KILN_COMM_TIMEOUT=3, then resumed: they train on
  tcp_rank_error rank 1 fails at start (missing data): rank 0 exits non-zero too
  tcp_signal_at_start  SIGTERM to rank 0 before the first step (rank 1 paused meanwhile) removes the
                 checkpoint folder it made; once rank 1 goes on, both stop after step 1, whose
                 checkpoint and log lines are in that folder, made again
  tcp_no_root    rank 1 without rank 0: exits non-zero after KILN_COMM_TIMEOUT=3 s, saying so
  tcp_other_data rank 1 reads other shards of the same sizes, as training or as validation data
                 (--val-data): both ranks refuse to start
  tcp_other_checkpoints  only rank 0 has --checkpoint-dir (--zero 1): both ranks refuse to start;
                 each rank resumes from its own folder, holding other weights: both refuse, naming them
  tcp_other_options      rank 1 is given other --steps, --zero, --lr, the schedule, AdamW and
                 --grad-clip: both refuse, naming each with rank 0's value (and rank
                 1's own); rank 1 without --total-batch (the default B*T*2 that rank 0 gives): both train
  tcp_save_one_rank      only rank 1 has --save or --sample-every (rank 0 alone writes or prints
                 them): both ranks refuse to start; only rank 0 has them: both train
  tcp_log_full   rank 0's --log cannot be written: both ranks stop after the next step with its
                 checkpoint, which keeps the lines not written; the resumed run writes them first
  tcp_checkpoint_full  rank 0 cannot write its checkpoint (a file-size limit; --zero 1): both
                 ranks stop after that step at once, rank 1 pointing at rank 0's error
  tcp_cut_step   SIGTERM to rank 1 within a step of 200 micro-steps a rank: both stop after the
                 micro-step, the step left undone; resumed, the uninterrupted run bitwise
  tcp_cut_step_zero1  the same with --zero 1 --checkpoint-every 1: step 1's checkpoint is
                 written at its end, and no rank gathers the moments when step 2 is cut
  tcp_idle_peer  a silent connection reaches rank 0 before rank 1: the ranks still train
  tcp_ipv6       MASTER_ADDR=::1 (skipped without IPv6 loopback)
  nccl_refused   --comm nccl on a cpu module is an error naming the target
  tcp_eval       eval on 2 ranks (a whole pass, and --batches 3) against 1 process reading the same
                 tokens (a whole pass, --batches 6): the same loss within 1e-6 relative; rank 0 prints
  tcp_val        --val-data while training on 2 ranks (--val-steps 2): the logged val_loss equals
                 1 process's with --val-steps 4 within 1e-5
  tcp_eval_disagree  ranks given other --batches, weights or shard order: both fail, naming it
  tcp_sample     sample on 2 ranks: rank 0 alone samples, printing what 1 process prints
  tcp_threads    2 ranks without OMP_NUM_THREADS: each takes half the machine's CPUs (rank 0 says
                 so, and counts its MFU against 2 ranks x its threads), with the reference's losses;
                 the cases above set OMP_NUM_THREADS=1 and get no such note
and (group cuda, for a cuda spec compiled into kiln-run-emulated with --kilnc-arg=--runtime=...):
  tcp_plain      2 TCP ranks (no ZeRO): the same checks as tcp, through the device executor
  tcp_accum      2 ranks x 2 micro-steps against 1 process x 4
  tcp_hang_cuda  SIGSTOP rank 1 with KILN_COMM_TIMEOUT=20: rank 0 gives up on it
  tcp_zero1_cuda --zero 1 through the device executor against 1 process (its arena smaller by half
                 the moments), and its checkpoint (the AdamW moments gathered from both ranks)
                 against a plain 2-rank run's
(group cuda-zero1: that case alone, for a bf16 spec, whose compute copies the device rounds)

The shards hold 12*B*T + 1 tokens: one process with 2 micro-steps and two ranks cross to the next
shard at the same token (the loader's rule, training-semantics.md "Data", depends on
B*T*world_size, so other lengths make the two runs read different tokens at shard ends).
Exit 0 on success, 1 on failure. Python 3 standard library only.
"""
from __future__ import annotations

import argparse
import array
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import tomllib

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
from make_synthetic_shard import Generator  # noqa: E402

KILL_LIMIT_S = 60.0


class TestFailure(Exception):
    pass


def child_env(extra=None):
    env = dict(os.environ)
    # Two ranks on a small machine: one thread each; no launcher variables leaking in.
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_SIZE",
              "PMI_SIZE", "PMIX_RANK", "KILN_COMM_TIMEOUT"):
        env.pop(k, None)
    for k, v in (extra or {}).items():  # None: unset
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_shard(path: str, tokens) -> None:
    header = array.array("i", [20240520, 1, len(tokens)] + [0] * 253)
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        f.write(array.array("H", tokens).tobytes())
    os.replace(path + ".tmp", path)


def read_log(path: str, steps: int, what: str):
    if not os.path.exists(path):
        raise TestFailure(f"{what}: no log {path}")
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if len(rows) != steps or [r["step"] for r in rows] != list(range(steps)):
        raise TestFailure(f"{what}: {path} has steps {[r['step'] for r in rows]}, expected 0..{steps - 1} once each "
                          "(only rank 0 may write the log)")
    return rows


def read_safetensors(path: str):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        a = array.array("f")
        a.frombytes(data[b:e])
        out[name] = a
    return out


def compare_runs(what: str, ref, got, ref_w=None, got_w=None, tol=1e-5):
    worst_loss = worst_norm = 0.0
    for r, g in zip(ref, got):
        if r["lr"] != g["lr"]:
            raise TestFailure(f"{what}: step {r['step']}: lr {g['lr']} != {r['lr']}")
        dl = abs(r["loss"] - g["loss"])
        dn = abs(r["grad_norm"] - g["grad_norm"]) / max(abs(r["grad_norm"]), 1e-12)
        worst_loss, worst_norm = max(worst_loss, dl), max(worst_norm, dn)
        if not dl <= tol:
            raise TestFailure(f"{what}: step {r['step']}: loss {g['loss']!r} vs {r['loss']!r} (|diff| {dl:.2e} > {tol})")
        if not dn <= tol:
            raise TestFailure(f"{what}: step {r['step']}: grad_norm {g['grad_norm']!r} vs {r['grad_norm']!r} "
                              f"(rel diff {dn:.2e} > {tol})")
    worst_w = 0.0
    if ref_w is not None:
        if set(ref_w) != set(got_w):
            raise TestFailure(f"{what}: saved tensors differ: {sorted(set(ref_w) ^ set(got_w))}")
        for name in ref_w:
            d = max((abs(a - b) for a, b in zip(ref_w[name], got_w[name])), default=0.0)
            worst_w = max(worst_w, d)
            if not d <= tol:
                kind = "step 0's gradient of" if name.startswith("grad:") else "the final weights"
                raise TestFailure(f"{what}: {kind} {name.removeprefix('grad:')} differ by {d:.2e} > {tol}")
    return f"max |dloss| {worst_loss:.1e}, max rel dnorm {worst_norm:.1e}, max |dweight or dgrad| {worst_w:.1e}"


class Ctx:
    def __init__(self, a):
        self.a = a
        self.workdir = os.path.abspath(a.workdir)
        self.exe = os.path.join(self.workdir, "gpt2")
        self.steps = a.steps
        self.mpirun = shutil.which(a.mpirun) or a.mpirun
        self.compiled = set()

    def train_args(self, tag, extra=(), steps=None, log=True, save=True, micro=2):
        args = [self.exe, "train", "--data", os.path.join(self.workdir, "train_*.bin"),
                "--steps", str(steps or self.steps), "--lr", "1e-3", "--warmup-steps", "2",
                "--total-batch", str(micro * self.B * self.T), "--seed", "7", "--print-every", "1"]
        if log:
            path = os.path.join(self.workdir, f"{tag}.jsonl")
            if os.path.exists(path):
                os.remove(path)
            args += ["--log", path]
        if save:
            args += ["--save", os.path.join(self.workdir, f"{tag}.safetensors"),
                     "--dump-grads", os.path.join(self.workdir, f"{tag}.grads.safetensors")]
        return args + list(extra)

    def small_buckets(self, mb="0.03"):
        """SPEC compiled with mb-MB gradient buckets (several; uneven ZeRO-1 pieces): the buckets
        are the module's, so a run's --bucket-mb cannot make them (it only notes so). At most a
        quarter of the gradients' bytes, so that a very small model has several too."""
        mb = f"{min(float(mb), self.grad_mb / 4):.3g}"
        small = os.path.join(self.workdir, f"gpt2-buckets-{mb}")
        if small not in self.compiled:  # once a run, by this kilnc (the workdir is kept)
            self.compiled.add(small)
            subprocess.run([self.a.kilnc, self.a.spec, "-o", small, "--bucket-mb", mb, *self.a.kilnc_arg],
                           check=True, cwd=self.workdir, capture_output=True)
        return small

    def inspect(self, module, *args):
        """kiln-inspect --json of `module` (with `args`), parsed."""
        inspect = os.path.join(os.path.dirname(self.a.kilnc), "kiln-inspect")
        return json.loads(subprocess.run([inspect, module, "--json", *args], check=True, capture_output=True,
                                         text=True).stdout)

    def with_exe(self, exe):
        """A per_rank function (start_tcp) that runs `exe` instead of the spec's executable."""
        return lambda r, args: [exe if a == self.exe else a for a in args]

    def mpirun_cmd(self, n=2):
        return [self.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(n), "--bind-to", "none",
                "--mca", "btl_vader_single_copy_mechanism", "none",
                "-x", "OMP_NUM_THREADS", "-x", "OPENBLAS_NUM_THREADS"]

    def run(self, cmd, what, env=None, timeout=300):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.workdir,
                               env=env or child_env())
        except subprocess.TimeoutExpired:
            raise TestFailure(f"{what}: did not finish within {timeout} s: {' '.join(cmd)}")
        if p.returncode != 0:
            raise TestFailure(f"{what}: exit {p.returncode}: {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        return p

    def log(self, tag):
        return read_log(os.path.join(self.workdir, f"{tag}.jsonl"), self.steps, tag)

    def weights(self, tag):
        """The final weights, and step 0's averaged gradients (as "grad:" + name)."""
        w = read_safetensors(os.path.join(self.workdir, f"{tag}.safetensors"))
        for name, g in read_safetensors(os.path.join(self.workdir, f"{tag}.grads.safetensors")).items():
            w["grad:" + name] = g
        return w


def setup(c: Ctx):
    os.makedirs(c.workdir, exist_ok=True)
    with open(c.a.spec, "rb") as f:
        spec = tomllib.load(f)
    c.B, c.T = int(spec["compile"]["batch_size"]), int(spec["compile"]["seq_len"])
    V = int(spec["model"]["vocab_size"])
    subprocess.run([c.a.kilnc, c.a.spec, "-o", c.exe, *c.a.kilnc_arg], check=True, cwd=c.workdir)
    c.grad_mb = c.inspect(c.exe)["accounting"]["gradients"] / 2**20
    gen = Generator(V, 1234)
    n = 12 * c.B * c.T + 1
    for i in range(2):
        write_shard(os.path.join(c.workdir, f"train_{i:03d}.bin"), gen.generate(n))
    c.run(c.train_args("ref"), "reference (1 process, 2 micro-steps)")
    c.ref, c.ref_w = c.log("ref"), c.weights("ref")


# ---------------------------------------------------------------------------------------------
# MPI
# ---------------------------------------------------------------------------------------------
def case_mpi(c: Ctx):
    p = c.run(c.mpirun_cmd() + c.train_args("mpi"), "mpirun -np 2")
    if "data parallel: rank 0 of 2 over MPI" not in p.stderr:
        raise TestFailure(f"mpi: rank 0 did not announce 2 MPI ranks:\n{p.stderr}")
    if p.stdout.count(f"step     1/{c.steps} ") != 1:
        raise TestFailure(f"mpi: progress printed by more than rank 0:\n{p.stdout}")
    return compare_runs("mpi vs 1 process", c.ref, c.log("mpi"), c.ref_w, c.weights("mpi"))


def case_mpi_zero1(c: Ctx):
    sampling = ["--sample-every", "3", "--sample-count", "2", "--sample-tokens", "4", "--sample-prompt-ids", "1 2"]
    p = c.run(c.mpirun_cmd() + c.with_exe(c.small_buckets())(0, c.train_args("mpi_zero1", ["--zero", "1"] + sampling)),
              "mpirun --zero 1 --sample-every 3")
    buckets = re.search(r"; (\d+) gradient bucket\(s\) placed by the compiler", p.stderr)
    if not buckets or int(buckets.group(1)) < 2:
        raise TestFailure(f"mpi --zero 1: not run on the module's several buckets:\n{p.stderr}")
    # Samples after steps 3, 6, 9, ... and the last, each printed once (by rank 0).
    want = sorted({s for s in range(1, c.steps + 1) if s % 3 == 0} | {c.steps})
    for s in want:
        if p.stdout.count(f"--- sample 2 at step {s} ---\n") != 1:
            raise TestFailure(f"mpi --zero 1: sample 2 of step {s} not printed once:\n{p.stdout}")
    got, got_w = c.log("mpi_zero1"), c.weights("mpi_zero1")
    msg = compare_runs("mpi --zero 1 vs 1 process", c.ref, got, c.ref_w, got_w) + f"; samples after steps {want}"
    if os.path.exists(os.path.join(c.workdir, "mpi.jsonl")):
        compare_runs("mpi --zero 1 vs mpi", c.log("mpi"), got, c.weights("mpi"), got_w)
    return msg


def case_mpi_accum(c: Ctx):
    # 2 ranks x 2 micro-steps against 1 process x 4: accumulation and averaging together.
    c.run(c.train_args("ref4", micro=4), "reference (1 process, 4 micro-steps)")
    c.run(c.mpirun_cmd() + c.train_args("mpi_accum", ["--zero", "1"], micro=4), "mpirun --total-batch 4*B*T")
    return compare_runs("mpi 2x2 vs 1 process x4", c.log("ref4"), c.log("mpi_accum"), c.weights("ref4"),
                        c.weights("mpi_accum"))


def wait_for(cond, limit, what):
    t = time.monotonic()
    while not cond():
        if time.monotonic() - t > limit:
            raise TestFailure(f"timed out waiting for {what}")
        time.sleep(0.05)


def alive(pid):
    """True while the process runs (a zombie, whose parent has not reaped it yet, has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def log_has_a_step(path):
    return os.path.exists(path) and os.path.getsize(path) > 0


def start_mpi_job(c: Ctx, tag, env_extra=None):
    """Starts 2 ranks under mpirun training for good (until they are ended), and waits for the
    first step. Returns mpirun's Popen, {rank: pid}, the log's path and the stderr file's path."""
    piddir = os.path.join(c.workdir, "pids")
    shutil.rmtree(piddir, ignore_errors=True)
    os.makedirs(piddir)
    logp = os.path.join(c.workdir, f"{tag}.jsonl")
    wrap = ["sh", "-c", f'echo $$ > {piddir}/rank_$OMPI_COMM_WORLD_RANK; exec "$@"', "sh"]
    cmd = c.mpirun_cmd() + [a for k in (env_extra or {}) for a in ("-x", k)] + wrap + \
        c.train_args(tag, steps=10**6, save=False)
    # Not pipes that nobody reads while it runs: rank 0 prints a line a step, and mpirun stops
    # (and never ends the job) once such a pipe is full.
    errp = os.path.join(c.workdir, f"{tag}.stderr")
    with open(errp, "w") as errf:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf, text=True, cwd=c.workdir,
                             env=child_env(env_extra), start_new_session=True)
    try:
        wait_for(lambda: log_has_a_step(logp) and len(os.listdir(piddir)) == 2, 60, "the first step under mpirun")
        time.sleep(0.2)  # the pid files are written before exec
        pid = {r: int(open(os.path.join(piddir, f"rank_{r}")).read()) for r in (0, 1)}
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    return p, pid, logp, errp


def mpi_fail(c: Ctx, tag, sig, env_extra=None, expect=None):
    """Starts 2 ranks under mpirun, sends `sig` to rank 1 after the first step, and requires
    mpirun to exit non-zero and rank 0 to end within KILL_LIMIT_S."""
    p, pid, _, errp = start_mpi_job(c, tag, env_extra)
    try:
        os.kill(pid[1], sig)
        t0 = time.monotonic()
        try:
            rc = p.wait(timeout=KILL_LIMIT_S)
        except subprocess.TimeoutExpired:
            raise TestFailure(f"{tag}: mpirun still running {KILL_LIMIT_S:.0f} s after rank 1 got signal {sig}")
        err = open(errp).read()
        try:
            wait_for(lambda: not alive(pid[0]), max(1.0, KILL_LIMIT_S - (time.monotonic() - t0)), "rank 0 to end")
        except TestFailure:
            raise TestFailure(f"{tag}: rank 0 (pid {pid[0]}) still alive {KILL_LIMIT_S:.0f} s after rank 1 got signal {sig}")
        dt = time.monotonic() - t0
        if rc == 0:
            raise TestFailure(f"{tag}: mpirun exited 0 after rank 1 got signal {sig}:\n{err[-2000:]}")
        if expect and expect not in err:
            raise TestFailure(f"{tag}: no '{expect}' in the output:\n{err[-2000:]}")
        said = [line for line in err.splitlines() if line.startswith("error:")]
        return f"mpirun exited {rc}, rank 0 ended {dt:.1f} s after signal {sig} to rank 1" + \
            (f": {said[0]}" if said else "")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if alive(pid[1]):
            os.kill(pid[1], signal.SIGKILL)  # a stopped rank mpirun could not end


def case_mpi_arg_error(c: Ctx):
    # Both ranks given one bad option: rank 0 alone says so, even when rank 1 fails first; in the
    # MPMD form, rank 1 alone, naming itself.
    good = c.train_args("mpi_arg_error", [], save=False, log=False)
    bad = good + ["--bogus"]
    line = "The following argument was not expected: --bogus"
    slow_root = ["sh", "-c", 'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then sleep 3; fi; exec "$@"', "sh"]
    for cmd, want in ((c.mpirun_cmd(2) + bad, [f"error: {line}"]),
                      (c.mpirun_cmd(2) + slow_root + bad, [f"error: {line}"]),  # (rank 1 fails first)
                      (c.mpirun_cmd(1) + good + [":", "-np", "1"] + bad, [f"error: rank 1 of 2: {line}"])):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=KILL_LIMIT_S, cwd=c.workdir, env=child_env())
        said = [ln.split(" (see ")[0] for ln in p.stderr.splitlines() if ln.startswith("error: ")]
        if p.returncode == 0 or said != want:
            raise TestFailure(f"mpi_arg_error: exit {p.returncode}, errors {said}, not {want}:\n{p.stderr[-2000:]}")
    return "one error line, from rank 0 (one command line) or the rank given it (MPMD)"


def case_mpi_start_error(c: Ctx):
    # 3 ranks sharing one command line that fails at start: rank 0 alone says so. An error that
    # rank 1 alone meets (its working folder lacks the shards): rank 1 says it, naming itself.
    bad = os.path.join(c.workdir, "not_a_shard.bin")
    with open(bad, "wb") as f:
        f.write(b"x" * 100)
    args = c.train_args("mpi_start_error", save=False, log=False, micro=3)
    at = args.index("--data") + 1
    missing, wrong, relative = list(args), list(args), list(args)
    missing[at], wrong[at], relative[at] = os.path.join(c.workdir, "missing_*.bin"), bad, "train_*.bin"
    empty = os.path.join(c.workdir, "mpi_start_error_empty")
    os.makedirs(empty, exist_ok=True)
    rank1_elsewhere = ["sh", "-c", f'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then cd {empty}; fi; exec "$@"', "sh"]
    # (an error before the communicator is made: rank 1's --init folder names a missing checkpoint)
    os.makedirs(os.path.join(empty, "ck"), exist_ok=True)
    with open(os.path.join(empty, "ck", "latest"), "w") as f:
        f.write("ckpt_00000005.kiln-ckpt\n")
    for cmd, about, want, env in (
            (missing, "no file matches", "error: rank 0 of 3: ", {}),
            (wrong, "not an llm.c token shard", "error: rank 0 of 3: ", {}),
            # (KILN_COMM_TIMEOUT=8: rank 1 says its own after 2 s, not 10)
            (rank1_elsewhere + relative, "no file matches", "error: rank 1 of 3: train_*.bin: ",
             {"KILN_COMM_TIMEOUT": "8"}),
            (rank1_elsewhere + args + ["--init", "ck"], "which does not exist", "error: rank 1 of 3: ck/latest: ",
             {"KILN_COMM_TIMEOUT": "8"})):
        cmd = c.mpirun_cmd(3) + [a for k in env for a in ("-x", k)] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=KILL_LIMIT_S, cwd=c.workdir,
                           env=child_env(env))
        said = [ln for ln in p.stderr.splitlines() if about in ln]
        if p.returncode == 0 or len(said) != 1 or not said[0].startswith(want):
            raise TestFailure(f"mpi_start_error: exit {p.returncode}, '{about}' said {len(said)} times, not once "
                              f"starting '{want}':\n{p.stderr[-2000:]}")
    return "a start-up error every rank meets said once (rank 0's), one rank 1 alone meets by rank 1"


def case_mpi_rank_error_folder(c: Ctx):
    # One app context a rank (mpirun's MPMD form): rank 1 reads shards that do not exist.
    ck = os.path.join(c.workdir, "mpi_rank_error_ck")
    shutil.rmtree(ck, ignore_errors=True)
    extra = ["--checkpoint-dir", os.path.join(ck, "run")]
    rank0 = c.train_args("mpi_rank_error", extra, save=False, log=False)
    rank1 = list(rank0)
    rank1[rank1.index("--data") + 1] = os.path.join(c.workdir, "missing_*.bin")
    cmd = c.mpirun_cmd(1) + rank0 + [":", "-np", "1"] + rank1
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=KILL_LIMIT_S, cwd=c.workdir, env=child_env())
    if p.returncode == 0:
        raise TestFailure(f"mpi_rank_error_folder: mpirun exited 0:\n{p.stderr[-2000:]}")
    if "no file matches" not in p.stderr:
        raise TestFailure(f"mpi_rank_error_folder: rank 1 does not say why:\n{p.stderr[-2000:]}")
    if os.path.exists(ck):
        raise TestFailure(f"mpi_rank_error_folder: {ck} is left behind: {sorted(os.listdir(ck))}\n{p.stderr[-2000:]}")
    said = "rank 0 got SIGTERM" if "rank 0: SIGTERM" in p.stderr else "rank 0 ended"
    return f"mpirun exited {p.returncode}, {said}; no checkpoint folder left"


def case_mpi_kill(c: Ctx):
    return mpi_fail(c, "mpi_kill", signal.SIGKILL)


def case_mpi_hang(c: Ctx):
    # A stopped (hung) rank: the watchdog ends rank 0 after KILN_COMM_TIMEOUT, mpirun the rest.
    return mpi_fail(c, "mpi_hang", signal.SIGSTOP, {"KILN_COMM_TIMEOUT": "4"}, "did not complete within 4 s")


def survives_pause(tag, pid, logp, running, errors):
    """Pauses a 2-rank job training for KILN_COMM_TIMEOUT=3 s longer than its limit, and requires
    it to train on. Rank 0 is stopped first, so that rank 1 waits in a collective (its timeout
    running) when it is stopped too; time stopped is not time waited, so rank 1, resumed 1 s
    before rank 0 (as for a rank still in a long step), waits for it. running(): the job runs;
    errors(): what it printed."""
    def logged_steps():
        with open(logp) as f:
            return sum(1 for line in f if line.strip())
    if not running():
        raise TestFailure(f"{tag}: the job ended before its pause:\n{errors()[-2000:]}")
    os.kill(pid[0], signal.SIGSTOP)
    time.sleep(0.5)
    os.kill(pid[1], signal.SIGSTOP)
    time.sleep(5)  # past the 3 s limit
    before = logged_steps()
    os.kill(pid[1], signal.SIGCONT)
    time.sleep(1)
    os.kill(pid[0], signal.SIGCONT)
    time.sleep(4)  # past the limit again: a timeout that counted the pause has fired by now
    after = logged_steps()
    if not running() or after < before + 3:
        raise TestFailure(f"{tag}: 4 s after a 5 s pause (KILN_COMM_TIMEOUT=3) the job "
                          f"{'runs' if running() else 'has ended'}, {after - before} more steps logged:\n"
                          f"{errors()[-2000:]}")
    return f"paused 5 s with KILN_COMM_TIMEOUT=3, resumed: {after - before} steps in the next 4 s"


def case_mpi_pause(c: Ctx):
    # The whole job paused (Ctrl-Z, or SIGSTOP to every rank) for longer than KILN_COMM_TIMEOUT,
    # then resumed: it trains on (the watchdog leaves the pause out).
    tag = "mpi_pause"
    p, pid, logp, errp = start_mpi_job(c, tag, {"KILN_COMM_TIMEOUT": "3"})
    try:
        return survives_pause(tag, pid, logp, lambda: p.poll() is None and alive(pid[0]) and alive(pid[1]),
                              lambda: open(errp).read())
    finally:
        for q in pid.values():
            if alive(q):
                os.kill(q, signal.SIGCONT)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


# ---------------------------------------------------------------------------------------------
# TCP rendezvous
# ---------------------------------------------------------------------------------------------
def start_tcp(c: Ctx, tag, extra=(), steps=None, save=True, port=None, per_rank=None, env_extra=None, micro=2,
              world=2, stdout=subprocess.PIPE):
    port = port or free_port()
    procs = []
    for r in range(world):
        env = child_env({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": str(port), **(env_extra or {})})
        args = c.train_args(tag, extra, steps=steps, save=save, log=(r == 0), micro=micro)
        if r > 0:
            args += ["--log", os.path.join(c.workdir, f"{tag}.jsonl")]  # the same file: must stay unwritten
        if per_rank:
            args = per_rank(r, args)
        procs.append(subprocess.Popen(args, stdout=stdout, stderr=subprocess.PIPE, text=True,
                                      cwd=c.workdir, env=env))
    return procs, port


def finish(procs, timeout=300):
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise TestFailure("tcp ranks did not finish in time")
        out.append((p.returncode, o, e))
    return out


def finish_ok(procs, tag, timeout=300):
    """finish(), and a TestFailure naming the first rank that did not exit 0."""
    res = finish(procs, timeout)
    for r, (rc, o, e) in enumerate(res):
        if rc != 0:
            raise TestFailure(f"{tag}: rank {r} exit {rc}\n{o[-2000:]}\n{e[-2000:]}")
    return res


def logged(c: Ctx, tag):
    """(step, loss, grad_norm, lr) of every line rank 0 logged for tag: not the timings."""
    rows = [json.loads(line) for line in open(os.path.join(c.workdir, f"{tag}.jsonl")) if line.strip()]
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in rows]


def run_tcp_pair(c: Ctx, tag, extra, per_rank=None):
    """Two TCP ranks to the end: both exit 0, rank 0 announces the rendezvous, rank 1 prints nothing."""
    procs, port = start_tcp(c, tag, extra, per_rank=per_rank)
    res = finish_ok(procs, tag)
    if f"data parallel: rank 0 of 2 over TCP (rendezvous at 127.0.0.1:{port})" not in res[0][2]:
        raise TestFailure(f"{tag}: rank 0 did not announce the TCP rendezvous:\n{res[0][2]}")
    if res[1][1].strip():
        raise TestFailure(f"{tag}: rank 1 printed progress:\n{res[1][1]}")
    return res


def check_zero1_arena(c: Ctx, tag: str, stderr: str, world: int, module=None):
    """Rank 0's arena under --zero 1 keeps about 1/world of the AdamW moments (kiln-inspect's
    optimizer_state bytes): the saving it announces is the rest, less the slices' 256-byte alignment;
    and it is what `kiln-inspect --ranks world --zero 1` predicts, to the byte (as printed)."""
    m = re.search(r"this rank keeps 1/(\d+) of the AdamW moments: its arena is ([\d.]+) MiB, not ([\d.]+)", stderr)
    if not m or int(m.group(1)) != world:
        raise TestFailure(f"{tag}: rank 0 did not say what its arena keeps of the moments:\n{stderr}")
    info = c.inspect(module or c.exe, "--ranks", str(world), "--zero", "1")
    dp = info["data_parallel"]
    predicted = (f"{dp['arena_bytes_per_rank'][0] / 2**20:.2f}", f"{dp['arena_bytes_one_process'] / 2**20:.2f}")
    if predicted != (m.group(2), m.group(3)):
        raise TestFailure(f"{tag}: rank 0's arena is {m.group(2)} MiB (not {m.group(3)}); kiln-inspect --ranks "
                          f"{world} --zero 1 predicts {predicted[0]} (not {predicted[1]})")
    moments = info["accounting"]["optimizer_state"] / 2**20
    n_moments = 2 * len(info["parameters"])
    saved, want = float(m.group(3)) - float(m.group(2)), moments * (world - 1) / world
    slack = n_moments * 512 / 2**20 + 0.01  # per sliced moment < 512 bytes of alignment; printed to 0.01
    if abs(saved - want) > slack:
        raise TestFailure(f"{tag}: rank 0's arena is {saved:.2f} MiB smaller, expected {want:.2f} "
                          f"({world} ranks, {moments:.2f} MiB of moments)")
    return f"rank 0's arena {m.group(2)} MiB, not {m.group(3)} ({moments:.2f} MiB of moments)"


def case_tcp(c: Ctx):
    # On small compiled buckets; a --bucket-mb given at run time is noted as unused, and the ranks
    # do not compare it (rank 1's differs).
    small = c.small_buckets()

    def per_rank(r, args):
        args = c.with_exe(small)(r, args)
        return args + ["--bucket-mb", "1" if r == 0 else "2"]
    res = run_tcp_pair(c, "tcp", ["--zero", "1"], per_rank=per_rank)
    if "ranks share this machine" in res[0][2]:  # OMP_NUM_THREADS=1 chose
        raise TestFailure(f"tcp: rank 0 shared the CPUs out although OMP_NUM_THREADS is set:\n{res[0][2]}")
    buckets = re.search(r"; (\d+) gradient bucket\(s\) placed by the compiler", res[0][2])
    if not buckets or int(buckets.group(1)) < 2:
        raise TestFailure(f"tcp: not run on the module's several buckets:\n{res[0][2]}")
    if not re.search(r"^training \S+ on cpu: \d+ steps, .* on each of 2 ranks", res[0][2], re.M):
        raise TestFailure(f"tcp: rank 0's first line does not say the device and the ranks:\n{res[0][2]}")
    if "note: --bucket-mb is not used: this module's buckets were placed by kilnc" not in res[0][2]:
        raise TestFailure(f"tcp: --bucket-mb 1 not noted as unused:\n{res[0][2]}")
    # The notes for one process (--zero 1 and --bucket-mb have no effect there) are not said by ranks.
    for r in (0, 1):
        if "in one process" in res[r][2]:
            raise TestFailure(f"tcp: rank {r} notes an option as having no effect in one process:\n{res[r][2]}")
    arena = check_zero1_arena(c, "tcp", res[0][2], 2, module=small)
    return (compare_runs("tcp --zero 1 vs 1 process", c.ref, c.log("tcp"), c.ref_w, c.weights("tcp")) +
            f"; {buckets.group(1)} compiled buckets; " + arena)


def read_checkpoint(path: str):
    """A Kiln checkpoint's tensors (runtime/checkpoint.h, version 1) as {"name:field": floats}."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:8] != b"KILNCKPT":
        raise TestFailure(f"{path}: not a Kiln checkpoint")
    header_len = struct.unpack("<Q", blob[16:24])[0]
    header = json.loads(blob[32:32 + header_len])
    data = blob[32 + header_len:]
    out = {}
    for p in header["parameters"]:
        for field in ("value", "adam_m", "adam_v"):
            b, n = p[field]
            a = array.array("f")
            a.frombytes(data[b:b + n])
            out[f"{p['name']}:{field}"] = a
    return header, out


def compare_checkpoints(what: str, zero1: str, plain: str, tol=1e-4):
    """A 2-rank --zero 1 checkpoint against a plain 2-rank run's: every value and moment within
    tol of the tensor's largest magnitude (a moment left ungathered is off by all of it)."""
    header, got = read_checkpoint(zero1)
    _, want = read_checkpoint(plain)
    if header["zero_stage"] != 1 or header["world_size"] != 2:
        raise TestFailure(f"{what}: {zero1} says zero_stage {header['zero_stage']}, world_size {header['world_size']}")
    worst = 0.0
    for name, w in want.items():
        scale = max(max(abs(x) for x in w), 1e-30)
        d = max(abs(a - b) for a, b in zip(got[name], w)) / scale
        worst = max(worst, d)
        if not d <= tol:
            raise TestFailure(f"{what}: {name} of {zero1} differs from the plain run's by {d:.2e} of its largest")
    return worst


def case_tcp_zero1_resume(c: Ctx):
    # --zero 1 checkpoints hold the whole AdamW state (each rank's pieces gathered): the same
    # tensors as a plain 2-rank run's checkpoint, and a run resumed from one is bitwise the
    # uninterrupted run. Rewinding `latest` stands in for a kill (test_checkpoint.py kills).
    steps, zero, small = 40, ["--zero", "1"], c.with_exe(c.small_buckets())
    ck, plain_ck = os.path.join(c.workdir, "zero1_ck"), os.path.join(c.workdir, "plain_ck")
    for d in (ck, plain_ck):
        shutil.rmtree(d, ignore_errors=True)

    def pair(tag, extra):
        procs, _ = start_tcp(c, tag, extra, steps=steps, save=False, per_rank=small)
        finish_ok(procs, tag)
        return logged(c, tag)

    def final_weights(tag):
        return read_safetensors(os.path.join(c.workdir, f"{tag}.safetensors"))

    save = lambda tag: ["--save", os.path.join(c.workdir, f"{tag}.safetensors")]  # noqa: E731
    ref = pair("zero1_nock", zero + save("zero1_nock"))
    every = ["--checkpoint-dir", ck, "--checkpoint-every", "10", "--keep", "0"]
    run = pair("zero1_ck", zero + every + save("zero1_ck"))
    if run != ref or final_weights("zero1_ck") != final_weights("zero1_nock"):
        raise TestFailure("zero1_resume: checkpointing changed the run (losses or final weights differ)")
    pair("plain_ck", ["--checkpoint-dir", plain_ck, "--checkpoint-every", "10"])

    # The whole state: against the plain run's checkpoint at the same step.
    last = f"ckpt_{steps:08d}.kiln-ckpt"
    worst_state = compare_checkpoints("zero1_resume", os.path.join(ck, last), os.path.join(plain_ck, last))

    # Rewind to step 20 and resume: steps 20..39 and the final weights bitwise as uninterrupted.
    for n in (30, 40):
        os.remove(os.path.join(ck, f"ckpt_{n:08d}.kiln-ckpt"))
    with open(os.path.join(ck, "latest"), "w") as f:
        f.write("ckpt_00000020.kiln-ckpt\n")
    resumed = pair("zero1_resumed", zero + every + ["--resume"] + save("zero1_resumed"))
    if [r[0] for r in resumed] != list(range(20, steps)):
        raise TestFailure(f"zero1_resume: the resumed run logged steps {[r[0] for r in resumed]}")
    differ = [r[0] for r, g in zip(ref[20:], resumed) if r != g]
    if differ:
        raise TestFailure(f"zero1_resume: resumed losses or norms differ from the uninterrupted run at steps {differ}")
    if final_weights("zero1_resumed") != final_weights("zero1_nock"):
        raise TestFailure("zero1_resume: the resumed run's final weights differ from the uninterrupted run's")
    # The same checkpoint resumed without ZeRO-1: the file holds the whole state either way.
    os.remove(os.path.join(ck, "latest"))
    for n in (30, 40):
        p = os.path.join(ck, f"ckpt_{n:08d}.kiln-ckpt")
        if os.path.exists(p):
            os.remove(p)
    plain = pair("zero1_resumed_plain", every + ["--resume"] + save("zero1_resumed_plain"))
    worst = max(abs(r[1] - g[1]) for r, g in zip(ref[20:], plain))
    if [r[0] for r in plain] != list(range(20, steps)) or not worst <= 1e-5:
        raise TestFailure(f"zero1_resume: resumed with --zero 0: steps {[r[0] for r in plain]}, |dloss| {worst:.2e}")
    return (f"checkpoint state vs plain 2-rank run: max rel diff {worst_state:.1e}; resumed at step 20: "
            f"{steps - 20} losses and final weights bitwise equal; resumed with --zero 0: |dloss| {worst:.1e}")


def case_tcp_three(c: Ctx):
    # 3 ranks, --zero 1, against 1 process with 3 micro-steps (the same tokens), compiled with
    # small buckets: uneven pieces, and parameters of which some ranks own no element.
    c.run(c.train_args("ref3", micro=3), "reference (1 process, 3 micro-steps)")
    small = c.small_buckets("0.01")
    procs, _ = start_tcp(c, "tcp_three", ["--zero", "1"], micro=3, world=3, per_rank=c.with_exe(small))
    res = finish_ok(procs, "tcp_three")
    for r, (rc, o, e) in enumerate(res):
        if r > 0 and o.strip():
            raise TestFailure(f"tcp_three: rank {r} printed progress:\n{o}")
    arena = check_zero1_arena(c, "tcp_three", res[0][2], 3, module=small)
    return compare_runs("tcp 3 ranks --zero 1 vs 1 process x3", c.log("ref3"), c.log("tcp_three"), c.weights("ref3"),
                        c.weights("tcp_three")) + "; " + arena


def case_tcp_three_accum(c: Ctx):
    # 3 ranks x 2 micro-steps (--zero 1, a --grad-clip that clips) against 1 process x 6, both on
    # a module compiled with --recompute=cheap --no-fusion and small buckets.
    exe = os.path.join(c.workdir, "gpt2-recompute-nofusion")
    subprocess.run([c.a.kilnc, c.a.spec, "-o", exe, "--recompute=cheap", "--no-fusion", "--bucket-mb", "0.01",
                    *c.a.kilnc_arg], check=True, cwd=c.workdir, capture_output=True)
    clip = ["--grad-clip", "0.05"]
    c.run(c.with_exe(exe)(0, c.train_args("ref6", clip, micro=6)), "reference (1 process, 6 micro-steps)")
    if not all(r["grad_norm"] > 0.05 for r in c.log("ref6")):
        raise TestFailure(f"tcp_three_accum: --grad-clip 0.05 clips no step: {c.log('ref6')}")
    procs, _ = start_tcp(c, "tcp_three_accum", ["--zero", "1"] + clip, micro=6, world=3, per_rank=c.with_exe(exe))
    finish_ok(procs, "tcp_three_accum")
    return compare_runs("tcp 3 ranks x2 --zero 1 vs 1 process x6", c.log("ref6"), c.log("tcp_three_accum"),
                        c.weights("ref6"), c.weights("tcp_three_accum"))


def case_single_zero1(c: Ctx):
    c.run(c.train_args("single_zero1", ["--zero", "1"]), "1 process --zero 1")
    return compare_runs("1 process --zero 1", c.ref, c.log("single_zero1"), c.ref_w, c.weights("single_zero1"), tol=0)


def tcp_kill(c: Ctx, victim: int, sig=signal.SIGKILL, tag=None, expect="disconnected", extra=(), timeout="4"):
    tag = tag or f"tcp_kill_{victim}"
    # Rank 0's line a step goes nowhere: a full pipe nobody reads would stop it on its own.
    procs, port = start_tcp(c, tag, extra, steps=10**6, save=False, env_extra={"KILN_COMM_TIMEOUT": timeout},
                            stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: log_has_a_step(os.path.join(c.workdir, f"{tag}.jsonl")), 60, "the first TCP step")
        procs[victim].send_signal(sig)
        t0 = time.monotonic()
        other = procs[1 - victim]
        try:
            rc = other.wait(timeout=KILL_LIMIT_S)
        except subprocess.TimeoutExpired:
            raise TestFailure(f"{tag}: rank {1 - victim} still running {KILL_LIMIT_S:.0f} s after rank {victim} was killed")
        dt = time.monotonic() - t0
        _, err = other.communicate()
        if rc == 0:
            raise TestFailure(f"{tag}: rank {1 - victim} exited 0")
        peer = f"rank 1 (127.0.0.1:" if victim == 1 else f"rank 0 (127.0.0.1:{port})"
        if peer not in err or expect not in err:
            raise TestFailure(f"{tag}: rank {1 - victim}'s message does not name {peer}... {expect}:\n{err[-2000:]}")
        last = [line for line in err.splitlines() if line.startswith("error:")]
        return f"rank {1 - victim} exited {rc} after {dt:.2f} s: {last[-1] if last else '?'}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            if p.stderr and not p.stderr.closed:  # (the survivor's was read above)
                p.communicate()


def case_tcp_kill_1(c: Ctx):
    return tcp_kill(c, 1)


def case_tcp_kill_0(c: Ctx):
    return tcp_kill(c, 0)


def case_tcp_hang(c: Ctx):
    return tcp_kill(c, 1, signal.SIGSTOP, "tcp_hang", "for 4 s (hung or unreachable")


def case_tcp_rank_error(c: Ctx):
    def bad_data(r, args):
        if r == 1:
            args[args.index("--data") + 1] = os.path.join(c.workdir, "missing_*.bin")
        return args
    t0 = time.monotonic()
    procs, _ = start_tcp(c, "tcp_rank_error", save=False, per_rank=bad_data)
    res = finish(procs, timeout=KILL_LIMIT_S)
    dt = time.monotonic() - t0
    if res[0][0] == 0 or res[1][0] == 0:
        raise TestFailure(f"tcp_rank_error: exit codes {res[0][0]}, {res[1][0]}; both must fail")
    if "no file matches" not in res[1][2]:
        raise TestFailure(f"tcp_rank_error: rank 1 does not say why:\n{res[1][2]}")
    if "rank 1 (127.0.0.1:" not in res[0][2] or "disconnected" not in res[0][2]:
        raise TestFailure(f"tcp_rank_error: rank 0 does not name rank 1:\n{res[0][2]}")
    return f"both ranks failed within {dt:.2f} s: {res[1][2].strip().splitlines()[-1]}"


def case_tcp_signal_at_start(c: Ctx):
    ck = os.path.join(c.workdir, "tcp_signal_at_start_ck")
    shutil.rmtree(ck, ignore_errors=True)
    run = os.path.join(ck, "run")
    logp = os.path.join(run, "run.jsonl")
    # GPT-2's vocabulary: a start of tens of milliseconds (its embedding's AdamW state and initial
    # values), within which rank 1 is paused.
    spec = os.path.join(c.workdir, "wide_vocab.toml")
    with open(c.a.spec) as f:
        text = re.sub(r"(?m)^vocab_size = .*$", "vocab_size = 50257", f.read())
    with open(spec, "w") as f:
        f.write(text)
    exe = os.path.join(c.workdir, "gpt2-wide-vocab")
    subprocess.run([c.a.kilnc, spec, "-o", exe, *c.a.kilnc_arg], check=True, cwd=c.workdir, capture_output=True)

    def log_in_folder(r, args):  # (its first line comes after the folder is made again)
        args[args.index("--log") + 1] = logp
        return [exe if a == c.exe else a for a in args]
    # (Steps enough that the run ends only by the signal, however late a starved test sends it.)
    procs, _ = start_tcp(c, "tcp_signal_at_start", ["--checkpoint-dir", run], steps=100000, save=False,
                         per_rank=log_in_folder)
    # Rank 0 has made the folder; rank 1, paused, keeps it waiting for the ranks' agreement or in
    # the first step's reductions, where the signal removes the folder (it is kept from the first
    # step's end on).
    try:
        t = time.monotonic()
        while not (os.path.isdir(run) or procs[0].poll() is not None):
            if time.monotonic() - t > 60:
                raise TestFailure("timed out waiting for rank 0's --checkpoint-dir")
            time.sleep(0.001)
    except TestFailure:
        finish([p for p in procs if not p.kill()], timeout=10)
        raise
    if procs[0].poll() is not None:
        res = finish(procs, timeout=KILL_LIMIT_S)
        raise TestFailure(f"tcp_signal_at_start: rank 0 ended (exit {res[0][0]}) before the signal:\n{res[0][2][-1500:]}")
    os.kill(procs[1].pid, signal.SIGSTOP)
    procs[0].send_signal(signal.SIGTERM)
    time.sleep(1.0)
    removed = not os.path.exists(ck)
    os.kill(procs[1].pid, signal.SIGCONT)
    res = finish(procs, timeout=KILL_LIMIT_S)
    if res[0][0] != -signal.SIGTERM or res[1][0] != -signal.SIGTERM:
        raise TestFailure(f"tcp_signal_at_start: exit codes {res[0][0]}, {res[1][0]} (both must end by SIGTERM):\n"
                          f"{res[0][2][-1500:]}\n{res[1][2][-1500:]}")
    # Step 1 as a rule; a later one where a starved test sent the signals late.
    m = re.search(r"stopped after step (\d+) of 100000", res[0][2])
    if not m:
        raise TestFailure(f"tcp_signal_at_start: rank 0 did not say where it stopped:\n{res[0][2][-1500:]}")
    n = int(m.group(1))
    if removed and "kiln: rank 0: SIGTERM: stopping after the first step, with a checkpoint" not in res[0][2]:
        raise TestFailure(f"tcp_signal_at_start: rank 0 did not say it stops after the first step:\n{res[0][2][-1500:]}")
    # The folder made again is locked again at once (MadeFolders::keep_lock, without its warning): at
    # step 1's checkpoint the run finds its own folder, not one "removed or replaced" (which another
    # run could have taken).
    if "was removed or replaced" in res[0][2]:
        raise TestFailure(f"tcp_signal_at_start: rank 0 did not lock the folder it made again:\n{res[0][2][-1500:]}")
    have = sorted(os.listdir(run)) if os.path.isdir(run) else []
    if have != [f"ckpt_{n:08d}.kiln-ckpt", "latest", "run.jsonl"]:
        raise TestFailure(f"tcp_signal_at_start: {run} holds {have}, not step {n}'s checkpoint, latest and the log:\n"
                          f"{res[0][2][-1500:]}")
    steps = [json.loads(line)["step"] for line in open(logp)]
    if steps != list(range(n)):
        raise TestFailure(f"tcp_signal_at_start: the log holds steps {steps}, not 0 to {n - 1}")
    return (f"the folder was removed at the signal and made again for step {n}'s checkpoint" if removed else
            f"the folder stayed (rank 0 was past its first step); step {n}'s checkpoint written")


def case_tcp_no_root(c: Ctx):
    env = child_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                     "KILN_COMM_TIMEOUT": "3"})
    t0 = time.monotonic()
    p = subprocess.run(c.train_args("tcp_no_root", save=False), capture_output=True, text=True, cwd=c.workdir,
                       env=env, timeout=KILL_LIMIT_S)
    dt = time.monotonic() - t0
    if p.returncode == 0 or "no connection within 3 s" not in p.stderr:
        raise TestFailure(f"tcp_no_root: exit {p.returncode}:\n{p.stderr}")
    return f"exit {p.returncode} after {dt:.1f} s: {p.stderr.strip().splitlines()[-1]}"


def both_refuse(c: Ctx, tag, about, extra=(), per_rank=None):
    """Starts 2 TCP ranks whose commands per_rank makes differ: both must refuse to start, saying
    they disagree with rank 0 about `about`. Returns rank 1's last line."""
    procs, _ = start_tcp(c, tag, extra, save=False, per_rank=per_rank)
    res = finish(procs, timeout=KILL_LIMIT_S)
    want = f"disagree with rank 0 about {about}"
    for r, (rc, o, e) in enumerate(res):
        if rc == 0 or want not in e:
            raise TestFailure(f"{tag}: rank {r} exit {rc}:\n{e[-2000:]}")
    return f"rank 1: {res[1][2].strip().splitlines()[-1]}; rank 0: {res[0][2].strip().splitlines()[-1]}"


def case_tcp_pause(c: Ctx):
    # As mpi_pause: the TCP collectives' socket timeouts start again when a stopped rank resumes.
    tag = "tcp_pause"
    procs, _ = start_tcp(c, tag, save=False, steps=10**6, env_extra={"KILN_COMM_TIMEOUT": "3"},
                         stdout=subprocess.DEVNULL)
    logp = os.path.join(c.workdir, f"{tag}.jsonl")

    def end_all():  # the ranks' stderr, once they are ended
        for q in procs:
            if q.poll() is None:
                q.send_signal(signal.SIGCONT)
                q.kill()
        return [q.communicate()[1] if q.stderr and not q.stderr.closed else "" for q in procs]
    try:
        wait_for(lambda: log_has_a_step(logp), 60, "the first step over TCP")
        return survives_pause(tag, {0: procs[0].pid, 1: procs[1].pid}, logp,
                              lambda: all(q.poll() is None for q in procs),
                              lambda: "".join(f"rank {r}: {e}" for r, e in enumerate(end_all())))
    finally:
        end_all()


def case_tcp_other_data(c: Ctx):
    # Rank 1 reads shards of the same sizes but other tokens: both ranks refuse to start.
    other = os.path.join(c.workdir, "other")
    os.makedirs(other, exist_ok=True)
    for i in range(2):
        with open(os.path.join(c.workdir, f"train_{i:03d}.bin"), "rb") as f:
            header, tokens = f.read(1024), f.read()
        ids = array.array("H")
        ids.frombytes(tokens)
        ids.reverse()
        with open(os.path.join(other, f"train_{i:03d}.bin"), "wb") as f:
            f.write(header + ids.tobytes())

    def other_data(r, args):
        if r == 1:
            args[args.index("--data") + 1] = os.path.join(other, "train_*.bin")
        return args
    said = both_refuse(c, "tcp_other_data", "the training data", per_rank=other_data)

    # The same shards as validation data: rank 0 logs the mean of the ranks' validation losses.
    def other_val(r, args):
        return args + ["--val-data", os.path.join(other if r == 1 else c.workdir, "train_000.bin"), "--val-every", "5"]
    said += "; --val-data: " + both_refuse(c, "tcp_other_val", "the validation data", per_rank=other_val)
    # The same validation data, evaluated at other steps: the ranks would evaluate apart.
    def other_val_every(r, args):
        return args + ["--val-data", os.path.join(c.workdir, "train_000.bin"), "--val-every", "5" if r == 0 else "4"]
    if "--val-every (rank 0: 5, this one: 4)" not in both_refuse(c, "tcp_other_val_every", "the training options",
                                                                per_rank=other_val_every):
        raise TestFailure("tcp_other_val_every: rank 1 does not name --val-every with both values")
    # The same validation data at other paths (as on two machines), more batches than a pass holds
    # (cut alike on both) and --sample-every on both: they agree, and train.
    same = os.path.join(c.workdir, "same_val")
    os.makedirs(same, exist_ok=True)
    shutil.copyfile(os.path.join(c.workdir, "train_000.bin"), os.path.join(same, "train_000.bin"))

    def same_val(r, args):
        return args + ["--val-data", os.path.join(same if r == 1 else c.workdir, "train_000.bin"), "--val-every", "5",
                       "--val-steps", "1000", "--sample-every", "5"]
    res = finish_ok(start_tcp(c, "tcp_same_val", save=False, steps=5, per_rank=same_val)[0], "tcp_same_val")
    if "val loss" not in res[0][1]:
        raise TestFailure(f"tcp_same_val: rank 0 printed no validation loss:\n{res[0][1][-2000:]}")
    return said + "; the same --val-data elsewhere: both train"


def case_tcp_other_checkpoints(c: Ctx):
    # Only rank 0 is given --checkpoint-dir: a --zero 1 run gathers its moments for every
    # checkpoint on every rank, so both ranks refuse to start rather than hang at the first one.
    ck = os.path.join(c.workdir, "other_ck")

    def rank0_checkpoints(r, args):
        return args + (["--checkpoint-dir", ck, "--checkpoint-every", "1"] if r == 0 else [])
    said = both_refuse(c, "tcp_other_checkpoints", "the training options: --checkpoint-dir (rank 0: given",
                       ["--zero", "1"], per_rank=rank0_checkpoints)
    # Rank 1 (the one that differs) says its own values too.
    if "--checkpoint-dir (rank 0: given, this one: not given), --checkpoint-every (rank 0: 1, this one: 0)" not in said:
        raise TestFailure(f"tcp_other_checkpoints: rank 1 does not name its own values: {said}")
    if os.path.exists(ck) and os.listdir(ck):
        raise TestFailure(f"tcp_other_checkpoints: {ck} holds {os.listdir(ck)}")

    # Each rank resumes from a folder of its own (a --checkpoint-dir not shared between machines)
    # holding step 2 of runs with other seeds: both refuse, naming the checkpoints, not --seed.
    for tag, seed in (("a", "7"), ("b", "8")):
        shutil.rmtree(os.path.join(c.workdir, f"own_ck_{tag}"), ignore_errors=True)

        def seeded(r, args, seed=seed, tag=tag):
            args[args.index("--seed") + 1] = seed
            return args + ["--checkpoint-dir", os.path.join(c.workdir, f"own_ck_{tag}"), "--checkpoint-every", "2"]
        finish_ok(start_tcp(c, f"tcp_own_ck_{tag}", save=False, steps=2, per_rank=seeded)[0], f"tcp_own_ck_{tag}")

    def own_folder(r, args):
        return args + ["--checkpoint-dir", os.path.join(c.workdir, "own_ck_a" if r == 0 else "own_ck_b"), "--resume"]
    said += "; resumed from other folders: " + both_refuse(c, "tcp_resume_own_folders", "the weights resumed",
                                                           per_rank=own_folder)
    return said


def case_tcp_other_options(c: Ctx):
    # Rank 1 is given other values of most of the compared options: both ranks refuse, each naming
    # every one that differs with rank 0's value, and rank 1 (alone) with its own; each value in
    # its own words (a count whole, a float in the fewest digits that read back, the schedule by name).
    def other(r, args):
        if r == 1:
            args[args.index("--lr") + 1] = "0.0003"
            args[args.index("--warmup-steps") + 1] = "3"
            args[args.index("--steps") + 1] = str(c.steps + 1)
            args += ["--zero", "1", "--lr-schedule", "constant", "--min-lr-ratio", "0.25", "--weight-decay", "0.5",
                     "--beta1", "0.8", "--beta2", "0.875", "--eps", "1e-07", "--grad-clip", "2.5"]
        return args
    procs, _ = start_tcp(c, "tcp_other_options", save=False, per_rank=other)
    res = finish(procs, timeout=KILL_LIMIT_S)
    theirs = (f"--steps (rank 0: {c.steps}, this one: {c.steps + 1}), --zero (rank 0: 0, this one: 1), "
              "--lr (rank 0: 0.001, this one: 0.0003), --lr-schedule (rank 0: cosine, this one: constant), "
              "--warmup-steps (rank 0: 2, this one: 3), --min-lr-ratio (rank 0: 0.1, this one: 0.25), "
              "--weight-decay (rank 0: 0.1, this one: 0.5), --beta1 (rank 0: 0.9, this one: 0.8), "
              "--beta2 (rank 0: 0.95, this one: 0.875), --eps (rank 0: 1e-08, this one: 1e-07), "
              "--grad-clip (rank 0: 1, this one: 2.5)")
    for r, (rc, o, e) in enumerate(res):
        want = "about the training options: " + (theirs if r == 1 else re.sub(r", this one: [^)]*", "", theirs))
        if rc == 0 or want not in e or (r == 0 and "this one" in e):
            raise TestFailure(f"tcp_other_options: rank {r} exit {rc}, wanted ...{want}...:\n{e[-3000:]}")
    # A value that six digits would round to rank 0's is shown in as many as it takes.
    def near_lr(r, args):
        if r == 1:
            args[args.index("--lr") + 1] = "0.0010000001"
        return args
    near = both_refuse(c, "tcp_near_lr", "the training options", per_rank=near_lr)
    if "--lr (rank 0: 0.001, this one: 0.0010000001)" not in near:
        raise TestFailure(f"tcp_near_lr: rank 1 does not show its --lr in full: {near}")
    # --total-batch is compared as the tokens per step: rank 0's given B*T*ranks is rank 1's default.
    def default_total(r, args):
        if r == 1:
            i = args.index("--total-batch")
            del args[i:i + 2]
        return args
    finish_ok(start_tcp(c, "tcp_total_default", save=False, steps=1, per_rank=default_total)[0], "tcp_total_default")
    return f"rank 1: {res[1][2].strip().splitlines()[-1]}; --total-batch B*T*2 against the default: both train"


def case_tcp_save_one_rank(c: Ctx):
    # Only rank 1 is given --save: rank 0 alone writes it, so it would be dropped without a word;
    # both ranks refuse to start instead, and nothing is written.
    w = os.path.join(c.workdir, "one_rank.safetensors")

    def rank1_saves(r, args):
        return args + (["--save", w] if r == 1 else [])
    said = both_refuse(c, "tcp_save_one_rank", "the outputs", per_rank=rank1_saves)
    if os.path.exists(w):
        raise TestFailure(f"tcp_save_one_rank: {w} was written")

    # Rank 0 alone prints samples: --sample-every given to rank 1 alone would print nothing.
    def rank1_samples(r, args):
        return args + (["--sample-every", "2"] if r == 1 else [])
    said += "; --sample-every: " + both_refuse(c, "tcp_sample_one_rank", "the outputs", per_rank=rank1_samples)

    # Rank 0 alone may have them: given --save and --sample-every, it writes and samples; both train.
    w0 = os.path.join(c.workdir, "rank0_only.safetensors")
    if os.path.exists(w0):
        os.remove(w0)

    def rank0_outputs(r, args):
        return args + (["--save", w0, "--sample-every", "2"] if r == 0 else [])
    finish_ok(start_tcp(c, "tcp_save_rank0", save=False, steps=2, per_rank=rank0_outputs)[0], "tcp_save_rank0")
    if not os.path.exists(w0):
        raise TestFailure(f"tcp_save_rank0: rank 0 did not write {w0}")
    return said + "; rank 0 alone with --save and --sample-every: both train"


def case_tcp_log_full(c: Ctx):
    # Rank 0's log cannot be written (/dev/full): the ranks agree on it in the next step's
    # reduction and both stop after that step, with its checkpoint holding the two lines not
    # written; resumed with a log, rank 0 writes them first, and the log is the reference run's.
    ck = os.path.join(c.workdir, "log_full_ck")
    shutil.rmtree(ck, ignore_errors=True)

    def full_log(r, args):
        args[args.index("--log") + 1] = "/dev/full"
        return args + ["--checkpoint-dir", ck]
    procs, _ = start_tcp(c, "tcp_log_full", save=False, per_rank=full_log)
    res = finish(procs, timeout=KILL_LIMIT_S)
    said0 = ("--log: /dev/full: writing step 1's line failed: No space left on device; stopped after step 2 of "
             f"{c.steps} with checkpoint {ck}/ckpt_00000002.kiln-ckpt (--resume goes on from there, and writes the "
             "log's missing lines first)")
    said1 = f"data parallel: rank 0 could not write its --log; stopped after step 2 of {c.steps}"
    for r, said in enumerate((said0, said1)):
        if res[r][0] == 0 or said not in res[r][2]:
            raise TestFailure(f"tcp_log_full: rank {r} exit {res[r][0]}, expected '{said}':\n{res[r][2][-2000:]}")
    procs, _ = start_tcp(c, "tcp_log_full", ["--checkpoint-dir", ck, "--resume"], save=False)
    finish_ok(procs, "tcp_log_full resumed")
    got = c.log("tcp_log_full")
    if [r.get("start") for r in got[:3]] != ["fresh", None, "resume"]:
        raise TestFailure(f"tcp_log_full: the resumed log starts {[r.get('start') for r in got[:3]]}")
    return "both ranks stopped after step 2; " + compare_runs("resumed with the missing lines", c.ref, got)


def case_tcp_checkpoint_full(c: Ctx):
    # Rank 0 cannot write its checkpoint (a file-size limit, as a full disk): it tells rank 1 at
    # once, and both stop after that step, rank 0 naming the error and rank 1 pointing at it.
    ck = os.path.join(c.workdir, "checkpoint_full_ck")
    shutil.rmtree(ck, ignore_errors=True)

    def limited(r, args):
        args += ["--checkpoint-dir", ck, "--checkpoint-every", "2", "--zero", "1"]
        # 512 blocks (256 or 512 KiB): the log fits, a checkpoint (1.6 MB with the moments) does not.
        return ["sh", "-c", 'trap "" XFSZ; ulimit -f 512; exec "$@"', "sh"] + args if r == 0 else args
    t0 = time.monotonic()
    procs, _ = start_tcp(c, "tcp_checkpoint_full", save=False, per_rank=limited)
    res = finish(procs, timeout=KILL_LIMIT_S)
    dt = time.monotonic() - t0
    said0 = f"ckpt_00000002.kiln-ckpt: write: File too large; stopped after step 2 of {c.steps}, and no checkpoint was written"
    said1 = f"data parallel: rank 0 could not write the checkpoint of step 2; stopped after step 2 of {c.steps}"
    for r, said in enumerate((said0, said1)):
        if res[r][0] == 0 or said not in res[r][2]:
            raise TestFailure(f"tcp_checkpoint_full: rank {r} exit {res[r][0]}, expected '{said}':\n{res[r][2][-2000:]}")
    if os.path.exists(ck) and os.listdir(ck):
        raise TestFailure(f"tcp_checkpoint_full: {ck} holds {os.listdir(ck)}")
    return f"both ranks stopped after step 2 within {dt:.1f} s"


def case_tcp_cut_step(c: Ctx):
    # SIGTERM to rank 1 within a step of 200 micro-steps a rank: the ranks agree after the micro-step and
    # both stop, leaving the step undone; the checkpoint is the step before's, and the run resumed
    # from it is bitwise the uninterrupted two-rank run.
    return cut_step(c, "tcp_cut", [])


def case_tcp_cut_step_zero1(c: Ctx):
    # The same with --zero 1 and a checkpoint after every step: step 1's checkpoint is written at
    # its end, so no rank writes one when step 2 is cut (every rank skips the moments' gather).
    return cut_step(c, "tcp_cut_zero1", ["--zero", "1"], ["--checkpoint-every", "1"])


def cut_step(c: Ctx, tag, extra, every=()):
    steps, micro, ck = 3, 400, os.path.join(c.workdir, f"{tag}_ck")
    shutil.rmtree(ck, ignore_errors=True)
    ref_w, cut_w = (os.path.join(c.workdir, f"{tag}{t}.safetensors") for t in ("_ref", "_resumed"))
    procs, _ = start_tcp(c, f"{tag}_ref", ["--save", ref_w] + extra, steps=steps, save=False, micro=micro)
    finish_ok(procs, f"{tag}_ref")
    procs, _ = start_tcp(c, tag, ["--checkpoint-dir", ck, *every] + extra, steps=steps, save=False, micro=micro)
    for line in procs[0].stdout:
        if line.startswith("step") and line.split()[1].startswith("1/"):
            procs[1].send_signal(signal.SIGTERM)
            break
    res = finish(procs, timeout=KILL_LIMIT_S)
    said = f"SIGTERM: stopped after step 1 of {steps} (step 2 was cut short after micro-step"
    latest = open(os.path.join(ck, "latest")).read().strip() if os.path.exists(os.path.join(ck, "latest")) else None
    if [rc for rc, _, _ in res] != [-signal.SIGTERM] * 2 or said not in res[0][2] or latest != "ckpt_00000001.kiln-ckpt":
        raise TestFailure(f"{tag}: exits {[rc for rc, _, _ in res]}, latest {latest}:\n{res[0][2][-1500:]}")
    if "kiln: rank 1: SIGTERM: stopping at the end of this micro-step" not in res[1][2]:
        raise TestFailure(f"{tag}: rank 1's handler line:\n{res[1][2][-1000:]}")
    procs, _ = start_tcp(c, f"{tag}_resumed", ["--checkpoint-dir", ck, "--resume", "--save", cut_w] + extra,
                         steps=steps, save=False, micro=micro)
    finish_ok(procs, f"{tag}_resumed")
    ref, got = logged(c, f"{tag}_ref"), logged(c, f"{tag}_resumed")
    if got != ref[1:] or read_safetensors(cut_w) != read_safetensors(ref_w):
        raise TestFailure(f"{tag}: resumed {got} against {ref[1:]} (or the final weights differ)")
    return f"both ranks stopped within step 2 ({said.split('(')[1]}...); resumed: steps 1-2 and the final weights bitwise"


def case_tcp_idle_peer(c: Ctx):
    # A connection to rank 0 that never says hello (a port scanner, a stale client) comes first:
    # the two ranks still meet and train, within the 6 s timeout.
    port = free_port()

    def rank(r):
        env = child_env({"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                         "KILN_COMM_TIMEOUT": "6"})
        return subprocess.Popen(c.train_args(f"tcp_idle_peer_{r}", steps=2, save=False), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=c.workdir, env=env)
    procs = [rank(0)]
    idle = None
    try:
        wait_for(lambda: socket_open(port), 30, "rank 0 listening")
        idle = socket.create_connection(("127.0.0.1", port))
        procs.append(rank(1))
        res = finish(procs, timeout=KILL_LIMIT_S)
    finally:
        if idle:
            idle.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (rc, o, e) in enumerate(res):
        if rc != 0:
            raise TestFailure(f"tcp_idle_peer: rank {r} exit {rc}:\n{e[-2000:]}")
    return "both ranks trained 2 steps past a silent connection"


def case_tcp_ipv6(c: Ctx):
    # Rank 0 listens on both address families: peers may name it by an IPv6 address.
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        return "skipped: this host has no IPv6 loopback"
    procs, _ = start_tcp(c, "tcp_ipv6", steps=2, save=False, env_extra={"MASTER_ADDR": "::1", "KILN_COMM_TIMEOUT": "20"})
    res = finish(procs, timeout=KILL_LIMIT_S)
    for r, (rc, o, e) in enumerate(res):
        if rc != 0:
            raise TestFailure(f"tcp_ipv6: rank {r} exit {rc}:\n{e[-2000:]}")
    return "rendezvous at ::1: both ranks trained 2 steps"


def socket_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def case_nccl_refused(c: Ctx):
    p = subprocess.run(c.train_args("nccl", ["--comm", "nccl"], save=False), capture_output=True, text=True,
                       cwd=c.workdir, env=child_env(), timeout=60)
    want = "--comm nccl: NCCL reduces GPU buffers, but the module targets 'cpu'"
    if p.returncode == 0 or want not in p.stderr:
        raise TestFailure(f"nccl_refused: exit {p.returncode}:\n{p.stderr}")
    return p.stderr.strip()


# ---------------------------------------------------------------------------------------------
# eval and sample under a launcher
# ---------------------------------------------------------------------------------------------
def eval_args(c: Ctx, batches=None):
    args = [c.exe, "eval", "--init", os.path.join(c.workdir, "ref.safetensors"),
            "--data", os.path.join(c.workdir, "train_*.bin"), "--json"]
    return args + (["--batches", str(batches)] if batches else [])


def eval_json(what, stdout):
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        raise TestFailure(f"{what}: stdout is not one JSON object:\n{stdout}")


def check_eval_pair(c: Ctx, tag, res, one, batches):
    """Rank 0's result of 2 ranks x `batches` against 1 process's `one`: the same tokens, the same
    mean loss up to summation order; rank 1 prints nothing."""
    if res[1][1].strip():
        raise TestFailure(f"{tag}: rank 1 printed:\n{res[1][1]}")
    two = eval_json(tag, res[0][1])
    if (two["ranks"], two["batches"], two["tokens"], two["shards"]) != (2, batches, one["tokens"], one["shards"]):
        raise TestFailure(f"{tag}: 2 ranks read other data than 1 process: {two} vs {one}")
    d = abs(two["loss"] - one["loss"])
    if not d <= 1e-6 * abs(one["loss"]):
        raise TestFailure(f"{tag}: 2 ranks' loss {two['loss']!r} vs 1 process's {one['loss']!r}")
    return f"2 ranks x {batches} batches: loss {two['loss']:.6f}, |d| {d:.1e} against 1 process x {one['batches']}"


def case_tcp_eval(c: Ctx):
    """eval on 2 TCP ranks: each reads its B x T of every batch; a whole pass over both shards and
    3 batches each equal 1 process's whole pass and 6 batches."""
    msgs = []
    for batches, one_batches in ((None, None), (3, 6)):
        one = eval_json("tcp_eval (1 process)", c.run(eval_args(c, one_batches), "eval, 1 process").stdout)
        procs, _ = start_tcp(c, "tcp_eval", save=False, per_rank=lambda r, args: eval_args(c, batches))
        res = finish_ok(procs, "tcp_eval")
        if "eval: rank 0 of 2 over TCP (rendezvous at 127.0.0.1:" not in res[0][2]:
            raise TestFailure(f"tcp_eval: rank 0 did not announce the ranks:\n{res[0][2]}")
        msgs.append(check_eval_pair(c, "tcp_eval", res, one, batches or one["batches"] // 2))
    return "; ".join(msgs)


def case_tcp_val(c: Ctx):
    """--val-data while training on 2 TCP ranks: each rank evaluates its B x T of --val-steps
    batches, and the logged val_loss is their mean, so it equals 1 process's over twice the
    batches (the same tokens), within 1e-5 (the trained weights differ by as much)."""
    val = ["--val-data", os.path.join(c.workdir, "train_001.bin"), "--val-every", "3"]
    c.run(c.train_args("val_one", val + ["--val-steps", "4"], save=False), "1 process with --val-data")
    procs, _ = start_tcp(c, "tcp_val", val + ["--val-steps", "2"], save=False)
    finish_ok(procs, "tcp_val")
    one = {r["step"]: r["val_loss"] for r in c.log("val_one") if "val_loss" in r}
    two = {r["step"]: r["val_loss"] for r in c.log("tcp_val") if "val_loss" in r}
    if not one or sorted(one) != sorted(two):
        raise TestFailure(f"tcp_val: val_loss logged at steps {sorted(two)}, 1 process at {sorted(one)}")
    worst = max(abs(one[s] - two[s]) for s in one)
    if not worst <= 1e-5:
        raise TestFailure(f"tcp_val: val_loss {two} vs 1 process's {one} (|diff| {worst:.2e} > 1e-5)")
    return f"val_loss at steps {sorted(one)}: max |diff| {worst:.1e} from 1 process over twice the batches"


def case_tcp_eval_disagree(c: Ctx):
    """Ranks given other --batches, other weights or the shards in another order all fail, each saying
    what differs (rank 1 adding that it is among them), rather than averaging unlike means."""
    shards = sorted(os.path.join(c.workdir, f) for f in os.listdir(c.workdir) if re.match(r"train_\d+\.bin$", f))
    ref_w = os.path.join(c.workdir, "ref.safetensors")
    other_w = os.path.join(c.workdir, "tcp_eval_other.safetensors")
    if not os.path.exists(other_w):  # the reference weights one step on
        c.run([c.exe, "train", "--data", shards[0], "--steps", "1", "--init", ref_w, "--save", other_w], "other weights")

    def rank1(args, flag, value):
        args = list(args)
        if flag == "--data":
            i = args.index("--data")
            return args[:i + 1] + value + args[i + 2:]
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
        return args
    # The same shards under names that sort the other way (a shard list is read in path order).
    swapped = os.path.join(c.workdir, "swapped")
    os.makedirs(swapped, exist_ok=True)
    for name, src in (("a.bin", shards[1]), ("b.bin", shards[0])):
        shutil.copyfile(src, os.path.join(swapped, name))
    cases = [("--batches", "2", "the number of batches (--batches)"),
             ("--init", other_w, "the weights (--init files that differ)"),
             ("--data", [os.path.join(swapped, "*.bin")],
              "the data (--data: other shards, in another order, or of other sizes)")]
    msgs = []
    for flag, value, what in cases:
        procs, _ = start_tcp(c, "tcp_eval_disagree", save=False,
                             per_rank=lambda r, args: eval_args(c, 3) if r == 0 else rank1(eval_args(c, 3), flag, value))
        res = finish(procs, timeout=KILL_LIMIT_S)
        if res[0][0] == 0 or res[1][0] == 0:
            raise TestFailure(f"tcp_eval_disagree {flag}: exit codes {res[0][0]}, {res[1][0]}; both must fail")
        for r, extra in ((0, ""), (1, ", this one among them")):
            want = f"eval: 1 rank(s) disagree with rank 0 about {what}{extra}; every rank must run the same command"
            if want not in res[r][2]:
                raise TestFailure(f"tcp_eval_disagree {flag}: rank {r} does not say why:\n{res[r][2]}")
        msgs.append(flag)
    return f"both ranks refuse another {', '.join(msgs)}: {res[0][2].strip().splitlines()[-1]}"


def case_tcp_sample(c: Ctx):
    """sample on 2 TCP ranks: rank 0 alone samples, as 1 process does; rank 1 prints nothing."""
    args = [c.exe, "sample", "--init", os.path.join(c.workdir, "ref.safetensors"), "--prompt-ids", "1 2 3",
            "--max-new-tokens", "6", "--num-samples", "2", "--seed", "5"]
    one = c.run(args, "sample, 1 process").stdout
    procs, _ = start_tcp(c, "tcp_sample", save=False, per_rank=lambda r, _: list(args))
    res = finish_ok(procs, "tcp_sample")
    if res[0][1] != one or res[1][1] or res[1][2]:
        raise TestFailure(f"tcp_sample: rank 0 printed\n{res[0][1]}\nrank 1 printed\n{res[1][1]}{res[1][2]}\n"
                          f"1 process printed\n{one}")
    if "note: sample: 2 ranks started; rank 0 alone samples" not in res[0][2]:
        raise TestFailure(f"tcp_sample: rank 0 does not say it samples alone:\n{res[0][2]}")
    return f"rank 0's {one.count('--- sample')} samples as 1 process's; rank 1 silent"


def case_mpi_sample(c: Ctx):
    """sample under mpirun: rank 0 alone samples, with no communicator, so a collective's timeout
    (KILN_COMM_TIMEOUT=1) cannot end it however long it samples; the other ranks exit at once."""
    args = [c.exe, "sample", "--init", os.path.join(c.workdir, "ref.safetensors"), "--prompt-ids", "1 2 3",
            "--max-new-tokens", "40", "--num-samples", "512", "--seed", "5", "--no-kv-cache"]
    t0 = time.monotonic()
    one = c.run(args, "sample, 1 process").stdout
    alone = time.monotonic() - t0
    if alone < 1.2:
        raise TestFailure(f"mpi_sample: 1 process sampled in {alone:.1f} s, too short to outlast KILN_COMM_TIMEOUT=1")
    env = child_env({"KILN_COMM_TIMEOUT": "1"})
    p = c.run(c.mpirun_cmd() + ["-x", "KILN_COMM_TIMEOUT"] + args, "mpirun -np 2 sample", env=env)
    if p.stdout != one:
        raise TestFailure(f"mpi_sample: mpirun printed\n{p.stdout[-2000:]}\n1 process printed\n{one[-2000:]}")
    if "note: sample: 2 ranks started; rank 0 alone samples" not in p.stderr:
        raise TestFailure(f"mpi_sample: rank 0 does not say it samples alone:\n{p.stderr}")
    return f"rank 0's {one.count('--- sample')} samples (1 process: {alone:.1f} s) as 1 process's; KILN_COMM_TIMEOUT=1"


def case_mpi_eval(c: Ctx):
    one = eval_json("mpi_eval (1 process)", c.run(eval_args(c, 6), "eval, 1 process").stdout)
    p = c.run(c.mpirun_cmd() + eval_args(c, 3), "mpirun -np 2 eval")
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    if len(lines) != 1:
        raise TestFailure(f"mpi_eval: more than rank 0 printed:\n{p.stdout}")
    return check_eval_pair(c, "mpi_eval", [(0, lines[0], ""), (0, "", "")], one, 3)


# A cuda module (on kiln-run-emulated: --kilnc-arg=--runtime=.../kiln-run-emulated): the gradient
# buckets are reduced in the device executor's arena, from its hooks.
def case_tcp_threads(c: Ctx):
    tag = "tcp_threads"
    procs, _ = start_tcp(c, tag, env_extra={"OMP_NUM_THREADS": None, "OPENBLAS_NUM_THREADS": None})
    err = finish_ok(procs, tag)[0][2]
    # kiln-run's rule: an equal part of the CPUs (at least 1) unless the rank has fewer already
    # (OpenMP's default count is the CPUs this process may run on).
    cpus, may_run_on = os.cpu_count() or 1, len(os.sched_getaffinity(0))
    share = max(1, cpus // 2)
    threads = share if may_run_on > share else may_run_on
    note = f"note: 2 ranks share this machine's {cpus} CPUs: {share} OpenMP thread{'s' if share > 1 else ''} each"
    if (note in err) != (may_run_on > share):
        raise TestFailure(f"{tag}: {cpus} CPUs, {may_run_on} usable: expected {'the' if may_run_on > share else 'no'} "
                          f"note '{note}' from rank 0:\n{err}")
    peak = f"(2 ranks x {threads} thread{'s' if threads > 1 else ''} x 2.5 GHz x "
    if peak not in err:
        raise TestFailure(f"{tag}: rank 0's MFU line does not count '{peak}':\n{err}")
    msg = compare_runs("tcp, threads shared vs 1 process", c.ref, c.log(tag), c.ref_w, c.weights(tag))
    return f"{msg}; {note if may_run_on > share else f'no note ({may_run_on} CPU(s) usable)'}"


def case_tcp_plain(c: Ctx):
    run_tcp_pair(c, "tcp_plain", ["--comm", "tcp"])
    return compare_runs("tcp vs 1 process", c.ref, c.log("tcp_plain"), c.ref_w, c.weights("tcp_plain"))


def case_tcp_accum(c: Ctx):
    # 2 ranks x 2 micro-steps against 1 process x 4: only the last micro-step's buckets are reduced.
    c.run(c.train_args("ref4", micro=4), "reference (1 process, 4 micro-steps)")
    procs, _ = start_tcp(c, "tcp_accum", ["--comm", "tcp"], micro=4)
    finish_ok(procs, "tcp_accum")
    return compare_runs("tcp 2x2 vs 1 process x4", c.log("ref4"), c.log("tcp_accum"), c.weights("ref4"),
                        c.weights("tcp_accum"))


def case_tcp_hang_cuda(c: Ctx):
    # A stopped peer ends the other rank on the communicator's timeout (a GPU rank waits for the
    # started collectives before it blocks on its stream). Emulated steps take seconds: 20 s.
    return tcp_kill(c, 1, signal.SIGSTOP, "tcp_hang_cuda", "for 20 s (hung or unreachable", ["--comm", "tcp"], "20")


def case_tcp_zero1_cuda(c: Ctx):
    # ZeRO-1 through the device executor: sliced AdamW and norm tables, the norm's sum over ranks
    # between its two kernels, the gathered values' bf16 copies rounded on the device; and its
    # checkpoint (the moments gathered) against a plain 2-rank run's.
    ck = {tag: os.path.join(c.workdir, f"{tag}_ck") for tag in ("tcp_zero1", "tcp_plain_ck")}
    for d in ck.values():
        shutil.rmtree(d, ignore_errors=True)
    every = ["--checkpoint-dir", ck["tcp_zero1"], "--checkpoint-every", str(c.steps - 1), "--keep", "0"]
    res = run_tcp_pair(c, "tcp_zero1", ["--comm", "tcp", "--zero", "1"] + every)
    arena = check_zero1_arena(c, "tcp_zero1", res[0][2], 2)
    msg = compare_runs("tcp --zero 1 vs 1 process", c.ref, c.log("tcp_zero1"), c.ref_w, c.weights("tcp_zero1")) + "; " + arena
    # Rewound to the step before the last and resumed: that step again, as it was (the emulation
    # adds its atomics in a fixed order, so bitwise; a GPU would match to rounding).
    uninterrupted = logged(c, "tcp_zero1")[-1]
    os.remove(os.path.join(ck["tcp_zero1"], f"ckpt_{c.steps:08d}.kiln-ckpt"))
    with open(os.path.join(ck["tcp_zero1"], "latest"), "w") as f:
        f.write(f"ckpt_{c.steps - 1:08d}.kiln-ckpt\n")
    resumed_w = os.path.join(c.workdir, "tcp_zero1_resumed.safetensors")
    procs, _ = start_tcp(c, "tcp_zero1_resumed", ["--comm", "tcp", "--zero", "1", "--resume", "--save", resumed_w] + every,
                         save=False)
    finish_ok(procs, "tcp_zero1_resumed")
    rows = logged(c, "tcp_zero1_resumed")
    if rows != [uninterrupted]:
        raise TestFailure(f"tcp_zero1_cuda: resumed at step {c.steps - 1}: {rows} against {uninterrupted}")
    if read_safetensors(resumed_w) != read_safetensors(os.path.join(c.workdir, "tcp_zero1.safetensors")):
        raise TestFailure("tcp_zero1_cuda: the resumed run's final weights differ from the uninterrupted run's")
    msg += f"; resumed at step {c.steps - 1}: its loss, norm and the final weights bitwise"
    run_tcp_pair(c, "tcp_plain_ck", ["--comm", "tcp", "--checkpoint-dir", ck["tcp_plain_ck"]])
    last = f"ckpt_{c.steps:08d}.kiln-ckpt"
    worst = compare_checkpoints("tcp_zero1_cuda", os.path.join(ck["tcp_zero1"], last),
                                os.path.join(ck["tcp_plain_ck"], last))
    return f"{msg}; checkpoint vs plain 2-rank run: max rel diff {worst:.1e}"


GROUPS = {
    "cuda": [case_tcp_plain, case_tcp_accum, case_tcp_hang_cuda, case_tcp_zero1_cuda],
    "cuda-zero1": [case_tcp_zero1_cuda],
    "mpi": [case_mpi, case_mpi_zero1, case_mpi_accum, case_mpi_kill, case_mpi_hang, case_mpi_pause, case_mpi_eval, case_mpi_sample,
            case_mpi_rank_error_folder, case_mpi_arg_error, case_mpi_start_error],
    "tcp": [case_tcp, case_single_zero1, case_tcp_zero1_resume, case_tcp_three, case_tcp_three_accum, case_tcp_kill_1, case_tcp_kill_0, case_tcp_hang, case_tcp_pause, case_tcp_rank_error,
            case_tcp_signal_at_start,
            case_tcp_no_root, case_tcp_other_data, case_tcp_other_checkpoints, case_tcp_other_options, case_tcp_save_one_rank, case_tcp_log_full, case_tcp_checkpoint_full, case_tcp_cut_step, case_tcp_cut_step_zero1, case_tcp_idle_peer, case_tcp_ipv6,
            case_nccl_refused, case_tcp_threads, case_tcp_eval, case_tcp_eval_disagree, case_tcp_sample,
            case_tcp_val],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kilnc", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--group", choices=("mpi", "tcp", "cuda", "cuda-zero1", "all"), default="all",
                    help="all: mpi and tcp; cuda: the cases for a cuda spec (run on kiln-run-emulated)")
    ap.add_argument("--kilnc-arg", action="append", default=[], help="an extra kilnc argument (repeatable)")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--case", action="append", default=[], help="run only this case of the group (repeatable)")
    a = ap.parse_args(argv)
    a.kilnc, a.spec = os.path.abspath(a.kilnc), os.path.abspath(a.spec)
    cases = GROUPS["mpi"] + GROUPS["tcp"] if a.group == "all" else GROUPS[a.group]
    if a.case:
        unknown = set(a.case) - {f.__name__[len("case_"):] for f in cases}
        if unknown:
            ap.error(f"--case: not in group {a.group}: {', '.join(sorted(unknown))}")
        cases = [f for f in cases if f.__name__[len("case_"):] in a.case]
    c = Ctx(a)
    t_all = time.monotonic()
    try:
        setup(c)
    except (TestFailure, subprocess.CalledProcessError) as e:
        print(f"FAIL setup: {e}", flush=True)
        return 1
    failed = 0
    for case in cases:
        name = case.__name__[len("case_"):]
        t0 = time.monotonic()
        try:
            msg = case(c)
            print(f"PASS {name:15s} ({time.monotonic() - t0:5.1f} s) {msg}", flush=True)
        except TestFailure as e:
            failed += 1
            print(f"FAIL {name:15s} ({time.monotonic() - t0:5.1f} s) {e}", flush=True)
    print(f"{len(cases) - failed} of {len(cases)} passed in {time.monotonic() - t_all:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
