"""Interrupts `kiln-data prepare` while it encodes and reports what is left of its output folder.

  interrupt_prepare.py KILN_DATA WORKDIR SIGNAL(INT|TERM|HUP|QUIT) [--existing-out]

The inputs are a text file of several shards' worth of tokens (--shard-tokens 64), then a FIFO
that this script holds open and never writes to: prepare has staged those shards when it blocks
reading the FIFO, and the signal comes then. (A FIFO with no writer at all is refused at once.) The output folder is WORKDIR/out: made by prepare, or with --existing-out
there before (holding an older data set, which must stay as it was).
"""
import os
import signal
import subprocess
import sys
import time

kiln_data, work, name = sys.argv[1:4]
existing = "--existing-out" in sys.argv[4:]
sig = getattr(signal, "SIG" + name)
os.makedirs(work, exist_ok=True)
text = os.path.join(work, "doc.txt")
with open(text, "w") as f:
    f.write("The state of the Union is strong, and the people are its strength. " * 60)
fifo = os.path.join(work, "never-written")
if not os.path.exists(fifo):
    os.mkfifo(fifo)
held = os.open(fifo, os.O_RDWR)  # a writer that never writes (O_RDWR: Linux opens it at once)
out = os.path.join(work, "out")
if existing:
    os.makedirs(out, exist_ok=True)
    subprocess.run([kiln_data, "prepare", text, "--out", out, "--val-fraction", "0"], check=True,
                   stdout=subprocess.DEVNULL)
before = sorted(os.listdir(out)) if existing else None


def default_signals():
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)


p = subprocess.Popen([kiln_data, "prepare", text, fifo, "--out", out, "--shard-tokens", "64", "--val-fraction", "0"],
                     preexec_fn=default_signals, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
# Wait until the shards of the first document are staged (prepare then blocks on the FIFO).
deadline = time.monotonic() + 30
staged = 0
while time.monotonic() < deadline and p.poll() is None:
    folders = [d for d in os.listdir(out) if d.startswith(".kiln-data-prepare")] if os.path.isdir(out) else []
    staged = sum(len(os.listdir(os.path.join(out, d))) for d in folders) if folders else 0
    if staged >= 5:
        break
    time.sleep(0.05)
print(f"staged before the signal: {'several shards' if staged >= 5 else staged}")
p.send_signal(sig)
try:
    p.wait(timeout=30)
except subprocess.TimeoutExpired:
    p.kill()
    print("prepare: still running 30 s after the signal")
    sys.exit(0)
print(f"prepare: ended by SIG{signal.Signals(-p.returncode).name[3:]}" if p.returncode < 0 else
      f"prepare: exit {p.returncode}")
if not os.path.exists(out):
    print("out: absent")
else:
    left = sorted(os.listdir(out))
    print("out: as it was" if left == before else f"out: {left}")
