# forge_ckpt_header.py EDIT IN OUT: IN with its JSON header edited, the header re-padded (data
# stays 64-byte aligned) and the length, size and CRC-32 made right, so that only the edit is
# wrong. EDIT is one of
#   overlap    the first parameter's adam_m span set to its value span
#   old-total  the settings' --total-batch as an earlier version wrote the default: "B*T*ranks"
#              (not the tokens per step)
#   log-two-lines  extra.log_pending holding one string of two log lines
#   log-not-record extra.log_pending holding a line that is no training log record
#   no-file-name   without extra.data_file_name, as written before shards were named (72e4e1b)
#   no-file-index  also without extra.data_file and extra.all_shard_tokens, as written before
#                  a shard was found among every file matched (73f26f6): shard_tokens only
import json, struct, sys, zlib
edit, src, dst = sys.argv[1:4]
b = open(src, "rb").read()
hlen = struct.unpack_from("<Q", b, 16)[0]
h = json.loads(b[32:32 + hlen])
data = b[32 + hlen:-4]
if edit == "overlap":
    h["parameters"][0]["adam_m"] = h["parameters"][0]["value"]
elif edit == "old-total":
    assert "--total-batch" in h["extra"]["settings"]
    h["extra"]["settings"]["--total-batch"] = "B*T*ranks"
elif edit == "log-two-lines":
    h["extra"]["log_pending"] = ['{"step":0,"loss":1}\n{"step":1,"loss":1}']
elif edit == "log-not-record":
    h["extra"]["log_pending"] = ["not a log line"]
elif edit in ("no-file-name", "no-file-index"):
    del h["extra"]["data_file_name"]
    if edit == "no-file-index":
        del h["extra"]["data_file"], h["extra"]["all_shard_tokens"]
else:
    sys.exit(f"forge_ckpt_header.py: unknown edit {edit!r}")
text = json.dumps(h, separators=(",", ":")).encode()
text += b" " * ((64 - (32 + len(text)) % 64) % 64)
out = bytearray(b[:32]) + text + data
struct.pack_into("<Q", out, 16, len(text))
struct.pack_into("<Q", out, 24, len(out) + 4)
out += struct.pack("<I", zlib.crc32(bytes(out[8:])))
open(dst, "wb").write(out)
