"""Edits of a safetensors file's F32 tensors in place, for the scripts that forge weights
(overflow_grad_init.py, nan_sample_init.py)."""
import json
import struct


class Weights:
    def __init__(self, path):
        with open(path, "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        self.head = data[:8 + n]
        self.header = json.loads(data[8:8 + n])
        self.body = bytearray(data[8 + n:])

    def _range(self, name):
        a, b = self.header[name]["data_offsets"]
        assert self.header[name]["dtype"] == "F32", name
        return a, b

    def count(self, name):
        a, b = self._range(name)
        return (b - a) // 4

    def fill(self, name, values):
        """Every element of tensor `name`, from `values` (as many)."""
        a, b = self._range(name)
        assert len(values) == (b - a) // 4, name
        self.body[a:b] = struct.pack(f"<{len(values)}f", *values)

    def put(self, name, index, value):
        """Element `index` of tensor `name` (flattened)."""
        a, b = self._range(name)
        assert 0 <= 4 * index < b - a, name
        self.body[a + 4 * index:a + 4 * index + 4] = struct.pack("<f", value)

    def write(self, path):
        with open(path, "wb") as f:
            f.write(self.head + bytes(self.body))
