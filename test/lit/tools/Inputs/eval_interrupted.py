"""Starts a run whose every step's evaluation takes many seconds, sends SIGTERM one second into
step 1's, and prints how the run ended, what it printed of the evaluation, and the log's line.
Usage: eval_interrupted.py EXE SHARD VAL_SHARD"""
import json
import signal
import subprocess
import sys
import time

exe, shard, val = sys.argv[1:4]
run = subprocess.Popen([exe, "train", "--data", shard, "--steps", "3", "--val-data", val, "--val-every", "1",
                        "--val-steps", "100000", "--log", "eval.jsonl", "--checkpoint-dir", "eval_ck"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
for line in run.stderr:  # (the evaluation's note first, then the training line)
    if line.startswith("training"):
        break
time.sleep(1)
run.send_signal(signal.SIGTERM)
sent = time.monotonic()
out, err = run.communicate()
print("exit", run.returncode, "within 5 s" if time.monotonic() - sent < 5 else "late")
sys.stdout.write("".join(l + "\n" for l in out.splitlines() if l.startswith("---")))
sys.stdout.write("".join(l + "\n" for l in err.splitlines() if "stopped" in l))
line = json.loads(open("eval.jsonl").read().splitlines()[-1])
print("log: step", line["step"], "val_loss" in line, line.get("val_stopped"))
