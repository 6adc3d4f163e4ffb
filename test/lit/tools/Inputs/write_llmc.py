# write_llmc.py OUT VP [EXTRA]: an fp32 llm.c model file for gpt2-tiny (L=2 H=4 C=64 V=512 Tmax=64)
# whose header says padded vocabulary VP, sized as that header calls for, plus EXTRA bytes.
import struct, sys
out, Vp = sys.argv[1], int(sys.argv[2])
extra = int(sys.argv[3]) if len(sys.argv) > 3 else 0
T, V, L, H, C = 64, 512, 2, 4, 64
values = (Vp + T) * C + L * (12 * C * C + 13 * C) + 2 * C
with open(out, "wb") as f:
    f.write(struct.pack("<256i", 20240326, 3, T, V, L, H, C, Vp, *[0] * 248))
    f.write(struct.pack("<f", 0.01) * values)
    f.write(b"\0" * extra)
