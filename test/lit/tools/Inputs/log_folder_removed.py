"""Starts a training run whose --log and --save lie in DIR, removes DIR once step 2 is printed,
then prints the run's exit status and its error line.
Usage: log_folder_removed.py EXE SHARD DIR"""
import os
import shutil
import subprocess
import sys

exe, shard, folder = sys.argv[1:4]
os.makedirs(folder)
run = subprocess.Popen([exe, "train", "--data", shard, "--steps", "100000", "--print-every", "1",
                        "--log", f"{folder}/run.jsonl", "--save", f"{folder}/w.safetensors"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
for line in run.stdout:
    if line.startswith("step") and int(line.split()[1].split("/")[0]) == 2:
        shutil.rmtree(folder)
        break
err = run.communicate()[1]  # (stdout drained: a closed one would stop the run too)
print("exit", run.returncode)
sys.stdout.write("".join(line + "\n" for line in err.splitlines() if line.startswith("error")))
