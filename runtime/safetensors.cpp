#include "runtime/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/error.h"
#include "runtime/json_object.h"
#include "runtime/shape.h"
#include "runtime/file_io.h"

// The file format is little-endian and tensor bytes are handed out as-is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kiln assumes a little-endian host");

namespace kiln {
namespace {

// ordered_json keeps the header's key order, so tensors that share an offset (zero-size ones)
// still come back in the order they were written.
using Json = nlohmann::ordered_json;

// 0 for an unknown dtype, so callers can word the error with their own context.
size_t lookup_dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},
      {"I32", 4},  {"F32", 4}, {"U64", 8}, {"I64", 8},     {"F64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

struct Entry {
  SafeTensor tensor;  // bytes still empty
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
};

// Reads and fully validates the header against the file's size.
Header read_header(const RegularFile& file, const std::string& path) {
  const uint64_t file_size = file.size();
  if (file_size < 8)
    throw Error(path + ": file is " + std::to_string(file_size) +
                (file_size == 1 ? " byte" : " bytes") + ", too short for the 8-byte header length (not a safetensors file)");

  uint64_t header_len = 0;
  file.read_at(&header_len, 8, 0, "header length");
  if (header_len > file_size - 8)
    throw Error(path + ": header: length " + std::to_string(header_len) +
                " is beyond the end of the file (" + std::to_string(file_size - 8) +
                " bytes follow the length field; not a safetensors file?)");
  std::string text(header_len, '\0');
  file.read_at(text.data(), header_len, 8, "header");
  // The JSON parser would stop at a NUL: the format pads the header with spaces only.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw Error(path + ": header: a NUL byte at offset " + std::to_string(8 + nul) +
                " (the header is JSON, padded with spaces)");

  const Json json = parse_json_unique_keys(text.data(), text.data() + text.size(), path + ": header");
  if (!json.is_object()) throw Error(path + ": header: is not a JSON object");

  Header h;
  h.data_start = 8 + header_len;
  const uint64_t data_size = file_size - h.data_start;
  for (const auto& [name, info] : json.items()) {
    const std::string where = path + ": header: ";
    if (name == "__metadata__") {
      if (!info.is_object()) throw Error(where + "__metadata__ is not a JSON object");
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string())
          throw Error(where + "__metadata__: value of '" + key + "' is not a string");
        h.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string at = where + "tensor '" + name + "': ";
    if (!info.is_object()) throw Error(at + "entry is not a JSON object");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!info.contains(key)) throw Error(at + "missing \"" + key + "\"");

    Entry e;
    e.tensor.name = name;
    const Json& dtype = info["dtype"];
    if (!dtype.is_string()) throw Error(at + "dtype is not a string");
    e.tensor.dtype = dtype.get<std::string>();
    const size_t elem = lookup_dtype_size(e.tensor.dtype);
    if (elem == 0) throw Error(at + "unknown dtype '" + e.tensor.dtype + "'");

    const Json& shape = info["shape"];
    if (!shape.is_array()) throw Error(at + "shape is not an array");
    for (const Json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        throw Error(at + "shape " + shape.dump() + " has an entry that is not an integer >= 0");
      e.tensor.shape.push_back(d.get<int64_t>());
    }

    const Json& offsets = info["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      throw Error(at + "data_offsets " + offsets.dump() +
                  " is not [begin, end] with integers >= 0");
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    if (e.begin > e.end) throw Error(at + "data_offsets " + offsets.dump() + " has begin > end");
    if (e.end > data_size)
      throw Error(at + "data_offsets " + offsets.dump() + " run past the end of the data (" +
                  std::to_string(data_size) + " bytes; file truncated?)");
    uint64_t numel = 0, want = 0;
    const bool fits =
        checked_numel(e.tensor.shape, &numel) && !__builtin_mul_overflow(numel, elem, &want);
    if (!fits || want != e.end - e.begin)
      throw Error(at + "data_offsets " + offsets.dump() + " hold " +
                  std::to_string(e.end - e.begin) + " bytes but " + e.tensor.dtype + " " +
                  shape_str(e.tensor.shape) + " needs " +
                  (fits ? std::to_string(want) : std::string("more than 2^64")));
    h.entries.push_back(std::move(e));
  }

