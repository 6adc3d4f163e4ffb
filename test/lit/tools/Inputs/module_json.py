"""A Kiln module as JSON, decoded by flatc with the module schema: load(SCHEMA, MODULE) for the
scripts beside it; as a command, module_json.py SCHEMA MODULE 'PYTHON STATEMENT ON d' runs the
statement on it (to print a field for FileCheck) and writes nothing."""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def load(schema, module):
    tmp = tempfile.mkdtemp()
    try:
        shutil.copy(module, os.path.join(tmp, "m.kiln"))
        subprocess.check_call(["flatc", "--json", "--strict-json", "--raw-binary", "-o", tmp, schema, "--",
                               os.path.join(tmp, "m.kiln")])
        with open(os.path.join(tmp, "m.json")) as f:
            return json.load(f)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    schema, module, statement = sys.argv[1:4]
    d = load(schema, module)
    exec(statement)
