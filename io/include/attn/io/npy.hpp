// attn/io/npy.hpp: .npy files (format 1.0-3.0; float32, float64, float16, bool, int64, and int16/uint16 arrays that
// hold bfloat16 or float16 bits; C order) to and from attn tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn::npy {

// BFloat16 has no NumPy dtype: it comes from a .safetensors file (BF16), or from an int16/uint16 array of its bits
// (what PyTorch's tensor.view(torch.int16).numpy() gives) named as bfloat16 with as_dtype (`--dtype bfloat16`).
enum class DType { Float32, Float64, Float16, BFloat16, Bool, Int64, Int16, UInt16 };

const char* to_string(DType dtype);  // "float32", "float64", "float16", "bfloat16", "bool", "int64", "int16", "uint16"

// Bytes per element: 4, 8, 2, 2, 1, 8, 2, 2.
std::size_t item_size(DType dtype);

// The dtype that stores T (float, double, float16, bfloat16, bool, std::int64_t).
template <class T>
constexpr DType dtype_of() {
    if constexpr (std::is_same_v<T, float>) return DType::Float32;
    else if constexpr (std::is_same_v<T, double>) return DType::Float64;
    else if constexpr (std::is_same_v<T, float16>) return DType::Float16;
    else if constexpr (std::is_same_v<T, bfloat16>) return DType::BFloat16;
    else if constexpr (std::is_same_v<T, bool>) return DType::Bool;
    else {
        static_assert(std::is_same_v<T, std::int64_t>, "attn tensors are float, double, float16, bfloat16, bool or int64");
        return DType::Int64;
    }
}

// A parsed array: dtype, shape and its little-endian, C-order element bytes.
struct Array {
    DType dtype = DType::Float32;
    Shape shape;
    std::vector<unsigned char> data;
};

// Parses the bytes of a .npy file. Malformed, truncated, big-endian, Fortran-order or unsupported-dtype input
// gives an IoError naming `name` and what is wrong; never a crash or an over-read.
Array parse(std::span<const unsigned char> bytes, const std::string& name);

// Reads and parses a file (IoError if it cannot be opened); "FILE.safetensors:NAME" reads that tensor of a
// .safetensors file instead (attn/io/safetensors.hpp).
Array read_file(const std::string& path);

// The array's 16-bit elements read as `dtype` (float16 or bfloat16), without changing a bit: for int16/uint16 arrays
// holding the bits of 16-bit floats, and for an array already of that dtype. IoError naming `name`, both dtypes and
// the shape for anything else (a float32 array is not reinterpreted: its values are not 16-bit patterns).
Array as_dtype(Array array, DType dtype, const std::string& name);

// A tensor's elements in C order, as an Array of its dtype.
template <class T>
Array to_array(TensorView<const T> tensor);

// The array as a tensor of T; IoError naming `name` when the dtype is not T's.
template <class T>
Tensor<T> to_tensor(const Array& array, const std::string& name);

// Serialises / writes a tensor, any strides (format 1.0, or 2.0 when the header outgrows 64 KiB; C order;
// '<f4', '<f8', '<f2', '|b1' or '<i8'; data aligned to 64 bytes as numpy writes it). A bfloat16 tensor is written
// as '<i2', its bits (torch.from_numpy(a).view(torch.bfloat16) reads it; attn reads it back with as_dtype).
template <class T>
std::vector<unsigned char> serialize(TensorView<const T> tensor);
// "FILE.safetensors:NAME" writes a .safetensors file holding that one tensor instead.
template <class T>
void write_file(const std::string& path, TensorView<const T> tensor);

}  // namespace attn::npy
