// attn/io/safetensors.hpp: .safetensors files (the format PyTorch users save named tensors in), read and written
// with the rigour of .npy. A file is an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}, then the byte
// buffer the offsets index (little-endian, C order). Every command that reads a .npy file reads one tensor of a
// .safetensors file as FILE.safetensors:NAME (npy::read_file dispatches).
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attn/io/npy.hpp"

namespace attn::safetensors {

// The largest header the format allows (its specification's limit): a longer one is refused before it is read.
inline constexpr std::size_t max_header_bytes = 100'000'000;

struct Entry {
    std::string name;
    npy::Array array;
};

// Parses a whole file, tensors in header order. IoError naming `name` and what is wrong: shorter than its 8-byte
// length, a header length over max_header_bytes or past the end, a header that is no JSON object, a tensor without
// dtype, shape or data_offsets, a dtype attn does not read (it reads F32, F64, F16, BF16, BOOL, I64, I16 and U16),
// offsets out of the buffer, not matching the shape, overlapping, or leaving a hole. Never
// a crash or an over-read.
std::vector<Entry> parse(std::span<const unsigned char> bytes, const std::string& name);
std::vector<Entry> read_file(const std::string& path);
// One tensor by name; IoError listing the names the file has when it has no such tensor.
npy::Array read_tensor(const std::string& path, const std::string& tensor);

// "FILE.safetensors:NAME" as (FILE.safetensors, NAME); false for any other path.
bool split_path(const std::string& path, std::string* file, std::string* tensor);

// Serialises / writes named arrays (header order = the given order; the buffer aligned to 8 bytes, as the
// reference implementation pads the header with spaces).
std::vector<unsigned char> serialize(const std::vector<Entry>& entries);
void write_file(const std::string& path, const std::vector<Entry>& entries);

}  // namespace attn::safetensors