  // The format requires the tensors to tile the data exactly: no overlap, no holes.
  std::stable_sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : h.entries) {
    if (e.begin < covered)
      throw Error(path + ": header: tensor '" + e.tensor.name + "' [" + std::to_string(e.begin) +
                  ", " + std::to_string(e.end) + "] overlaps tensor '" + prev->tensor.name + "' [" +
                  std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "]");
    if (e.begin > covered)
      throw Error(path + ": header: data bytes [" + std::to_string(covered) + ", " +
                  std::to_string(e.begin) + ") before tensor '" + e.tensor.name +
                  "' belong to no tensor");
    covered = e.end;
    prev = &e;
  }
  if (covered != data_size)
    throw Error(path + ": header: tensors cover " + std::to_string(covered) +
                " data bytes but the file has " + std::to_string(data_size) +
                " (trailing garbage?)");
  return h;
}

}  // namespace

size_t dtype_size(const std::string& dtype) {
  size_t n = lookup_dtype_size(dtype);
  if (n == 0) throw Error("safetensors: unknown dtype '" + dtype + "'");
  return n;
}

std::vector<SafeTensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  const RegularFile file(path, "weights' file");
  Header h = read_header(file, path);
  if (metadata) *metadata = std::move(h.metadata);
  std::vector<SafeTensor> out;
  out.reserve(h.entries.size());
  for (Entry& e : h.entries) {
    // Read straight into each tensor: a checkpoint is never held twice in memory.
    e.tensor.bytes.resize(e.end - e.begin);
    file.read_at(e.tensor.bytes.data(), e.tensor.bytes.size(), h.data_start + e.begin, "tensor '" + e.tensor.name + "'");
    out.push_back(std::move(e.tensor));
  }
  return out;
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  return read_header(RegularFile(path, "weights' file"), path).metadata;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  // Python's safetensors puts the metadata first; readers do not care, humans with `head` do.
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafeTensor& t : tensors) {
    const std::string at = path + ": tensor '" + t.name + "': ";
    if (t.name == "__metadata__") throw Error(at + "name is reserved for the metadata");
    if (header.contains(t.name)) throw Error(at + "name appears twice");
    const size_t elem = lookup_dtype_size(t.dtype);
    if (elem == 0) throw Error(at + "unknown dtype '" + t.dtype + "'");
    uint64_t numel = 0;
    if (!checked_numel(t.shape, &numel) || numel * elem != t.bytes.size())
      throw Error(at + t.dtype + " " + shape_str(t.shape) + " does not match its " +
                  std::to_string(t.bytes.size()) + " bytes");
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump(-1, ' ', false, Json::error_handler_t::replace);  // metadata need not be UTF-8
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const uint64_t header_len = text.size();

  std::vector<std::pair<const void*, size_t>> pieces = {{&header_len, 8},
                                                        {text.data(), text.size()}};
  for (const SafeTensor& t : tensors) pieces.emplace_back(t.bytes.data(), t.bytes.size());
  write_file_atomic(path, pieces);
}

std::vector<float> to_f32(const SafeTensor& t) {
  const std::string at = "safetensors: tensor '" + t.name + "': to_f32: ";
  const size_t elem = lookup_dtype_size(t.dtype);
  uint64_t numel = 0;
  if (elem == 0) throw Error(at + "unknown dtype '" + t.dtype + "'");
  if (!checked_numel(t.shape, &numel) || numel * elem != t.bytes.size())
    throw Error(at + t.dtype + " " + shape_str(t.shape) + " does not match its " +
                std::to_string(t.bytes.size()) + " bytes");
  std::vector<float> out(numel);
  if (t.dtype == "F32") {
    std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    const bool bf16 = t.dtype == "BF16";
    for (size_t i = 0; i < numel; ++i) {
      uint16_t h;
      std::memcpy(&h, t.bytes.data() + 2 * i, 2);
      uint32_t bits;
      if (bf16) {
        bits = static_cast<uint32_t>(h) << 16;  // bf16 is the top half of an f32
      } else {
        const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
        const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
        if (exp == 0) {  // zero or subnormal: man * 2^-24
          float f = std::ldexp(static_cast<float>(man), -24);
          std::memcpy(&bits, &f, 4);
          bits |= sign;
        } else if (exp == 31) {  // inf / nan, payload kept
          bits = sign | 0x7f800000u | (man << 13);
        } else {  // rebias the exponent 15 -> 127
          bits = sign | ((exp + 112) << 23) | (man << 13);
        }
      }
      std::memcpy(&out[i], &bits, 4);
    }
  } else {
    throw Error(at + "dtype " + t.dtype + " is not F32, BF16 or F16");
  }
  return out;
}

}  // namespace kiln
