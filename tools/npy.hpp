// tools/npy.hpp: .npy files (format 1.0-3.0; float32, float64, bool, int64; C order) to and from attn tensors.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::npy {

enum class DType { Float32, Float64, Bool, Int64 };

const char* to_string(DType dtype);  // "float32", ...

// A parsed array: dtype, shape and its little-endian, C-order element bytes.
struct Array {
    DType dtype = DType::Float32;
    Shape shape;
    std::vector<unsigned char> data;
};

// Parses the bytes of a .npy file. Malformed, truncated, big-endian, Fortran-order or unsupported-dtype input
// gives an IoError naming `name` and what is wrong; never a crash or an over-read.
Array parse(std::span<const unsigned char> bytes, const std::string& name);

// Reads and parses a file (IoError if it cannot be opened).
Array read_file(const std::string& path);

// The array as a tensor of T; IoError naming `name` when the dtype is not T's.
template <class T>
Tensor<T> to_tensor(const Array& array, const std::string& name);

// Serialises / writes a tensor (format 1.0, C order, '<f4', '<f8', '|b1' or '<i8').
template <class T>
std::vector<unsigned char> serialize(TensorView<const T> tensor);
template <class T>
void write_file(const std::string& path, TensorView<const T> tensor);

}  // namespace attn::npy
