"""Rewrites a Kiln module with one field changed (module-damage.test): the module as JSON through
flatc and the schema, a Python expression applied to it as `d`, then back to binary.
Usage: edit_module.py SCHEMA IN OUT 'PYTHON STATEMENT ON d'"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

schema, src, out, edit = sys.argv[1:5]
tmp = tempfile.mkdtemp()
try:
    shutil.copy(src, os.path.join(tmp, "m.kiln"))
    subprocess.check_call(["flatc", "--json", "--strict-json", "--raw-binary", "-o", tmp, schema, "--",
                           os.path.join(tmp, "m.kiln")])
    with open(os.path.join(tmp, "m.json")) as f:
        d = json.load(f)
    exec(edit)
    with open(os.path.join(tmp, "x.json"), "w") as f:
        json.dump(d, f)
    subprocess.check_call(["flatc", "-b", "-o", tmp, schema, os.path.join(tmp, "x.json")])
    shutil.move(os.path.join(tmp, "x.kiln"), out)
finally:
    shutil.rmtree(tmp)
