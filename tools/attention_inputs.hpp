// tools/attention_inputs.hpp: the q, k, v and mask files every attention command reads (`attn sdpa`, `oracle`,
// `check`), checked once, and the one dispatch from a file's float dtype to the element type the command runs in.
#pragma once

#include <optional>
#include <string>

#include "attn/io/npy.hpp"
#include "attn/tensor.hpp"

namespace attn::cli {

// "q (q.npy) is float32 [2,4,8]": how a file appears in every message.
std::string describe(const char* tensor, const std::string& path, const npy::Array& a);

// `--dtype` of the attention commands: "" (the files' own dtypes), "bfloat16" or "float16" (int16/uint16 arrays are
// the bits of that type, as tensor.view(torch.int16).numpy() saves them; npy::as_dtype).
std::optional<npy::DType> sixteen_bit_dtype(const std::string& option);
// float32, float64, float16 or bfloat16: the dtypes the attention commands compute in.
inline bool is_float_dtype(npy::DType d) {
    return d == npy::DType::Float32 || d == npy::DType::Float64 || d == npy::DType::Float16 ||
           d == npy::DType::BFloat16;
}
// A float file read with --dtype applied.
npy::Array read_float_file(const std::string& path, const std::string& dtype_option);

struct AttentionFiles {
    npy::Array q, k, v;
    std::optional<Tensor<bool>> allowed_mask;
    std::optional<npy::Array> bias, alibi_slopes;  // --bias, --alibi-slopes: q's dtype
    std::string bias_path, alibi_path;

    // The bias and the slopes as tensors of T (q's dtype), or none.
    template <class T>
    std::optional<Tensor<T>> bias_tensor() const {
        if (!bias) return std::nullopt;
        return npy::to_tensor<T>(*bias, bias_path);
    }
    template <class T>
    std::optional<Tensor<T>> alibi_tensor() const {
        if (!alibi_slopes) return std::nullopt;
        return npy::to_tensor<T>(*alibi_slopes, alibi_path);
    }
};

// Reads q, k, v (one float dtype: float32, float64, float16 or bfloat16, after --dtype), the optional bool mask and
// the optional additive bias and ALiBi slopes (q's dtype); ConfigError naming `command` and every file's dtype and
// shape otherwise.
AttentionFiles read_attention_files(const std::string& command, const std::string& q_path, const std::string& k_path,
                                    const std::string& v_path, const std::string& allowed_mask_path,
                                    const std::string& dtype_option, const std::string& bias_path = "",
                                    const std::string& alibi_path = "");

// Calls f.template operator()<T>() with T the element type of a float dtype (float, double, float16, bfloat16).
template <class F>
decltype(auto) with_float_type(npy::DType dtype, F&& f) {
    switch (dtype) {
        case npy::DType::Float64: return f.template operator()<double>();
        case npy::DType::Float16: return f.template operator()<float16>();
        case npy::DType::BFloat16: return f.template operator()<bfloat16>();
        default: return f.template operator()<float>();  // read_attention_files admits no other dtype
    }
}

}  // namespace attn::cli
