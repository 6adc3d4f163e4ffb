"""Rewrites a Kiln module with one field changed (module-damage.test): the module as JSON through
flatc and the schema, a Python expression applied to it as `d`, then back to binary, with its
checksum written anew (as a careful hand edit would), so that the loader's other checks are what
refuse it. `--keep-crc` leaves the old checksum: a damaged file.
Usage: edit_module.py [--keep-crc] SCHEMA IN OUT 'PYTHON STATEMENT ON d'"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import module_json


def crc32_slot(schema):
    """The vtable slot of the Module table's crc32 field: its place among the table's fields."""
    body = re.search(r"table Module \{(.*?)\}", open(schema).read(), re.S).group(1)
    fields = re.findall(r"^\s*(\w+)\s*:", body, re.M)
    return fields.index("crc32")


def seal(data, slot):
    """Writes the CRC-32 of the module, its crc32 field read as zero, into that field."""
    table = struct.unpack_from("<I", data, 0)[0]
    vtable = table - struct.unpack_from("<i", data, table)[0]
    vt_size = struct.unpack_from("<H", data, vtable)[0]
    offset = struct.unpack_from("<H", data, vtable + 4 + 2 * slot)[0] if 4 + 2 * slot < vt_size else 0
    if offset == 0:
        sys.exit("edit_module.py: the edited module has no crc32 field")
    at = table + offset
    data[at:at + 4] = b"\0\0\0\0"
    struct.pack_into("<I", data, at, zlib.crc32(bytes(data)))
    return data


args = sys.argv[1:]
keep_crc = args[:1] == ["--keep-crc"]
schema, src, out, edit = args[1:5] if keep_crc else args[0:4]
tmp = tempfile.mkdtemp()
try:
    d = module_json.load(schema, src)
    exec(edit)
    with open(os.path.join(tmp, "x.json"), "w") as f:
        json.dump(d, f)
    subprocess.check_call(["flatc", "-b", "-o", tmp, schema, os.path.join(tmp, "x.json")])
    if not keep_crc:
        with open(os.path.join(tmp, "x.kiln"), "rb") as f:
            data = seal(bytearray(f.read()), crc32_slot(schema))
        with open(os.path.join(tmp, "x.kiln"), "wb") as f:
            f.write(data)
    shutil.move(os.path.join(tmp, "x.kiln"), out)
finally:
    shutil.rmtree(tmp)
