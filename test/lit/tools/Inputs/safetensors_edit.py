"""Edits of a safetensors file's F32 tensors, for the tests that forge weights
(overflow_grad_init.py, nan_sample_init.py, sample.test, eval.test).
As a command: safetensors_edit.py IN OUT NAME=VALUE... writes IN with every element of each
tensor NAME set to VALUE."""
import json
import struct
import sys


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


if __name__ == "__main__":
    w = Weights(sys.argv[1])
    for edit in sys.argv[3:]:
        name, value = edit.split("=")
        w.fill(name, [float(value)] * w.count(name))
    w.write(sys.argv[2])
