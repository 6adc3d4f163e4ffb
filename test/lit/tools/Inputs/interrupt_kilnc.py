"""Interrupts kilnc while its host compiler runs and reports what is left: kilnc's end, whether
the compiler still runs, the temporary folders, the output.

  interrupt_kilnc.py KILNC SPEC WORKDIR SIGNAL(INT|TERM|HUP|QUIT) [--ignored]

kilnc starts with the signals' default actions (a test runner may start its tests ignoring
SIGINT); with --ignored, with the signal ignored, which kilnc must keep (nohup): it goes on, and
SIGTERM ends it.
"""
import os
import signal
import subprocess
import sys
import time

kilnc, spec, work, name = sys.argv[1:5]
ignored = "--ignored" in sys.argv[5:]
sig = getattr(signal, "SIG" + name)


def start_signals():
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    if ignored:
        signal.signal(sig, signal.SIG_IGN)

os.makedirs(os.path.join(work, "tmp"), exist_ok=True)
pidfile = os.path.join(work, "compiler.pid")
fake = os.path.join(work, "slow-c++")
with open(fake, "w") as f:  # a compiler that takes its time: long enough to be interrupted
    f.write(f"#!/bin/sh\necho $$ > {pidfile}.part && mv {pidfile}.part {pidfile}\nexec sleep 60\n")
os.chmod(fake, 0o755)
out = os.path.join(work, "out")
env = dict(os.environ, KILN_CXX=fake, KILN_KERNEL_CACHE="off", TMPDIR=os.path.join(work, "tmp"))
p = subprocess.Popen([kilnc, spec, "-o", out], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     preexec_fn=start_signals)
deadline = time.time() + 120
while not os.path.exists(pidfile) and time.time() < deadline and p.poll() is None:
    time.sleep(0.05)
if not os.path.exists(pidfile):
    sys.exit("the compiler never started")
compiler = int(open(pidfile).read())
time.sleep(0.2)
p.send_signal(sig)
if ignored:
    time.sleep(0.5)
    print("kilnc after the ignored signal:", "running" if p.poll() is None else "ended")
    p.send_signal(signal.SIGTERM)
p.wait(timeout=30)
print("kilnc:", f"ended by {signal.Signals(-p.returncode).name}" if p.returncode < 0 else f"exit {p.returncode}")
try:
    os.kill(compiler, 0)
    print("compiler: still running")
    os.kill(compiler, signal.SIGKILL)
except ProcessLookupError:
    print("compiler: ended")
print("temporary folders:", len(os.listdir(os.path.join(work, "tmp"))))
print("output:", "present" if os.path.exists(out) else "absent")
