# forge_ckpt_old_total.py IN OUT: IN as an earlier version wrote it, whose settings held the
# default --total-batch as "B*T*ranks" (not the tokens per step); the header re-padded (data stays
# 64-byte aligned) and the length, size and CRC-32 made right.
import json, struct, sys, zlib
b = open(sys.argv[1], "rb").read()
hlen = struct.unpack_from("<Q", b, 16)[0]
h = json.loads(b[32:32 + hlen])
data = b[32 + hlen:-4]
assert "--total-batch" in h["extra"]["settings"]
h["extra"]["settings"]["--total-batch"] = "B*T*ranks"
text = json.dumps(h, separators=(",", ":")).encode()
text += b" " * ((64 - (32 + len(text)) % 64) % 64)
out = bytearray(b[:32]) + text + data
struct.pack_into("<Q", out, 16, len(text))
struct.pack_into("<Q", out, 24, len(out) + 4)
out += struct.pack("<I", zlib.crc32(bytes(out[8:])))
open(sys.argv[2], "wb").write(out)
