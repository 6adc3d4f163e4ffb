"""Starts a training run appending to LOG, removes LOG once step 2 is printed, stops the run
(SIGTERM) once step 5 is, then prints the run's warnings and the steps the new LOG holds.
Usage: log_removed.py EXE SHARD LOG"""
import json
import os
import signal
import subprocess
import sys

exe, shard, log = sys.argv[1:4]
run = subprocess.Popen([exe, "train", "--data", shard, "--steps", "100000", "--print-every", "1", "--log", log],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
for line in run.stdout:
    if line.startswith("step") and int(line.split()[1].split("/")[0]) == 2:
        os.remove(log)
    if line.startswith("step") and int(line.split()[1].split("/")[0]) == 5:
        run.send_signal(signal.SIGTERM)
        break
err = run.communicate()[1]
sys.stdout.write("".join(line + "\n" for line in err.splitlines() if "warning" in line))
steps = [json.loads(line)["step"] for line in open(log)]
print("the new log holds steps", steps[0], "to", steps[-1])
