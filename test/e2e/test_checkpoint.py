#!/usr/bin/env python3
"""Checkpoints: a run killed with SIGKILL and resumed gives bitwise the losses and final weights
of an uninterrupted run, and so does one stopped by SIGTERM or SIGHUP (or, with two ranks, SIGINT to one
of them, or SIGINT while it samples), which checkpoints the step it stopped after (or, within a
step of many micro-steps, the step before, leaving the step it cut short undone); corrupt or mismatched checkpoints (another model, another rank count)
are refused; a diverged run stops without touching the last good checkpoint; a shard removed
mid-run stops it with the steps done checkpointed.

  test_checkpoint.py --kilnc build/bin/kilnc --spec test/e2e/configs/tiny.toml --workdir DIR
"""
import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402

STEPS = 60


def losses(path):
    """step -> loss; a resumed run appends, so the last record of a step wins."""
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            out[r["step"]] = r["loss"]
    return out


def last_line(text):
    """The line saying where a signal stopped the run, else the last one."""
    lines = text.strip().splitlines()
    return next((x for x in lines if "stopped after" in x), lines[-1] if lines else "")


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(rank, port):
    return dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                KILN_COMM_TIMEOUT="30")


def run_ranks(exe, args):
    """Two ranks over TCP; their exit codes and rank 0's stderr."""
    port = free_port()
    procs = [subprocess.Popen([exe] + args, env=rank_env(r, port), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    return [p.returncode for p in procs], errs


def stop_with_signal(cmd, env, sig, after, signalled_rank=0, timing=None, delay=0.0):
    """Runs cmd (env None: as two ranks) and sends sig to one process `delay` seconds after rank 0
    has printed step `after`; the exit codes and each rank's stderr (rank 0's first). `timing` (a dict), when
    given, gets rank 0's stdout and the seconds from the start to the signal ("before") and from
    the signal to the exits ("ended")."""
    began = time.monotonic()
    if env is None:
        port = free_port()
        procs = [subprocess.Popen(cmd, env=rank_env(r, port), stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for r in range(2)]
    else:
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    for line in procs[0].stdout:
        if line.startswith("step") and int(line.split()[1].split("/")[0]) >= after:
            break
    # The rest is read meanwhile: a step's output longer than the pipe holds (samples) would
    # otherwise keep the run in that step until the signal.
    rest = []
    drain = threading.Thread(target=lambda: rest.append(procs[0].stdout.read()))
    drain.start()
    time.sleep(delay)
    procs[signalled_rank].send_signal(sig)
    signalled = time.monotonic()
    drain.join()
    rest = rest[0]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    if timing is not None:
        timing.update(before=signalled - began, ended=time.monotonic() - signalled, stdout=line + rest)
    return [p.returncode for p in procs], errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnc", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--other-spec", required=True, help="a different model, whose checkpoints must not load")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    w = a.workdir
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    with open(a.spec, "rb") as f:
        spec = tomllib.load(f)
    V, B, T = spec["model"]["vocab_size"], spec["compile"]["batch_size"], spec["compile"]["seq_len"]
    exe, other = os.path.join(w, "gpt2"), os.path.join(w, "other")
    subprocess.run([a.kilnc, a.spec, "-o", exe], check=True, capture_output=True)
    subprocess.run([a.kilnc, a.other_spec, "-o", other], check=True, capture_output=True)
    rng = np.random.default_rng(1)
    for i in range(2):  # two shards, so the data position crosses a shard boundary
        ref.write_shard(os.path.join(w, f"data_{i}.bin"), rng.integers(0, V, B * T * 37 + 1))
    common = ["train", "--data", os.path.join(w, "data_*.bin"), "--steps", str(STEPS), "--lr", "2e-3",
              "--warmup-steps", "10", "--total-batch", str(2 * B * T), "--seed", "11", "--print-every", "1"]
    failures = 0

    def check(ok, what):
        nonlocal failures
        failures += not ok
        print(("ok   " if ok else "FAIL ") + what)

    # The uninterrupted reference.
    subprocess.run([exe] + common + ["--log", f"{w}/ref.jsonl", "--save", f"{w}/ref.safetensors"],
                   check=True, capture_output=True)

    # Killed after step 34 (checkpoints every 10 steps), then resumed.
    ck = os.path.join(w, "ck")
    run = common + ["--log", f"{w}/run.jsonl", "--save", f"{w}/run.safetensors",
                    "--checkpoint-dir", ck, "--checkpoint-every", "10", "--keep", "2"]
    p = subprocess.Popen([exe] + run, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("step") and int(line.split()[1].split("/")[0]) >= 34:
            p.send_signal(signal.SIGKILL)
            break
    p.wait()
    killed_at = max(losses(f"{w}/run.jsonl"))
    check(p.returncode == -signal.SIGKILL and killed_at < STEPS - 1,
          f"killed with SIGKILL after step {killed_at} (exit {p.returncode})")
    kept = sorted(os.path.basename(f) for f in glob.glob(f"{ck}/ckpt_*"))
    # The kill lands after the logged step killed_at; the checkpoint of the step after it may or
    # may not have been renamed into place by then (the step's log line comes first).
    last_saved = (killed_at + 1) // 10 * 10
    want_kept = [[f"ckpt_{n:08d}.kiln-ckpt" for n in (last - 10, last)] for last in (last_saved, last_saved - 10)]
    check(kept in want_kept, f"--keep 2 kept {kept}")
    check(not glob.glob(f"{ck}/*.tmp.*"), "no temporary files left in the checkpoint directory")
    r = subprocess.run([exe] + run + ["--resume"], capture_output=True, text=True)
    check(r.returncode == 0 and "resuming from" in r.stderr, "resumed: " + r.stderr.splitlines()[0] if r.stderr else "")
    want, got = losses(f"{w}/ref.jsonl"), losses(f"{w}/run.jsonl")
    same = [s for s in want if got.get(s) == want[s]]
    check(len(same) == STEPS, f"losses bitwise equal on {len(same)}/{STEPS} steps")
    a1 = open(f"{w}/ref.safetensors", "rb").read()
    a2 = open(f"{w}/run.safetensors", "rb").read()
    check(a1 == a2, "final weights bitwise equal")

    # A shard removed mid-run (the second, once step 1 is done): the run stops where it reads it,
    # in step 19 (its second micro-step), keeping the steps done as a signal keeps them (a
    # checkpoint of step 18, --save), then the error; with the shard back, --resume is the
    # uninterrupted run bitwise.
    gone = os.path.join(w, "gone")
    os.makedirs(gone)
    for i in range(2):
        shutil.copy(os.path.join(w, f"data_{i}.bin"), gone)
    ck_gone = os.path.join(w, "ck_gone")
    lost = [c if c != os.path.join(w, "data_*.bin") else os.path.join(gone, "data_*.bin") for c in common]
    lost += ["--log", f"{w}/gone.jsonl", "--save", f"{w}/gone.safetensors", "--checkpoint-dir", ck_gone]
    p = subprocess.Popen([exe] + lost, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("step"):
            os.rename(os.path.join(gone, "data_1.bin"), os.path.join(w, "data_1.away"))
            break
    err = p.communicate(timeout=300)[1]
    saved = open(os.path.join(ck_gone, "latest")).read().strip() if os.path.exists(os.path.join(ck_gone, "latest")) else None
    check(p.returncode == 1 and saved == "ckpt_00000018.kiln-ckpt" and os.path.exists(f"{w}/gone.safetensors") and
          "cannot open: No such file or directory; stopped in step 19 of 60; checkpoint " in err and "ckpt_00000018.kiln-ckpt written" in err,
          f"a shard gone mid-run: exit {p.returncode}, checkpoint {saved}: " + last_line(err))
    os.rename(os.path.join(w, "data_1.away"), os.path.join(gone, "data_1.bin"))
    r = subprocess.run([exe] + lost + ["--resume"], capture_output=True, text=True)
    got = losses(f"{w}/gone.jsonl")
    same = [s for s in want if got.get(s) == want[s]]
    check(r.returncode == 0 and len(same) == STEPS and open(f"{w}/gone.safetensors", "rb").read() == a1,
          f"resumed with the shard back: losses bitwise equal on {len(same)}/{STEPS} steps, and the final weights")

    # A closed stdout (`train ... | head` once head is done; here closed from the start): the run
    # stops after the step it is in as a signal stops it, with its checkpoint and --save, says so,
    # and ends by SIGPIPE; resumed, it is the uninterrupted run bitwise.
    ck_pipe = os.path.join(w, "ck_pipe")
    piped = common + ["--log", f"{w}/pipe.jsonl", "--save", f"{w}/pipe.safetensors", "--checkpoint-dir", ck_pipe]
    p = subprocess.Popen([exe] + piped, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.communicate(timeout=300)[1]
    saved = open(os.path.join(ck_pipe, "latest")).read().strip() if os.path.exists(os.path.join(ck_pipe, "latest")) else None
    check(p.returncode == -signal.SIGPIPE and saved == "ckpt_00000001.kiln-ckpt" and
          "kiln: stdout: closed (the reader is gone): stopping after this step, with a checkpoint and --save" in err and
          f"saved checkpoint {ck_pipe}/ckpt_00000001.kiln-ckpt (step 1)" in err and
          "SIGPIPE: stopped after step 1 of" in err and os.path.exists(f"{w}/pipe.safetensors"),
          f"stdout closed: exit {p.returncode}, checkpoint {saved}: " + last_line(err))
    r = subprocess.run([exe] + piped + ["--resume"], capture_output=True, text=True)
    got_pipe = losses(f"{w}/pipe.jsonl")
    check(r.returncode == 0 and got_pipe == want and open(f"{w}/pipe.safetensors", "rb").read() == a1,
          f"resumed after stdout closed: losses {'bitwise equal' if got_pipe == want else 'differ'}, final weights too")

    # A flipped byte: the checkpoint is refused and nothing is trained.
    latest = os.path.join(ck, open(os.path.join(ck, "latest")).read().strip())
    data = bytearray(open(latest, "rb").read())
    good = bytes(data)
    data[len(data) // 2] ^= 0x40
    open(latest, "wb").write(data)
    r = subprocess.run([exe] + run + ["--resume"], capture_output=True, text=True)
    check(r.returncode != 0 and "checksum mismatch" in r.stderr, "corrupt checkpoint refused: " + r.stderr.strip())
    open(latest, "wb").write(good)

    # Another model's executable refuses this model's checkpoints.
    r = subprocess.run([other, "train", "--data", os.path.join(w, "data_*.bin"), "--steps", str(STEPS),
                        "--checkpoint-dir", ck, "--resume"], capture_output=True, text=True)
    check(r.returncode != 0 and "different model" in r.stderr, "other model refused: " + r.stderr.strip())

    # Another rank count: two ranks (TCP rendezvous) refuse a checkpoint written by one.
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   KILN_COMM_TIMEOUT="30")
        procs.append(subprocess.Popen([exe] + run + ["--resume"], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120)[1] for p in procs]
    refused = all(p.returncode != 0 for p in procs) and any(
        "written by 1 rank(s); this run has 2 rank(s) (which decide the tokens each step reads): run it with 1, "
        f"or start afresh from its weights with --init {os.path.join(ck, 'latest')} and another --checkpoint-dir" in o
        for o in outs)
    check(refused, "other rank count refused: " + next((o.strip().splitlines()[-1] for o in outs if "written by" in o), outs[0].strip()))

    # Divergence (an absurd learning rate) stops the run before the next checkpoint; the last
    # good checkpoint stays as it was.
    before = {f: open(f, "rb").read() for f in glob.glob(f"{ck}/*")}
    div = [{"2e-3": "1e30", str(STEPS): str(STEPS + 50)}.get(x, x) for x in run] + ["--resume"]
    r = subprocess.run([exe] + div, capture_output=True, text=True)
    check(r.returncode != 0 and "is not finite" in r.stderr, "divergence stopped: " + r.stderr.strip().splitlines()[-1])
    after = {f: open(f, "rb").read() for f in glob.glob(f"{ck}/*")}
    check(before == after, "checkpoints untouched by the diverged run")

    # SIGTERM (a scheduler's preemption): the run finishes its step, checkpoints it, saves, and
    # ends by the signal (as a shell expects of a command it stopped); --resume then gives bitwise the uninterrupted run.
    ck_term = os.path.join(w, "ck_term")
    term = common + ["--log", f"{w}/term.jsonl", "--save", f"{w}/term.safetensors",
                     "--checkpoint-dir", ck_term, "--checkpoint-every", "10"]
    stopped, (err,) = stop_with_signal([exe] + term, {}, signal.SIGTERM, after=23)
    at = max(losses(f"{w}/term.jsonl")) + 1  # the steps done (the log counts from 0)
    check(stopped == [-signal.SIGTERM] and at < STEPS and
          f"SIGTERM: stopped after step {at} of {STEPS}" in err,
          f"SIGTERM: exit {stopped}, stopped after step {at}: " + last_line(err))
    saved = open(os.path.join(ck_term, "latest")).read().strip()
    check(saved == f"ckpt_{at:08d}.kiln-ckpt" and os.path.exists(f"{w}/term.safetensors"),
          f"the interrupted run checkpointed the step it stopped after ({saved}) and wrote --save")
    r = subprocess.run([exe] + term + ["--resume"], capture_output=True, text=True)
    got = losses(f"{w}/term.jsonl")
    same = [s for s in want if got.get(s) == want[s]]
    check(r.returncode == 0 and len(same) == STEPS, f"resumed after SIGTERM: losses bitwise equal on {len(same)}/{STEPS} steps")
    check(open(f"{w}/term.safetensors", "rb").read() == a1, "resumed after SIGTERM: final weights bitwise equal")

    # SIGHUP (the terminal or ssh session closed) stops the run in the same way.
    ck_hup = os.path.join(w, "ck_hup")
    hup = common + ["--save", f"{w}/hup.safetensors", "--checkpoint-dir", ck_hup, "--checkpoint-every", "100"]
    stopped, (err,) = stop_with_signal([exe] + hup, {}, signal.SIGHUP, after=5)
    saved = open(os.path.join(ck_hup, "latest")).read().strip() if os.path.exists(os.path.join(ck_hup, "latest")) else ""
    check(stopped == [-signal.SIGHUP] and "kiln: SIGHUP: stopping" in err and
          saved.startswith("ckpt_") and os.path.exists(f"{w}/hup.safetensors"),
          f"SIGHUP: exit {stopped}, checkpoint {saved!r}: " + last_line(err))

    # SIGTERM within a step of many micro-steps (400 on tiny.toml, about half a second; a smaller
    # model gets more, doubled until a step takes 0.5 s, so that the signal, 0.1 s after step 1,
    # finds step 2 running): one process stops at the end of the micro-step and leaves the step
    # undone, so the checkpoint is the step before's (the data rewound to where the cut step
    # began); resumed, the run is bitwise the uninterrupted one. In the first step, nothing was
    # trained: no checkpoint, no log.
    micro = 400
    while True:
        long = [{str(2 * B * T): str(micro * B * T), str(STEPS): "3"}.get(x, x) for x in common]
        began = time.monotonic()
        subprocess.run([exe] + long + ["--log", f"{w}/long_ref.jsonl", "--save", f"{w}/long_ref.safetensors"],
                       check=True, capture_output=True)
        if (time.monotonic() - began) / 3 >= 0.5 or micro >= 400 * 64:
            break
        micro *= 2
    ck_cut = os.path.join(w, "ck_cut")
    cut = long + ["--log", f"{w}/cut.jsonl", "--save", f"{w}/cut.safetensors", "--checkpoint-dir", ck_cut]
    stopped, (err,) = stop_with_signal([exe] + cut, {}, signal.SIGTERM, after=1, delay=0.1)
    saved = open(os.path.join(ck_cut, "latest")).read().strip()
    check(stopped == [-signal.SIGTERM] and "SIGTERM: stopped after step 1 of 3 (step 2 was cut short after micro-step" in err
          and saved == "ckpt_00000001.kiln-ckpt" and sorted(losses(f"{w}/cut.jsonl")) == [0] and
          "SIGTERM: stopping at the end of this micro-step (a step cut short is left undone), with a checkpoint and --save" in err,
          f"SIGTERM within step 2: exit {stopped}, checkpoint {saved}: " + last_line(err))
    r = subprocess.run([exe] + cut + ["--resume"], capture_output=True, text=True)
    want_long, got_long = losses(f"{w}/long_ref.jsonl"), losses(f"{w}/cut.jsonl")
    check(r.returncode == 0 and got_long == want_long and
          open(f"{w}/cut.safetensors", "rb").read() == open(f"{w}/long_ref.safetensors", "rb").read(),
          f"resumed after a step cut short: losses {'bitwise equal' if got_long == want_long else 'differ'}, final weights too")
    ck_first = os.path.join(w, "ck_first")
    p = subprocess.Popen([exe] + long + ["--log", f"{w}/first.jsonl", "--checkpoint-dir", ck_first],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if line.startswith("training "):
            p.send_signal(signal.SIGTERM)
            break
    err = p.stderr.read()
    p.wait()
    check(p.returncode == -signal.SIGTERM and "nothing was trained" in err and not os.path.exists(ck_first) and
          "SIGTERM: stopping at the end of this micro-step: the first step is left undone, and nothing is written" in err and
          not os.path.exists(f"{w}/first.jsonl"), f"SIGTERM within step 1: exit {p.returncode}: " + last_line(err))

    # SIGINT while the run samples (here, every step's samples take seconds): the sampling ends at
    # once and the run stops after the step it sampled for, with its checkpoint. (One micro-step a
    # step: the signal, sent 0.3 s after step 1's samples are out, finds step 2 sampling, not
    # training, and not between step 1's line and its end, where it would stop the run there.)
    ck_sample = os.path.join(w, "ck_sample")
    one_micro = [{str(2 * B * T): str(B * T)}.get(x, x) for x in common]
    sampling = one_micro + ["--log", f"{w}/sample.jsonl", "--checkpoint-dir", ck_sample, "--sample-every", "1",
                         "--sample-tokens", "6000", "--sample-count", str(B)]
    timing = {}
    stopped, (err,) = stop_with_signal([exe] + sampling, {}, signal.SIGINT, after=1, timing=timing, delay=0.3)
    out = timing["stdout"]
    at = max(losses(f"{w}/sample.jsonl")) + 1
    cut = [json.loads(l).get("samples_stopped") for l in open(f"{w}/sample.jsonl")]
    saved = open(os.path.join(ck_sample, "latest")).read().strip()
    check(stopped == [-signal.SIGINT] and f"--- sampling at step {at} stopped by SIGINT ---" in out and
          f"SIGINT: stopped after step {at} of {STEPS}" in err and saved == f"ckpt_{at:08d}.kiln-ckpt" and
          cut == [None] * (at - 1) + ["SIGINT"],
          f"SIGINT while sampling: exit {stopped}, stopped after step {at}, checkpoint {saved}: " + last_line(err))
    # The first step's line comes after its samples: the stop must not wait for a step's samples.
    check(timing["ended"] < timing["before"] / 2,
          f"SIGINT while sampling: the run ended {timing['ended']:.1f} s after the signal "
          f"(the start and step 1's samples took {timing['before']:.1f} s)")

    # Two ranks, SIGINT to rank 1 alone: they agree in the loss's reduction and both stop after
    # the same step (each ended by SIGINT); resumed, they give the uninterrupted two-rank run bitwise.
    ranks = common + ["--checkpoint-every", "10"]
    two = lambda tag: ranks + ["--log", f"{w}/{tag}.jsonl", "--save", f"{w}/{tag}.safetensors",
                               "--checkpoint-dir", os.path.join(w, f"ck_{tag}")]
    codes, err = run_ranks(exe, two("two_ref"))
    check(codes == [0, 0], f"two ranks, uninterrupted: exit {codes}")
    stopped, (err, err1) = stop_with_signal([exe] + two("two"), None, signal.SIGINT, after=17, signalled_rank=1)
    at = max(losses(f"{w}/two.jsonl")) + 1
    saved = open(os.path.join(w, "ck_two", "latest")).read().strip()
    check(stopped == [-signal.SIGINT, -signal.SIGINT] and saved == f"ckpt_{at:08d}.kiln-ckpt" and "SIGINT: stopped after step" in err,
          f"two ranks, SIGINT to rank 1: exits {stopped}, checkpoint {saved}: " + last_line(err))
    # The handler's line names the rank that got the signal.
    said = "kiln: rank 1: SIGINT: stopping after this step"
    check(said in err1 and "kiln: rank" not in err, f"two ranks: rank 1 alone says '{said}'")
    codes, err = run_ranks(exe, two("two") + ["--resume"])
    want2, got2 = losses(f"{w}/two_ref.jsonl"), losses(f"{w}/two.jsonl")
    same = [s for s in want2 if got2.get(s) == want2[s]]
    check(codes == [0, 0] and len(same) == STEPS, f"two ranks resumed: losses bitwise equal on {len(same)}/{STEPS} steps")
    check(open(f"{w}/two.safetensors", "rb").read() == open(f"{w}/two_ref.safetensors", "rb").read(),
          "two ranks resumed: final weights bitwise equal")
    print("RESULT:", "PASS" if failures == 0 else f"FAIL ({failures})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
