"""Writes a function whose values, all live at one kiln.global_norm, add up to a given arena size.

arena_bound.py LAST_ELEMENTS [cache] [error]: 8191 f32 tensors of 2^48 elements (2^50 bytes each,
2^63 - 2^50 together), one of LAST_ELEMENTS f32 elements, and the norm's 256-byte slot; with
`cache`, a 2^50-byte key/value cache read by a kiln.decode_attention in place of the last tensor.
With `error`, the kiln-plan-buffers error is expected on the function.
"""
import sys

last = int(sys.argv[1])
cache = "cache" in sys.argv[2:]
t = lambda n: f"tensor<{n}xf32>"
vals = [(f"%z{i}", t(2**48)) for i in range(8191)]
body = []
if cache:
    kv = "tensor<2x1x1x8388608x16777216xf32>"  # 2^48 elements
    body += ['%p = kiln.input "position" : tensor<1xi32>', "%qkv = kiln.zeros : tensor<1x50331648xf32>",
             f'%kv = kiln.kv_cache "h.0.attn" : {kv}',
             f"%y = kiln.decode_attention %qkv, %kv, %p {{num_heads = 1 : i64}} : tensor<1x50331648xf32>, {kv}, "
             "tensor<1xi32> -> tensor<1x16777216xf32>"]
    vals.append(("%y", "tensor<1x16777216xf32>"))
else:
    vals.append(("%last", t(last)))
if "error" in sys.argv[2:]:
    print("// expected-error@below {{kiln-plan-buffers: the buffers of @f need more than 2^63 bytes together "
          "(the arena's size and offsets are i64); use smaller tensors}}")
print("func.func @f() -> tensor<f32> {")
for v, ty in vals[:8191]:
    print(f"  {v} = kiln.zeros : {ty}")
for line in body:
    print("  " + line)
if not cache:
    print(f"  {vals[-1][0]} = kiln.zeros : {vals[-1][1]}")
print(f"  %n = kiln.global_norm {', '.join(v for v, _ in vals)} : {', '.join(ty for _, ty in vals)} -> tensor<f32>")
print("  return %n : tensor<f32>")
print("}")
