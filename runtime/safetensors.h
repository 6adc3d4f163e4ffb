// safetensors files (https://github.com/huggingface/safetensors): the checkpoint and weight format.
//
// Layout: u64 little-endian N, then N bytes of JSON header
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// then the data bytes; offsets are relative to the start of the data. Reading validates the whole
// header against the file, so a truncated or hand-edited checkpoint fails with one line naming the
// file and the tensor instead of loading garbage. Every error is a kiln::Error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

struct SafeTensor {
  std::string name;
  std::string dtype;           // as spelled in the file: "F32", "BF16", "F16", "I32", "I64", ...
  std::vector<int64_t> shape;  // [] is a scalar (one element)
  std::vector<uint8_t> bytes;  // little-endian, row-major; size == dtype_size(dtype) * numel
};

// Bytes per element of a safetensors dtype; throws kiln::Error for an unknown dtype.
size_t dtype_size(const std::string& dtype);

// Every tensor of the file, in the order of their data in the file (which is the order
// write_safetensors was given). Throws kiln::Error naming the file (and tensor) on any defect:
// file too short, header length beyond the file, bad JSON, missing or mistyped keys, unknown
// dtype, offsets out of range, overlapping, leaving holes, or not matching dtype size * numel.
// `metadata`, where given, receives the "__metadata__" map (empty when absent).
std::vector<SafeTensor> read_safetensors(const std::string& path,
                                         std::map<std::string, std::string>* metadata = nullptr);

// The "__metadata__" map alone (empty when absent); reads only the header but validates it fully.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

// Writes the tensors in the given order, header padded with spaces to a multiple of 8 bytes so the
// data starts aligned. Atomic: writes temporary_path(path), fsyncs, renames over `path`; on failure
// the tmp file is removed and `path` is left as it was.
void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// F32, BF16 or F16 data as float; kiln::Error for any other dtype or a size mismatch.
std::vector<float> to_f32(const SafeTensor& tensor);

}  // namespace kiln
