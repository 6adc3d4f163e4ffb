"""Starts a run that checkpoints into DIR every 200 steps; once it has saved step 200, removes
DIR while the run is stopped (SIGSTOP, waited for: no checkpoint is being written then; the 200
steps to the next one leave room for the signal to land well before it, where 5 steps of this
small model once did not, and the removal hit the next checkpoint's write); once the run has
made DIR again and saved step 400 there, stops it again and starts a second run with
--resume into DIR; then ends the first with SIGTERM. Prints the second run's last line, the first
run's exit status and its warnings. One thread each (two spinning OpenMP teams on loaded cores
crawl). Never waits more than 120 s for anything: the run is killed and the script fails instead.
Usage: checkpoint_folder_removed.py EXE SHARD DIR"""
import os
import shutil
import signal
import subprocess
import sys
import time

exe, shard, folder = sys.argv[1:4]


def wait_until(done, what):
    deadline = time.monotonic() + 120
    while not done():
        if run.poll() is not None:  # (its error, not a timeout)
            raise RuntimeError("the run ended before the " + what + ":\n" + open("first.err").read())
        if time.monotonic() > deadline:
            raise TimeoutError("no " + what + " within 120 s")
        time.sleep(0.01)


def saved(step):  # the run prints this once save_checkpoint has returned
    return lambda: ("(step %d)" % step) in open("first.err").read()


def stopped(pid):  # SIGSTOP is delivered asynchronously: wait for the state to say so
    return lambda: open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] == "T"


env = dict(os.environ, OMP_NUM_THREADS="1")
with open("first.err", "w") as err:
    run = subprocess.Popen([exe, "train", "--data", shard, "--steps", "2000", "--checkpoint-every", "200",
                            "--keep", "2", "--checkpoint-dir", folder], stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        wait_until(saved(200), "checkpoint of step 200")
        run.send_signal(signal.SIGSTOP)
        wait_until(stopped(run.pid), "stop")
        shutil.rmtree(folder)
        run.send_signal(signal.SIGCONT)
        wait_until(saved(400), "checkpoint of step 400")
        run.send_signal(signal.SIGSTOP)
        wait_until(stopped(run.pid), "stop")
        second = subprocess.run([exe, "train", "--data", shard, "--steps", "1", "--checkpoint-dir", folder, "--resume"],
                                capture_output=True, text=True, timeout=120, env=env)
        print("second run:", second.stderr.strip().splitlines()[-1])
        run.send_signal(signal.SIGCONT)
        run.send_signal(signal.SIGTERM)
        print("first run: exit", run.wait(timeout=120))
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
sys.stdout.write("".join(line + "\n" for line in open("first.err") if "warning" in line))
