# checkpoint_position.py CKPT...: each checkpoint's step and data position, from its JSON header
# (its length at byte 16; the header, padded, from byte 32).
import json
import struct
import sys

for path in sys.argv[1:]:
    with open(path, "rb") as f:
        blob = f.read(1 << 20)
    n = struct.unpack("<Q", blob[16:24])[0]
    h = json.JSONDecoder().raw_decode(blob[32:32 + n].decode())[0]
    print(f"step {h['step']}: shard {h['data_shard']}, token {h['data_position']}")
