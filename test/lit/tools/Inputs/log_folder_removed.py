"""Starts a training run whose --log and --save lie in DIR, removes DIR once step 2 is printed,
then prints the run's exit status, its warnings and its error line. With CHECKPOINT_DIR: --save alone lies in
DIR, the run checkpoints there, and is sent SIGTERM once DIR is gone.
Usage: log_folder_removed.py EXE SHARD DIR [CHECKPOINT_DIR]"""
import os
import shutil
import signal
import subprocess
import sys

exe, shard, folder = sys.argv[1:4]
checkpoints = sys.argv[4] if len(sys.argv) > 4 else None
os.makedirs(folder)
outputs = ["--checkpoint-dir", checkpoints] if checkpoints else ["--log", f"{folder}/run.jsonl"]
run = subprocess.Popen([exe, "train", "--data", shard, "--steps", "100000", "--print-every", "1",
                        "--save", f"{folder}/w.safetensors"] + outputs,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
for line in run.stdout:
    if line.startswith("step") and int(line.split()[1].split("/")[0]) == 2:
        shutil.rmtree(folder)
        if checkpoints:
            run.send_signal(signal.SIGTERM)
        break
err = run.communicate()[1]  # (stdout drained: a closed one would stop the run too)
print("exit", run.returncode)
sys.stdout.write("".join(line + "\n" for line in err.splitlines() if line.startswith(("error", "kiln: warning"))))
