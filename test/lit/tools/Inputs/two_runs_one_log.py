"""Starts a training run appending to LOG, waits for its first step, then starts a second run
given the same LOG and prints that one's exit code and stderr; then stops the first (SIGTERM).
Usage: two_runs_one_log.py EXE SHARD LOG"""
import signal
import subprocess
import sys

exe, shard, log = sys.argv[1:4]
first = subprocess.Popen([exe, "train", "--data", shard, "--steps", "100000", "--print-every", "1", "--log", log],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
for line in first.stdout:
    if line.startswith("step"):
        break
second = subprocess.run([exe, "train", "--data", shard, "--steps", "2", "--log", log], capture_output=True, text=True)
first.send_signal(signal.SIGTERM)
first.communicate()
print(f"second run: exit {second.returncode}")
sys.stdout.write(second.stderr)
