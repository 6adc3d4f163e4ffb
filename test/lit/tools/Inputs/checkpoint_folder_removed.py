"""Starts a run that checkpoints into DIR every 50 steps; once DIR's `latest` names step 50,
removes DIR while the run is stopped (SIGSTOP, so that no checkpoint is half written); once the
run has made DIR again and named step 100 there, stops it again and starts a second run with
--resume into DIR; then ends the first with SIGTERM. Prints the second run's last line, the first
run's warnings and its exit status.
Usage: checkpoint_folder_removed.py EXE SHARD DIR"""
import os
import shutil
import signal
import subprocess
import sys
import time

exe, shard, folder = sys.argv[1:4]
latest = os.path.join(folder, "latest")


def wait_for(step):
    name = "%08d" % step
    while True:
        try:
            if name in open(latest).read():
                return
        except OSError:
            pass
        time.sleep(0.01)


with open("first.err", "w") as err:
    run = subprocess.Popen([exe, "train", "--data", shard, "--steps", "100000", "--checkpoint-every", "50",
                            "--keep", "2", "--checkpoint-dir", folder], stdout=subprocess.DEVNULL, stderr=err)
    wait_for(50)
    run.send_signal(signal.SIGSTOP)
    shutil.rmtree(folder)
    run.send_signal(signal.SIGCONT)
    wait_for(100)
    run.send_signal(signal.SIGSTOP)
    second = subprocess.run([exe, "train", "--data", shard, "--steps", "1", "--checkpoint-dir", folder, "--resume"],
                            capture_output=True, text=True)
    print("second run:", second.stderr.strip().splitlines()[-1])
    run.send_signal(signal.SIGCONT)
    run.send_signal(signal.SIGTERM)
    print("first run: exit", run.wait())
sys.stdout.write("".join(line + "\n" for line in open("first.err") if "warning" in line))
